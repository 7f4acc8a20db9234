"""Group statistics shared by every estimator, and GRPO / Dr.GRPO credit (methods.md §0).

``Norm_G(x) = (x - mean_G x) / (std_G x + eps)`` over the set G of a group's rollouts, unbiased (Bessel)
std; ``x - mean_G x`` with ``norm_by_std=False`` (Dr.GRPO). Presence guard: statistics use only the
present rollouts, and a group with fewer than 2 present gets 0 for all its rollouts; absent ones get 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_credit.credit.registry import CreditEstimator, check_batch, register
from lit_credit.types import CreditOutput, RolloutBatch


def group_stats(
    x: Tensor, group_ids: Tensor, present: Tensor | None = None, *, unbiased: bool = True
) -> tuple[Tensor, Tensor, Tensor]:
    """Elementwise ``(x - mean_G x, std_G x, |G|)``, G the present elements of the element's group.

    Group ids are any integers (not necessarily contiguous). The centred value is 0 where absent. The
    std is Bessel-corrected when ``unbiased`` (0 for ``|G| < 2``), else the population std. The group
    minimum is subtracted before summing, so a group of equal values centres to exactly 0 in any dtype
    (no spurious ``ulp / eps`` advantages on zero-variance groups).

    Shape:
        x, group_ids, present: any shape, all the same. Outputs: that shape, x's dtype.
    """
    shape = x.shape
    x = x.reshape(-1)
    p = torch.ones_like(x, dtype=torch.bool) if present is None else present.reshape(-1).bool()
    uniq, inv = torch.unique(group_ids.reshape(-1), return_inverse=True)
    zeros = x.new_zeros(uniq.numel())
    low = x.new_full((uniq.numel(),), float("inf")).scatter_reduce_(
        0, inv, x.masked_fill(~p, float("inf")), "amin"
    )
    shifted = torch.where(p, x - low[inv], 0)
    count = zeros.index_add(0, inv, p.to(x.dtype))
    mean = zeros.index_add(0, inv, shifted) / count.clamp_min(1)
    centred = torch.where(p, shifted - mean[inv], 0)
    var = zeros.index_add(0, inv, centred * centred) / (count - int(unbiased)).clamp_min(1)
    return centred.reshape(shape), var.sqrt()[inv].reshape(shape), count[inv].reshape(shape)


def group_normalize(
    scores: Tensor,
    group_ids: Tensor,
    present: Tensor | None = None,
    *,
    eps: float = 1e-6,
    norm_by_std: bool = True,
    unbiased: bool = True,
) -> Tensor:
    """``Norm_{g(i)}(scores_i)`` with the presence guard.

    ``A_i = (s_i - mean_G s) / (std_G s + eps)`` (``s_i - mean_G s`` when ``norm_by_std=False``), G the
    present rollouts of i's group; ``A_i = 0`` when i is absent or ``|G| < 2``. ``unbiased=False`` uses
    the population std (DPA pairs).

    Shape:
        scores, group_ids, present (bool, optional; all present when None): [B] (any shape, all the
        same: elements are grouped by id). Output: the same shape, scores' dtype.
    """
    centred, std, count = group_stats(scores, group_ids, present, unbiased=unbiased)
    adv = centred / (std + eps) if norm_by_std else centred
    return torch.where(count >= 2, adv, 0)


def token_metrics(advantages: Tensor, mask: Tensor, prefix: str = "credit/") -> dict[str, float]:
    """``{prefix}adv_mean``, ``adv_std`` (population), ``adv_abs_max`` over the tokens where ``mask``."""
    a = advantages.reshape(-1)[mask.reshape(-1).bool()]  # 1-D: one index per token, not (row, col) pairs
    if a.numel() == 0:
        return {f"{prefix}adv_mean": 0.0, f"{prefix}adv_std": 0.0, f"{prefix}adv_abs_max": 0.0}
    return {
        f"{prefix}adv_mean": a.mean().item(),
        f"{prefix}adv_std": a.std(correction=0).item(),
        f"{prefix}adv_abs_max": a.abs().max().item(),
    }


def segment_metrics(values: Tensor, counts: Tensor, prefix: str = "credit/") -> dict[str, float]:
    """:func:`token_metrics` of tokens constant on segments, from the segment values, without [B, T] work.

    Segment j of row i holds ``n_ij = counts[i, j]`` tokens all equal to ``v_ij = values[i, j]``; with
    ``N = sum n``: ``adv_mean = sum n v / N``, ``adv_std = sqrt(sum n (v - mean)^2 / N)`` (population, two
    passes in float64), ``adv_abs_max = max_{n > 0} |v|``; all 0 when ``N = 0``.

    Shape:
        values, counts: [B] or [B, S], the same.
    """
    v, n = values.double().reshape(-1), counts.double().reshape(-1)
    total = n.sum()
    if total == 0:
        return {f"{prefix}adv_mean": 0.0, f"{prefix}adv_std": 0.0, f"{prefix}adv_abs_max": 0.0}
    mean = (n * v).sum() / total
    return {
        f"{prefix}adv_mean": mean.item(),
        f"{prefix}adv_std": ((n * (v - mean).square()).sum() / total).sqrt().item(),
        f"{prefix}adv_abs_max": torch.where(n > 0, v.abs(), 0).max().item(),
    }


def share(flags: Tensor) -> float:
    """Fraction of True entries (0.0 when empty)."""
    return flags.float().mean().item() if flags.numel() else 0.0


def zero_group_frac(advantages: Tensor, group_ids: Tensor) -> float:
    """Share of groups whose rollouts all get 0 (constant scores, or fewer than 2 present)."""
    n = torch.unique(group_ids).numel()
    return 1.0 - torch.unique(group_ids[advantages != 0]).numel() / n if n else 0.0


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


def grpo_advantages(
    scores: Tensor, response_mask: Tensor, group_ids: Tensor, *, eps: float = 1e-6, norm_by_std: bool = True
) -> CreditOutput:
    """GRPO: ``A_i = Norm_{g(i)}(R_i)`` on every learnable token of rollout i, 0 elsewhere.

    ``norm_by_std=False`` is Dr.GRPO (``A_i = R_i - mean_{g(i)} R``). Singleton groups get 0.
    Metrics: ``credit/adv_mean|adv_std|adv_abs_max`` over learnable tokens and
    ``credit/zero_variance_group_frac`` (groups where every rollout gets 0).

    Shape:
        scores: [B], response_mask: [B, T] (1 = learnable), group_ids: [B].
        Output advantages: [B, T]; ``parts["rollout"]``: [B].
    """
    adv = group_normalize(scores, group_ids, eps=eps, norm_by_std=norm_by_std)
    return rollout_credit(adv, response_mask, group_ids)


@register("grpo")
class GRPOCredit(CreditEstimator):
    """:func:`grpo_advantages` of ``batch.scores``."""

    def __init__(self, *, norm_by_std: bool = True, eps: float = 1e-6) -> None:
        self.norm_by_std = norm_by_std
        self.eps = eps

    def __call__(self, batch: RolloutBatch) -> CreditOutput:
        check_batch(batch, {"batch.scores": batch.scores})
        return grpo_advantages(
            batch.scores, batch.response_mask, batch.group_ids, eps=self.eps, norm_by_std=self.norm_by_std
        )


@register("dr_grpo")
class DrGRPOCredit(GRPOCredit):
    """Dr.GRPO: :class:`GRPOCredit` without the std division (``A_i = R_i - mean_{g(i)} R``)."""

    def __init__(self, *, norm_by_std: bool = False, eps: float = 1e-6) -> None:
        super().__init__(norm_by_std=norm_by_std, eps=eps)
