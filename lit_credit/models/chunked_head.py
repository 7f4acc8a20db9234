"""Per-token log-probs straight from the final hidden states, a chunk of tokens at a time, so no [B, T, V]
logits tensor exists in the forward or the backward pass (what fused linear cross-entropy kernels do).

With ``V = 49 152`` one fp32 logits tensor of a 16 384-token micro-batch is 3.2 GB, and autograd keeps it (and
its softmax) for the backward. Here the LM head runs inside the model's own forward (the output-embedding
module is swapped for :class:`LogprobHead` for the duration of one call, so FSDP2's hooks on the root module
have unsharded its weight, and re-unshard it for the backward), and :class:`ChunkedLogprob` computes, per
chunk of ``chunk`` tokens, ``z = (h W^T + b) / tau``, ``logp = z[y] - logsumexp(z)`` and the entropy, keeping only
``h``, ``W`` and ``logsumexp`` for the backward, where it recomputes ``z`` chunk by chunk.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import Tensor, nn

# Config attributes of models whose logits are transformed after the LM head, with the value that leaves them
# as they are. The head computes the raw ``h W^T + b`` only, so any other value is refused by name rather than
# silently given wrong log-probs.
TRANSFORMED_LOGITS = {"final_logit_softcapping": None, "logit_scale": 1.0, "logits_scaling": 1.0,
                      "output_multiplier_scale": 1.0}


class ChunkedLogprob(torch.autograd.Function):
    """``logp_i = z_i[y_i] - log sum_v exp z_iv`` with ``z_i = (h_i W^T + b) / tau``, and the entropy
    ``H_i = logsumexp(z_i) - sum_v softmax(z_i)_v z_iv`` (no gradient), chunk by chunk over the N rows.

    Backward, with ``p = softmax(z_i)`` and upstream ``g_i``: ``dL/dz_i = g_i (onehot(y_i) - p) / tau``, so
    ``dL/dh_i = dL/dz_i W`` and ``dL/dW = sum_i dL/dz_i^T h_i``, ``dL/db = sum_i dL/dz_i``: each chunk's
    ``z`` is recomputed from the saved ``h`` and ``logsumexp``. The peak extra memory is two ``[chunk, V]``
    float32 tensors, whatever N.

    Shapes: hidden [N, H], weight [V, H], bias [V] or None, target [N] long -> logp [N], entropy [N] (float32).
    """

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor, tau: float,
                chunk: int, entropy: bool) -> tuple[Tensor, Tensor]:
        n = hidden.shape[0]
        logp = hidden.new_empty(n, dtype=torch.float32)
        lse = hidden.new_empty(n, dtype=torch.float32)
        ent = hidden.new_zeros(n if entropy else 0, dtype=torch.float32)
        for s in range(0, n, chunk):
            z = _logits(hidden[s:s + chunk], weight, bias, tau)
            lse[s:s + chunk] = z.logsumexp(-1)
            logp[s:s + chunk] = z.gather(-1, target[s:s + chunk, None]).squeeze(-1) - lse[s:s + chunk]
            if entropy:
                ent[s:s + chunk] = lse[s:s + chunk] - (z.softmax(-1) * z).sum(-1)
        ctx.save_for_backward(hidden, weight, bias, target, lse)
        ctx.tau, ctx.chunk = tau, chunk
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp: Tensor, grad_ent: Tensor):
        hidden, weight, bias, target, lse = ctx.saved_tensors
        want_h, want_w, want_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if want_h else None
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if want_w else None
        grad_b = torch.zeros_like(bias, dtype=torch.float32) if want_b else None
        for s in range(0, hidden.shape[0], ctx.chunk):
            h = hidden[s:s + ctx.chunk]
            g = grad_logp[s:s + ctx.chunk, None] / ctx.tau
            # dz = g (onehot - p), built in the buffer of z: p = exp(z - lse), then -g p, then + g at y
            dz = _logits(h, weight, bias, ctx.tau).sub_(lse[s:s + ctx.chunk, None]).exp_().mul_(-g)
            dz.scatter_add_(-1, target[s:s + ctx.chunk, None], g)
            if want_h:
                grad_h[s:s + ctx.chunk] = (dz.to(weight.dtype) @ weight).to(hidden.dtype)
            if want_w:
                grad_w.add_(dz.T @ h.float())
            if want_b:
                grad_b.add_(dz.sum(0))
        return (grad_h, grad_w.to(weight.dtype) if want_w else None, grad_b.to(bias.dtype) if want_b else None,
                None, None, None, None)


def _logits(hidden: Tensor, weight: Tensor, bias: Tensor | None, tau: float) -> Tensor:
    z = (hidden @ weight.T if bias is None else torch.addmm(bias, hidden, weight.T)).float()
    return z.div_(tau) if tau != 1.0 else z


class LogprobHead(nn.Module):
    """Stands in for a causal LM's output embedding during one forward call: given the final hidden states
    ``[B, T, H]`` it returns ``[B, T, 2]`` aligned with the tokens: at position t >= 1 the log-prob of token t
    (``targets[:, t - 1]``) given the tokens before it and the entropy of that distribution (0 without
    ``entropy``); position 0 (no context) is 0. Computed by :class:`ChunkedLogprob`."""

    def __init__(self, head: nn.Module, targets: Tensor, tau: float, chunk: int, entropy: bool) -> None:
        super().__init__()
        self.head, self.targets, self.tau, self.chunk, self.entropy = head, targets, tau, chunk, entropy

    def forward(self, hidden: Tensor) -> Tensor:
        b, t, _ = hidden.shape
        if self.targets.shape != (b, t - 1):
            raise ValueError(f"LogprobHead: hidden states {tuple(hidden.shape)} do not match the targets "
                             f"{tuple(self.targets.shape)} (a model that keeps only some positions' logits "
                             "(logits_to_keep) cannot use the chunked head)")
        flat = hidden[:, :-1].reshape(-1, hidden.shape[-1])
        logp, ent = ChunkedLogprob.apply(flat, self.head.weight, getattr(self.head, "bias", None),
                                         self.targets.reshape(-1), self.tau, self.chunk, self.entropy)
        logp = logp.view(b, t - 1)
        out = torch.stack([logp, ent.view(b, t - 1) if self.entropy else torch.zeros_like(logp)], -1)
        return nn.functional.pad(out, (0, 0, 1, 0))


def _base(model: nn.Module) -> nn.Module:
    return model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT model's own model


def check_chunkable(model: nn.Module) -> nn.Module:
    """The output-embedding module of ``model`` (a PEFT model: of its base model) after checking that the
    chunked head computes its logits: a plain weight (and bias) and no logit transform after it
    (:data:`TRANSFORMED_LOGITS`). Raises naming the attribute and the fix otherwise."""
    model = _base(model)
    config = getattr(model, "config", None)
    for name, identity in TRANSFORMED_LOGITS.items():
        value = getattr(config, name, identity)
        if value != identity:
            raise ValueError(f"model.head_chunk_tokens: {type(model).__name__} transforms its logits after the LM "
                             f"head (config.{name}={value!r}), which the chunked head does not reproduce; fix: "
                             "model.head_chunk_tokens=null (the model's own logits)")
    head = model.get_output_embeddings()
    if head is None or not isinstance(getattr(head, "weight", None), Tensor) or hasattr(head, "base_layer"):
        raise ValueError(f"model.head_chunk_tokens: the output embedding of {type(model).__name__} is "
                         f"{type(head).__name__}, not a plain linear layer (an adapter on lm_head?); fix: keep "
                         "adapters off the LM head, or model.head_chunk_tokens=null")
    return head


def _owner(model: nn.Module, head: nn.Module) -> tuple[nn.Module, str]:
    for module in model.modules():
        for child_name, child in module.named_children():
            if child is head:
                return module, child_name
    raise ValueError(f"the output embedding {type(head).__name__} is not a submodule of {type(model).__name__}")


@contextmanager
def logprob_head(model: nn.Module, targets: Tensor, tau: float, chunk: int, entropy: bool):
    """Within the block, ``model(...).logits`` is ``[B, T, 2]`` (log-prob of ``targets``, entropy) from
    :class:`LogprobHead` instead of ``[B, T, V]``. ``model`` may be a PEFT model (its base model's head)."""
    head = check_chunkable(model)
    owner, name = _owner(_base(model), head)
    setattr(owner, name, LogprobHead(head, targets, tau, chunk, entropy))
    try:
        yield
    finally:
        setattr(owner, name, head)
