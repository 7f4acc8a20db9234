"""Per-token log-probs and entropies of a causal LM, with padding-free micro-batches."""
from __future__ import annotations

from bisect import bisect_right

import torch
import torch.nn.functional as F
from torch import Tensor

from lit_credit.models.chunked_head import logprob_head


def _forward(
    model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, entropy: bool, temperature: float = 1.0,
    head_chunk: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """With ``z = logits / temperature``: ``logp = z[token] - logsumexp(z)`` (no [B, T, V] log-softmax kept
    for backward) and, with ``entropy``, ``H = logsumexp(z) - sum softmax(z) z`` (the entropy of the tempered
    distribution), a diagnostic computed without a graph. Without gradient or entropy the logits are divided
    and consumed in place (:func:`picked_logprobs_`). With ``head_chunk`` the model's LM head is replaced,
    for this call, by :func:`~lit_credit.models.chunked_head.logprob_head` (``head_chunk`` tokens at a time,
    no [B, T, V] tensor at all)."""
    if head_chunk:
        with logprob_head(model, input_ids[:, 1:], temperature, head_chunk, entropy):
            out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits.float()
        return out[..., 0], out[..., 1] if entropy else None
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1].float()
    target = input_ids[:, 1:]
    if not (entropy or torch.is_grad_enabled()):
        if temperature != 1.0:
            logits.div_(temperature)
        return F.pad(picked_logprobs_(logits, target), (1, 0)), None
    if temperature != 1.0:
        logits = logits / temperature
    lse = logits.logsumexp(-1)
    logp = logits.gather(-1, target[..., None]).squeeze(-1) - lse
    h = None
    if entropy:
        with torch.no_grad():
            h = F.pad(lse - (logits.softmax(-1) * logits).sum(-1), (1, 0))
    return F.pad(logp, (1, 0)), h


@torch.no_grad()
def picked_logprobs_(logits: Tensor, tokens: Tensor) -> Tensor:
    """``z[token] - logsumexp(z)`` over the last dim, overwriting ``logits``: the picked logits are gathered
    first, then ``logsumexp = log sum exp(z - max z) + max z`` is taken in place, so no [..., V] temporary
    is made (``torch.logsumexp`` allocates one; the operations are the same, so are the results).

    Shape:
        logits: [..., V] float (consumed), tokens: [...] long. Output: [...].
    """
    picked = logits.gather(-1, tokens[..., None]).squeeze(-1)
    top = logits.amax(-1, keepdim=True)
    top.masked_fill_(top.isinf(), 0)
    return picked - logits.sub_(top).exp_().sum(-1).log_().add_(top.squeeze(-1))


def length_buckets(attention_mask: Tensor, token_budget: int) -> list[tuple[Tensor, int]]:
    """Rows sorted by length (longest first) and cut into micro-batches of at most ``token_budget`` tokens.

    A micro-batch starting at a row of length w holds up to ``max(1, token_budget // w)`` rows, none shorter
    than w / 2 (so padding is under half of any row), each cut to width w (right padding: a row's tokens are
    a prefix). Returns ``(row indices, width)`` pairs.
    """
    positions = torch.arange(1, attention_mask.shape[1] + 1, device=attention_mask.device)
    lengths = (attention_mask.bool() * positions).amax(1).clamp(min=1)  # last real token + 1
    lengths, order = lengths.sort(descending=True, stable=True)
    negated, buckets, start = (-lengths).tolist(), [], 0
    while start < len(negated):
        width = -negated[start]
        end = min(start + max(1, token_budget // width), bisect_right(negated, -((width + 1) // 2)))
        buckets.append((order[start:end], width))
        start = end
    return buckets


def token_logprobs(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor,
                   token_budget: int | None = None, *, entropy: bool = True,
                   temperature: float = 1.0, head_chunk: int | None = None,
                   min_forwards: int = 0) -> tuple[Tensor, Tensor | None]:
    """``logp[b, t] = log pi(input_ids[b, t] | input_ids[b, :t])`` and, with ``entropy``, the entropy of that
    distribution (a diagnostic: no gradient flows through it; None without ``entropy``). ``pi`` is
    ``softmax(logits / temperature)``, the distribution a batch sampled at that temperature was drawn from,
    so pass the batch's ``RolloutBatch.temperature`` (as verl and TRL do). Top-p is not renormalised (as in
    verl): a batch sampled with ``top_p < 1`` gets the log-probs of the full tempered softmax, not of the
    nucleus.

    Shape: input_ids, attention_mask [B, T] (right-padded) -> logp [B, T], entropy [B, T]; position 0 (no
    context) and padding are 0. Computed in float32 whatever the model dtype. With ``token_budget`` the rows
    run in :func:`length_buckets` micro-batches, each cut to its longest row, so long multi-turn rollouts
    next to short ones do not pay for padding; the results equal the padded pass up to float rounding.
    Without gradient and entropy (reference and old-policy log-probs) no [B, T, V] temporary is made beyond
    the model's logits; with ``head_chunk`` (tokens per LM-head chunk) not even those, with or without
    gradient (:mod:`lit_credit.models.chunked_head`). ``min_forwards``: run at least that many micro-batch
    forwards (the extra ones of one row, discarded), so that every rank of a sharded (FSDP2) model runs as many
    forwards, and so all-gathers, as the rank with the most.
    """
    if not temperature > 0:
        raise ValueError(f"token_logprobs: temperature={temperature!r} must be > 0 (a batch's "
                         "RolloutBatch.temperature, the data.sampling.temperature it was sampled at; 1.0 for "
                         "greedy batches)")
    if token_budget is None:
        return _forward(model, input_ids, attention_mask, entropy, temperature, head_chunk)
    width = input_ids.shape[1]
    parts, rows = [], []
    for index, w in length_buckets(attention_mask, token_budget):
        outputs = _forward(model, input_ids[index, :w], attention_mask[index, :w], entropy, temperature, head_chunk)
        parts.append(torch.stack([F.pad(x, (0, width - w)) for x in outputs if x is not None]))
        rows.append(index)
    for _ in range(min_forwards - len(rows)):  # padding forwards: their collectives line up with other ranks'
        _forward(model, input_ids[rows[0][:1]], attention_mask[rows[0][:1]], entropy, temperature, head_chunk)
    inverse = torch.cat(rows).argsort()
    out = torch.cat(parts, dim=1)[:, inverse] * attention_mask.to(parts[0].dtype)
    return out[0], out[1] if entropy else None
