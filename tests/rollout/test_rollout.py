"""HF engine and the multi-turn rollout loop on a real tiny model."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lit_credit.models import build_tokenizer, token_logprobs
from lit_credit.rollout import ChatCodec, HFEngine, run_episodes, to_batch
from lit_credit.tasks.base import SingleTurnEnvironment
from lit_credit.types import Feedback, RewardResult, SamplingParams

CORPUS = ["What is 3 + 4?\n7", "Try again. Wrong answer.", "<tool_call>{}</tool_call>"] * 20


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    tok = build_tokenizer(CORPUS, 300)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id))
    engine = HFEngine()
    engine.bind(model, tok)
    return model, tok, engine


ROWS = [{"prompt": [{"role": "user", "content": "What is 3 + 4?"}], "id": "a"},
        {"prompt": [{"role": "user", "content": "What is 10 - 2?"}], "id": "b"}]


def test_n_samples_per_prompt_and_length_limit(policy):
    _model, tok, engine = policy
    codec = ChatCodec(tok)
    out = engine.generate([codec.prompt_ids(r["prompt"]) for r in ROWS], SamplingParams(n=3, max_new_tokens=5))
    assert [len(per_prompt) for per_prompt in out] == [3, 3]
    for c in (c for per_prompt in out for c in per_prompt):
        assert len(c.token_ids) == len(c.logprobs) <= 5
        ended = bool(c.token_ids) and c.token_ids[-1] == tok.eos_token_id
        assert c.finish_reason == ("stop" if ended else "length")
        assert all(lp <= 0 for lp in c.logprobs)


def test_greedy_is_deterministic_and_matches_batch_of_one(policy):
    _model, tok, engine = policy
    codec = ChatCodec(tok)
    prompts = [codec.prompt_ids(r["prompt"]) for r in ROWS]  # different lengths: left padding in the batch
    greedy = SamplingParams(n=1, greedy=True, max_new_tokens=6)
    batched = [p[0].token_ids for p in engine.generate(prompts, greedy)]
    alone = [engine.generate([p], greedy)[0][0].token_ids for p in prompts]
    assert batched == alone


def test_behaviour_logprobs_equal_trainer_logprobs(policy):
    model, tok, engine = policy
    codec = ChatCodec(tok)
    episodes = run_episodes(engine, codec, SingleTurnEnvironment(), ROWS, [0, 1],
                            SamplingParams(n=4, max_new_tokens=6))
    batch = to_batch(episodes, [RewardResult(0.0)] * len(episodes), codec.pad_id)
    logp, _ = token_logprobs(model, batch.input_ids, batch.attention_mask)
    gap = ((logp - batch.behaviour_logprobs).abs() * batch.response_mask).max()
    assert gap < 1e-4  # the engine samples from exactly the weights the trainer differentiates


def test_behaviour_logprobs_are_of_the_tempered_softmax(policy):
    # HFEngine at T = 0.5: each sampled token's log-prob is log_softmax(z / 0.5)[token], z the logits of a
    # plain forward pass of the same model on the whole sequence (position t - 1 predicts token t).
    model, tok, engine = policy
    codec = ChatCodec(tok)
    prompts = [codec.prompt_ids(r["prompt"]) for r in ROWS]
    tokens = tempered = untempered = 0
    for prompt, per_prompt in zip(prompts, engine.generate(prompts, SamplingParams(n=4, temperature=0.5,
                                                                                    max_new_tokens=6))):
        for c in per_prompt:
            ids = torch.tensor([prompt + c.token_ids])
            with torch.no_grad():
                z = model(input_ids=ids).logits[0, len(prompt) - 1:-1]  # [L, V]: each token's logits
            picked = torch.tensor(c.token_ids)[:, None]
            want = (z / 0.5).log_softmax(-1).gather(-1, picked).squeeze(-1)
            torch.testing.assert_close(torch.tensor(c.logprobs), want, rtol=0, atol=1e-5)
            tokens += len(c.token_ids)
            tempered = max(tempered, (torch.tensor(c.logprobs) - want).abs().max().item())
            at_one = z.log_softmax(-1).gather(-1, picked).squeeze(-1)
            untempered = max(untempered, (at_one - want).abs().max().item())
    assert tokens > 0 and untempered > 0.1 > 1e-5 > tempered  # T = 1 log-probs would fail the comparison


def test_engine_trainer_gap_at_the_sampling_temperature(policy):
    # A batch sampled at T = 0.7 carries T; the trainer's log-probs at that T match the engine's to float
    # rounding (KV cache vs full pass), while the T = 1 log-probs of the same batch (what the trainer took
    # before) are far off: the gap the test measures is one that can fail.
    model, tok, engine = policy
    codec = ChatCodec(tok)
    sampling = SamplingParams(n=4, temperature=0.7, max_new_tokens=6)
    episodes = run_episodes(engine, codec, SingleTurnEnvironment(), ROWS, [0, 1], sampling)
    batch = to_batch(episodes, [RewardResult(0.0)] * len(episodes), codec.pad_id, sampling.temperature)
    assert batch.temperature == 0.7 and batch.select(torch.tensor([1, 0])).temperature == 0.7
    mask = batch.response_mask

    def gap(temperature: float) -> float:
        with torch.no_grad():
            logp, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, temperature=temperature)
        return ((logp - batch.behaviour_logprobs).abs() * mask).sum().item() / mask.sum().item()

    at_t, at_one = gap(batch.temperature), gap(1.0)
    print(f"HF engine mean |behaviour - trainer| at T=0.7: {at_t:.2e} (trainer at T=1: {at_one:.3g})")
    assert mask.sum() > 0 and at_t < 1e-5 and at_one > 1e3 * at_t and at_one > 0.01


def test_experience_batches_carry_the_temperature_they_were_sampled_at(policy):
    from data_modules.rollout import RolloutDataModule
    from lit_credit.rewards import ExactMatchReward
    from lit_credit.tasks import ArithTask

    model, tok, engine = policy
    task = ArithTask(max_operand=9, num_test=4)
    sampling = SamplingParams(n=2, temperature=0.7, max_new_tokens=4)
    data = RolloutDataModule(task, ExactMatchReward(), engine, sampling)
    data.setup()
    data.experience.bind(model, tok)
    rows = list(task.dataset("test"))[:2]
    assert data.experience.draw(rows).temperature == 0.7  # the train sampling
    assert data.experience.draw_validation(rows).temperature == 1.0  # greedy


def test_stop_strings_end_the_turn(policy):
    _model, tok, engine = policy
    codec = ChatCodec(tok)
    free = engine.generate([codec.prompt_ids(ROWS[0]["prompt"])], SamplingParams(n=1, greedy=True,
                                                                                 max_new_tokens=12))[0][0]
    # A clean ASCII token the greedy continuation is known to produce after its first token.
    k, stop = next((k, s) for k, t in enumerate(free.token_ids) if k >= 1
                   for s in [tok.decode([t])] if s.isascii() and s.strip() and s not in tok.decode(free.token_ids[:k]))
    cut = engine.generate([codec.prompt_ids(ROWS[0]["prompt"])],
                          SamplingParams(n=1, greedy=True, max_new_tokens=12, stop=(stop,)))[0][0]
    assert cut.finish_reason == "stop" and cut.text.endswith(stop)
    assert cut.token_ids == free.token_ids[: k + 1] and cut.logprobs == free.logprobs[: k + 1]


class TwoTurns(SingleTurnEnvironment):
    """Always asks once more after the first reply; scores turn k as k / 2."""

    max_turns = 2

    def step(self, row, turn, reply):
        return Feedback(done=turn == 1, messages=[{"role": "user", "content": "Try again."}], score=turn / 2)


def test_multi_turn_loop_masks_injected_feedback(policy):
    _model, tok, engine = policy
    codec = ChatCodec(tok)
    episodes = run_episodes(engine, codec, TwoTurns(), ROWS[:1], [7], SamplingParams(n=2, max_new_tokens=4), 2)
    assert len(episodes) == 2
    prompt = codec.prompt_ids(ROWS[0]["prompt"])
    for ep in episodes:
        assert len(ep.replies) == 2 and ep.turn_scores == [0.0, 0.5]
        turn0 = [t for t, k in zip(ep.token_ids, ep.turn_ids) if k == 0]
        turn1 = [t for t, k in zip(ep.token_ids, ep.turn_ids) if k == 1]
        closed = turn0[-1] == tok.eos_token_id
        feedback = codec.feedback_ids([{"role": "user", "content": "Try again."}], reply_closed=closed)
        assert ep.token_ids == prompt + turn0 + feedback + turn1
        assert ep.response_mask == [0] * len(prompt) + [1] * len(turn0) + [0] * len(feedback) + [1] * len(turn1)
    batch = to_batch(episodes, [RewardResult(1.0, {"correct": 1.0})] * 2, codec.pad_id)
    assert batch.group_ids.tolist() == [7, 7]
    assert batch.turn_scores.tolist() == [[0.0, 0.5], [0.0, 0.5]] and batch.turn_mask.all()
    assert ((batch.turn_ids >= 0) == (batch.response_mask > 0)).all()
    assert (batch.behaviour_logprobs[batch.response_mask == 0] == 0).all()
    lengths = batch.attention_mask.sum(-1)
    for i, ep in enumerate(episodes):
        assert lengths[i] == len(ep.token_ids)
        assert (batch.input_ids[i, lengths[i]:] == codec.pad_id).all()
    assert batch.reward_parts["correct"].tolist() == [1.0, 1.0] and batch.turn_parts == {}
    assert all("reward_extras" not in m for m in batch.metadata)  # no extras: no key
    # Per-turn lists go to turn_parts, right-padded with 0 to the batch's K = 2 turns (or the longest list:
    # 3 for "long"); a reward's extras to that episode's metadata, untouched.
    per_turn = to_batch(episodes, [RewardResult(1.0, {"correct": 1.0}, {"tool_scores": [0.5]}, {"judge": "yes"}),
                                   RewardResult(0.0, {}, {"tool_scores": [], "long": [1.0, 2.0, 3.0]})], codec.pad_id)
    assert per_turn.turn_parts["tool_scores"].tolist() == [[0.5, 0.0], [0.0, 0.0]]
    assert per_turn.turn_parts["long"].tolist() == [[0.0, 0.0, 0.0], [1.0, 2.0, 3.0]]  # episode 0 has no list
    assert per_turn.reward_parts == {"correct": per_turn.reward_parts["correct"]}  # no per-turn list in parts
    assert per_turn.reward_parts["correct"].tolist() == [1.0, 0.0] and per_turn.scores.tolist() == [1.0, 0.0]
    assert per_turn.metadata[0]["reward_extras"] == {"judge": "yes"} and "reward_extras" not in per_turn.metadata[1]


def test_feedback_is_capped_at_a_token_budget(policy):
    _, tok, _ = policy
    long = "Try again. " * 40
    capped = ChatCodec(tok, max_feedback_tokens=5)
    content = tok.decode(tok(long, add_special_tokens=False)["input_ids"][:5]) + "...[truncated]"
    assert capped.feedback_ids([{"role": "tool", "content": long}]) == \
        ChatCodec(tok).feedback_ids([{"role": "tool", "content": content}])
    short = [{"role": "tool", "content": "Try again."}]
    assert capped.feedback_ids(short) == ChatCodec(tok).feedback_ids(short)  # under the budget: untouched
