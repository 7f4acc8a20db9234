"""The chunked LM head (lit_credit.models.chunked_head): the same log-probs, entropies and gradients as the
model's own [B, T, V] logits, on a real HF Llama (random weights, fp32), with and without LoRA, biased heads
and tied embeddings; the logits tensor it never builds; the models it refuses by name."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lit_credit.models.chunked_head import ChunkedLogprob, logprob_head
from lit_credit.models.logprobs import token_logprobs


def llama(tie: bool = False, **extra) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=tie, **extra)
    return LlamaForCausalLM(config).eval()


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (3, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # right padding
    mask[2, 4:] = 0
    return ids, mask


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to fp32 rounding of sums over tokens: ||a - b|| <= 1e-6 ||b||."""
    return bool((a - b).norm() <= 1e-6 * b.norm())


def grads(model, head_chunk, temperature=0.7, budget=None):
    model.zero_grad()
    ids, mask = batch()
    logp, ent = token_logprobs(model, ids, mask, budget, temperature=temperature, head_chunk=head_chunk)
    # any loss that weights the tokens differently: sum_t w_t logp_t with w_t = t (masked)
    (logp * mask * torch.arange(11)).sum().backward()
    return logp.detach(), ent, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("chunk", [1, 4, 1000])
def test_logprobs_entropy_and_gradients_equal_the_full_logits(tie, chunk):
    model = llama(tie)
    logp, ent, g = grads(model, None)
    logp_c, ent_c, g_c = grads(model, chunk)
    assert torch.allclose(logp_c, logp, atol=1e-6) and torch.allclose(ent_c, ent, atol=1e-6)
    assert g.keys() == g_c.keys() and ("lm_head.weight" in g or tie)
    for name in g:
        assert close(g_c[name], g[name]), name


def test_token_budget_micro_batches_and_no_grad_paths_agree():
    model = llama()
    ids, mask = batch()
    with torch.no_grad():
        full, _ = token_logprobs(model, ids, mask, entropy=False, temperature=0.5)
        chunked, none = token_logprobs(model, ids, mask, token_budget=16, entropy=False, temperature=0.5,
                                       head_chunk=3)
    assert none is None and torch.allclose(chunked * mask, full * mask, atol=1e-6)


def test_lora_gradients_reach_the_adapters_only():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(llama(), peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    for p in model.parameters():  # adapters start at B = 0: give them weight so the gradients differ from 0
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.1)
    logp, _, g = grads(model, None)
    logp_c, _, g_c = grads(model, 5)
    assert torch.allclose(logp_c, logp, atol=1e-6) and g and g.keys() == g_c.keys()
    assert all("lora_" in name for name in g)
    for name in g:
        assert close(g_c[name], g[name]), name
    with torch.no_grad(), model.disable_adapter():  # the reference: the base with adapters off
        ref, _ = token_logprobs(model, *batch(), entropy=False, head_chunk=5)
        base, _ = token_logprobs(model.get_base_model(), *batch(), entropy=False)
    assert torch.allclose(ref, base, atol=1e-6)


def test_the_function_by_hand_with_a_bias():
    """One row, V = 3, H = 1: h = 1, W = [0, 1, 2]^T, b = [0, 0, -1], tau = 1 -> z = [0, 1, 1],
    logsumexp = log(1 + 2e), logp of y = 1 is 1 - log(1 + 2e); d logp / dz = onehot - softmax, so
    dW = (onehot - p) h, db = onehot - p, dh = (onehot - p) . W = 1 - (e + 2e) / (1 + 2e)."""
    e = torch.e
    h = torch.tensor([[1.0]], requires_grad=True)
    w = torch.tensor([[0.0], [1.0], [2.0]], requires_grad=True)
    b = torch.tensor([0.0, 0.0, -1.0], requires_grad=True)
    logp, ent = ChunkedLogprob.apply(h, w, b, torch.tensor([1]), 1.0, 1, True)
    z = torch.tensor([0.0, 1.0, 1.0])
    p = z.softmax(0)
    assert logp.item() == pytest.approx(1 - torch.log(1 + 2 * torch.tensor(e)).item(), abs=1e-6)
    assert ent.item() == pytest.approx(-(p * p.log()).sum().item(), abs=1e-6)
    logp.sum().backward()
    onehot = torch.tensor([0.0, 1.0, 0.0])
    assert torch.allclose(b.grad, onehot - p, atol=1e-6) and torch.allclose(w.grad[:, 0], onehot - p, atol=1e-6)
    assert h.grad.item() == pytest.approx(1 - 3 * e / (1 + 2 * e), abs=1e-6)


def test_no_vocabulary_sized_tensor_is_kept_for_backward():
    """With the full logits autograd keeps [B, T, V] floats for the backward; the chunked head keeps the hidden
    states, the weight and one logsumexp per token. Counted with saved-tensor hooks over the head alone."""
    model = llama()
    ids, mask = batch()
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        token_logprobs(model, ids, mask, head_chunk=4)
    assert max(sizes) < ids.numel() * 97  # B x T x V = 3267; the largest kept is the embedding (97 x 32)
    sizes.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        token_logprobs(model, ids, mask)
    assert max(sizes) >= 3 * 10 * 97


@pytest.mark.parametrize("attribute, value", [("final_logit_softcapping", 30.0), ("logit_scale", 0.5),
                                              ("logits_scaling", 4.0)])
def test_models_that_transform_their_logits_are_refused_by_name(attribute, value):
    model = llama()
    setattr(model.config, attribute, value)
    with pytest.raises(ValueError, match=rf"config\.{attribute}={value}.*head_chunk_tokens=null"), \
            logprob_head(model, torch.zeros(1, 1, dtype=torch.long), 1.0, 4, False):
        pass


def test_an_adapter_on_the_lm_head_is_refused():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(llama(), peft.LoraConfig(r=2, target_modules=["lm_head"]))
    with pytest.raises(ValueError, match=r"not a plain linear layer.*adapters off the LM head"), \
            logprob_head(model, torch.zeros(1, 1, dtype=torch.long), 1.0, 4, False):
        pass
