"""Per-token log-probs and entropies of a causal LM, with padding-free micro-batches."""
from __future__ import annotations

from bisect import bisect_right

import torch
import torch.nn.functional as F
from torch import Tensor


def _forward(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
    """``logp = z[token] - logsumexp(z)`` (no [B, T, V] log-softmax kept for backward) and the entropy
    ``H = logsumexp(z) - sum softmax(z) z``, a diagnostic computed without a graph."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    lse = logits.logsumexp(-1)
    logp = logits.gather(-1, input_ids[:, 1:, None]).squeeze(-1) - lse
    with torch.no_grad():
        entropy = lse - (logits.softmax(-1) * logits).sum(-1)
    return F.pad(logp, (1, 0)), F.pad(entropy, (1, 0))


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
                   token_budget: int | None = None) -> tuple[Tensor, Tensor]:
    """``logp[b, t] = log pi(input_ids[b, t] | input_ids[b, :t])`` and the entropy of that distribution (a
    diagnostic: no gradient flows through it).

    Shape: input_ids, attention_mask [B, T] (right-padded) -> logp [B, T], entropy [B, T]; position 0 (no
    context) and padding are 0. Computed in float32 whatever the model dtype. With ``token_budget`` the rows
    run in :func:`length_buckets` micro-batches, each cut to its longest row, so long multi-turn rollouts
    next to short ones do not pay for padding; the results equal the padded pass up to float rounding.
    """
    if token_budget is None:
        return _forward(model, input_ids, attention_mask)
    width = input_ids.shape[1]
    parts, rows = [], []
    for index, w in length_buckets(attention_mask, token_budget):
        logp, entropy = _forward(model, input_ids[index, :w], attention_mask[index, :w])
        parts.append(torch.stack([F.pad(logp, (0, width - w)), F.pad(entropy, (0, width - w))]))
        rows.append(index)
    inverse = torch.cat(rows).argsort()
    out = torch.cat(parts, dim=1)[:, inverse] * attention_mask.to(parts[0].dtype)
    return out[0], out[1]
