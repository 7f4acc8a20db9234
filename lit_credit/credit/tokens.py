"""Per-token credit and the credit metrics every estimator reports: per-rollout advantages broadcast onto the
learnable tokens, row-blocked token passes, and ``credit/adv_mean|adv_std|adv_abs_max`` from running moments
(no [B, T] temporaries).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_credit.credit.groups import zero_group_frac
from lit_credit.types import CreditOutput

BLOCK_TOKENS = 1 << 18


def row_blocks(shape: torch.Size) -> list[slice]:
    """Row slices of a [B, T] tensor, ``BLOCK_TOKENS // T`` rows (at least 1) each. Token passes with
    integer temporaries (gather indices, positions) run block by block, so a temporary stays in cache and
    the allocator recycles it, where a whole-batch one faults in fresh pages on every call (a loop over
    ``B * T / BLOCK_TOKENS`` blocks, not over rollouts)."""
    step = max(1, BLOCK_TOKENS // max(1, shape[1]))
    return [slice(start, start + step) for start in range(0, shape[0], step)]


def segment_moments(values: Tensor, counts: Tensor) -> Tensor:
    """``[N, sum n v, sum n v^2, max_{n > 0} |v|]`` (float64) of tokens constant on segments: segment j of
    row i holds ``n = counts[i, j]`` tokens equal to ``v = values[i, j]``.

    Shape:
        values, counts: [B] or [B, S], the same. Output: [4].
    """
    v, n = values.double().reshape(-1), counts.double().reshape(-1)
    nv = n * v
    top = torch.where(n > 0, v.abs(), 0).max() if v.numel() else v.new_zeros(())
    return torch.stack([n.sum(), nv.sum(), (nv * v).sum(), top])


def token_moments(tokens: Tensor, n_tokens: Tensor | float) -> Tensor:
    """:func:`segment_moments` of ``n_tokens`` counted tokens from a [B, T] tensor that is 0 on every token
    not counted, so whole-tensor sums are sums over the counted ones: three reads, no temporary."""
    flat = tokens.reshape(-1)
    if flat.numel() == 0:
        return flat.new_zeros(4, dtype=torch.float64)
    low, high = torch.aminmax(flat)
    n = torch.as_tensor(n_tokens, device=flat.device)
    moments = [n, flat.sum(), torch.dot(flat, flat), torch.maximum(-low, high)]
    return torch.stack([m.reshape(()).double() for m in moments])


def label_moments(values: Tensor, labels: Tensor, n_labels: int) -> Tensor:
    """:func:`segment_moments` of the values carrying each label, one bincount per moment: row l holds
    ``[#{label = l}, sum v, sum v^2, max |v|]`` over the values with label l.

    Shape:
        values: any shape, labels: the same, long in [0, n_labels). Output: [n_labels, 4] float64.
    """
    v, lab = values.double().reshape(-1), labels.reshape(-1)
    top = v.new_zeros(n_labels).scatter_reduce_(0, lab, v.abs(), "amax")
    sums = [torch.bincount(lab, w, minlength=n_labels) for w in (None, v, v * v)]
    return torch.stack([*[x.double() for x in sums], top], 1)


def merge_moments(*moments: Tensor) -> Tensor:
    """Moments of the union of disjoint token sets."""
    m = torch.stack(moments)
    return torch.cat([m[:, :3].sum(0), m[:, 3].max(0, keepdim=True).values])


def moment_metrics(moments: Tensor, prefix: str = "credit/") -> dict[str, float]:
    """``{prefix}adv_mean = S1 / N``, ``adv_std = sqrt(S2 / N - mean^2)`` (population),
    ``adv_abs_max``, from ``[N, S1, S2, max |a|]``; all 0 when ``N = 0``."""
    n, s1, s2, top = moments.tolist()
    if n == 0:
        return {f"{prefix}adv_mean": 0.0, f"{prefix}adv_std": 0.0, f"{prefix}adv_abs_max": 0.0}
    mean = s1 / n
    return {f"{prefix}adv_mean": mean, f"{prefix}adv_std": max(s2 / n - mean * mean, 0.0) ** 0.5,
            f"{prefix}adv_abs_max": top}


def segment_metrics(values: Tensor, counts: Tensor, prefix: str = "credit/") -> dict[str, float]:
    """``{prefix}adv_mean|adv_std|adv_abs_max`` of tokens constant on segments (:func:`segment_moments`),
    without [B, T] work."""
    return moment_metrics(segment_moments(values, counts), prefix)


def true_frac(flags: Tensor) -> float:
    """Fraction of True entries (0.0 when empty)."""
    return flags.float().mean().item() if flags.numel() else 0.0


def rollout_credit(advantages: Tensor, response_mask: Tensor, group_ids: Tensor) -> CreditOutput:
    """Broadcast per-rollout advantages onto the learnable tokens; ``parts["rollout"]`` keeps them.

    Shape:
        advantages: [B], response_mask: [B, T], group_ids: [B]. ``CreditOutput.advantages``: [B, T].
    """
    tokens = torch.where(response_mask.bool(), advantages[:, None], 0)
    metrics = {
        **segment_metrics(advantages, response_mask.sum(1)),
        "credit/zero_variance_group_frac": zero_group_frac(advantages, group_ids),
    }
    return CreditOutput(tokens, {"rollout": advantages}, metrics)
