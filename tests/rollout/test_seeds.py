"""Counter-based seeds (lit_credit.rollout.seeds) and HFEngine's seeded sampling on a real tiny model."""
from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lit_credit.models import build_tokenizer
from lit_credit.rollout import ChatCodec, HFEngine
from lit_credit.rollout.engine import SeededSampler, nucleus
from lit_credit.rollout.seeds import gumbel, mix, mix_seed, row_seeds
from lit_credit.types import SamplingParams

MASK = (1 << 64) - 1


def splitmix_reference(*parts: int) -> int:
    """SplitMix64's finaliser chained over the parts, in Python's unbounded ints (the module docstring's formula)."""
    h = 0
    for part in parts:
        x = h ^ (part & MASK)
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
        h = x ^ (x >> 31)
    return h


def test_mix_is_splitmix64_in_int64_arithmetic():
    # fmix(0) = 0, so mix(0) is 0 by the formula; the rest against the reference, negative ints as their uint64 bits
    assert int(mix(0)) == 0
    for parts in [(1,), (3, 5), (2**63 - 1, 7, 0), (-5,), (12345, 0, 987654321)]:
        assert int(mix(*parts)) & MASK == splitmix_reference(*parts)
        assert mix_seed(*parts) == splitmix_reference(*parts) & ((1 << 63) - 1)
    table = mix(torch.tensor([7, 8])[:, None], 2, torch.arange(3))  # broadcast: [2, 3]
    assert [[int(v) & MASK for v in row] for row in table] == \
        [[splitmix_reference(s, 2, v) for v in range(3)] for s in (7, 8)]
    assert row_seeds([7, 8], 2).tolist() == [int(mix(7, 0)), int(mix(7, 1)), int(mix(8, 0)), int(mix(8, 1))]


def test_gumbel_noise_has_the_gumbel_moments():
    # Gumbel(0, 1): mean = Euler's gamma 0.5772, variance pi^2 / 6 = 1.6449. 2 x 200 000 draws: standard errors
    # of the mean 1.28 / sqrt(4e5) = 0.002 and of the variance about 0.006; bounds at about 5 of them.
    g = gumbel(torch.tensor([11, 12]), 3, 200_000)
    assert abs(g.mean().item() - 0.5772) < 0.01 and abs(g.var().item() - math.pi ** 2 / 6) < 0.03
    assert torch.equal(g, gumbel(torch.tensor([11, 12]), 3, 200_000))  # a function of (seed, step, token)
    assert not torch.equal(g[0], gumbel(torch.tensor([11]), 4, 200_000)[0])


def test_nucleus_by_hand():
    # probs (0.5, 0.3, 0.15, 0.05): the mass before each token is (0, 0.5, 0.8, 0.95); at top_p = 0.8 a token is in
    # when that is < 0.8: tokens 0 and 1. At 0.81 token 2 too; at 0.1 only the top token.
    z = torch.tensor([[0.15, 0.5, 0.05, 0.3]]).log()
    assert nucleus(z, 0.8).tolist() == [[False, True, False, True]]
    assert nucleus(z, 0.81).tolist() == [[True, True, False, True]]
    assert nucleus(z, 0.1).tolist() == [[False, True, False, False]]


def test_seeded_sampler_draws_from_the_tempered_softmax():
    # One step, 20 000 rows with their own seeds over fixed logits z: the chosen tokens' frequencies are those of
    # softmax(z / T) (standard error sqrt(p(1-p)/20000) <= 0.0036; bound 0.015), the recorded log-prob is
    # log_softmax(z / T)[choice], and the returned scores pick that token under argmax.
    z = torch.tensor([2.0, 1.0, 0.0, -1.0])
    rows = 20_000
    sampler = SeededSampler(torch.arange(rows), width=0, sampling=SamplingParams(temperature=0.7))
    scores = sampler(torch.zeros(rows, 0, dtype=torch.long), z.expand(rows, -1).clone())
    choice = scores.argmax(-1)
    want = (z / 0.7).softmax(-1)
    freq = torch.bincount(choice, minlength=4).float() / rows
    assert (freq - want).abs().max() < 0.015
    torch.testing.assert_close(sampler.logprobs[0], (z / 0.7).log_softmax(-1)[choice])
    top = SeededSampler(torch.arange(rows), 0, SamplingParams(temperature=1.0, top_p=0.7))
    picked = top(torch.zeros(rows, 0, dtype=torch.long), z.expand(rows, -1).clone()).argmax(-1)
    # softmax(z) = (0.644, 0.237, 0.087, 0.032): the nucleus at 0.7 is tokens 0 and 1; the draws renormalise to
    # (0.731, 0.269) while the recorded log-probs stay those of the full softmax
    assert set(picked.tolist()) == {0, 1}
    assert abs((picked == 0).float().mean().item() - 0.644 / (0.644 + 0.237)) < 0.015
    torch.testing.assert_close(top.logprobs[0], z.log_softmax(-1)[picked])


@pytest.fixture(scope="module")
def engine():
    torch.manual_seed(0)
    tok = build_tokenizer(["What is 3 + 4?\n7", "What is 10 - 2?\n8", "Try again."] * 20, 300)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id))
    hf = HFEngine()
    hf.bind(model, tok)
    codec = ChatCodec(tok)
    prompts = [codec.prompt_ids([{"role": "user", "content": q}]) for q in
               ("What is 3 + 4?", "What is 10 - 2?", "Try again, what is 1 + 1?")]
    return hf, prompts


def tokens(out):
    return [[c.token_ids for c in per_prompt] for per_prompt in out]


def test_a_prompts_rollouts_are_a_function_of_its_seed_not_of_its_batch(engine):
    hf, prompts = engine
    sampling = SamplingParams(n=3, max_new_tokens=8)
    together = hf.generate(prompts, sampling, seeds=[5, 6, 7])
    alone = [hf.generate([p], sampling, seeds=[s])[0] for p, s in zip(prompts, (5, 6, 7))]
    reversed_ = hf.generate(prompts[::-1], sampling, seeds=[7, 6, 5])[::-1]  # other rows, other padding widths
    assert tokens(together) == tokens([[c for c in a] for a in alone]) == tokens(reversed_)
    for a, b in zip(together, alone):
        for ca, cb in zip(a, b):
            torch.testing.assert_close(torch.tensor(ca.logprobs), torch.tensor(cb.logprobs), rtol=0, atol=1e-5)
    other = hf.generate(prompts, sampling, seeds=[50, 60, 70])
    assert tokens(other) != tokens(together)  # 9 rollouts of 8 tokens from a 300-token vocabulary
    torch.manual_seed(3)
    unseeded = tokens(hf.generate(prompts, sampling))  # the engine draws the seeds from torch's generator
    torch.manual_seed(3)
    assert tokens(hf.generate(prompts, sampling)) == unseeded


def test_wrong_number_of_seeds_is_refused(engine):
    hf, prompts = engine
    with pytest.raises(ValueError, match="2 seeds for 3 prompts"):
        hf.generate(prompts, SamplingParams(n=2, max_new_tokens=2), seeds=[1, 2])
