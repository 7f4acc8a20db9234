"""Group statistics shared by every estimator, and GRPO / Dr.GRPO credit (docs/methods.md §0).

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
    shifted = torch.where(p, x - low.index_select(0, inv), 0)
    count = zeros.index_add(0, inv, p.to(x.dtype))
    mean = zeros.index_add(0, inv, shifted) / count.clamp_min(1)
    centred = torch.where(p, shifted - mean.index_select(0, inv), 0)
    var = zeros.index_add(0, inv, centred * centred) / (count - int(unbiased)).clamp_min(1)
    std, count = var.sqrt().index_select(0, inv), count.index_select(0, inv)
    return centred.reshape(shape), std.reshape(shape), count.reshape(shape)


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
    scores: Tensor, response_mask: Tensor, group_ids: Tensor, *, eps: float = 1e-6, norm_by_std: bool = True,
    unbiased: bool = True,
) -> CreditOutput:
    """GRPO: ``A_i = Norm_{g(i)}(R_i)`` on every learnable token of rollout i, 0 elsewhere.

    ``norm_by_std=False`` is Dr.GRPO (``A_i = R_i - mean_{g(i)} R``). Singleton groups get 0.
    ``unbiased`` picks the std of ``Norm``: Bessel-corrected ``sqrt(sum_G (R - mean)^2 / (|G| - 1))`` (the
    default), or the population std ``sqrt(sum_G (R - mean)^2 / |G|)`` with ``unbiased=False`` (the DPA-GRPO
    paper's baselines: a group of two scores [1, 0] gets +-0.5 / (0.5 + eps) = +-1, not +-0.707).
    Metrics: ``credit/adv_mean|adv_std|adv_abs_max`` over learnable tokens and
    ``credit/zero_variance_group_frac`` (groups where every rollout gets 0).

    Shape:
        scores: [B], response_mask: [B, T] (1 = learnable), group_ids: [B].
        Output advantages: [B, T]; ``parts["rollout"]``: [B].
    """
    adv = group_normalize(scores, group_ids, eps=eps, norm_by_std=norm_by_std, unbiased=unbiased)
    return rollout_credit(adv, response_mask, group_ids)


class OverlongPenalty:
    """DAPO's soft overlong punishment (DAPO paper, Eq. 13; verl's ``reward_model.overlong_buffer``).

    With ``L_max = max_len`` and ``L_cache = cache`` (default ``max(1, round(cache_frac * max_len))``; the
    paper's 4096 of 20480 is ``cache_frac = 0.2``), a response of ``|y|`` tokens gets

        ``R_len(y) = 0``                                     if ``|y| <= L_max - L_cache``,
        ``R_len(y) = factor * ((L_max - L_cache) - |y|) / L_cache``  if ``L_max - L_cache < |y| <= L_max``,
        ``R_len(y) = -factor``                               if ``|y| > L_max``,

    added to its reward before the group normalisation (``factor`` 1: verl's ``overlong_penalty_factor``).
    ``L_max = 10, L_cache = 2``: 8 tokens 0, 9 tokens -0.5, 10 tokens -1.

    Shape:
        lengths: [B] (any dtype). Output: [B] float32, in [-factor, 0].
    """

    def __init__(self, *, max_len: int, cache: int | None = None, cache_frac: float = 0.2,
                 factor: float = 1.0) -> None:
        if max_len < 1:
            raise ValueError(f"credit.overlong.max_len={max_len}: must be >= 1 (the generation limit, "
                             "data.sampling.max_new_tokens)")
        cache = max(1, round(cache_frac * max_len)) if cache is None else cache
        if not 1 <= cache <= max_len:
            raise ValueError(f"credit.overlong.cache={cache}: must be in [1, max_len={max_len}]")
        self.max_len, self.cache, self.factor = int(max_len), int(cache), float(factor)

    def __call__(self, lengths: Tensor) -> Tensor:
        exceed = (lengths.float() - (self.max_len - self.cache)).clamp(0, self.cache)
        return -self.factor * exceed / self.cache


def shaped_scores(batch: RolloutBatch, overlong: OverlongPenalty | None) -> tuple[Tensor, dict[str, float]]:
    """``batch.scores`` plus ``overlong`` of each rollout's length ``|y|`` = its learnable (policy-generated)
    tokens, ``response_mask.sum(1)``; and the metrics ``credit/overlong_frac`` (share of rollouts with a
    penalty) and ``credit/overlong_penalty_mean``. Without ``overlong``: the scores and no metric."""
    if overlong is None:
        return batch.scores, {}
    penalty = overlong(batch.response_mask.sum(1)).to(batch.scores.dtype)
    return batch.scores + penalty, {"credit/overlong_frac": share(penalty < 0),
                                    "credit/overlong_penalty_mean": penalty.mean().item()}


@register("grpo")
class GRPOCredit(CreditEstimator):
    """:func:`grpo_advantages` of ``batch.scores``; ``unbiased=False``: population std (see there).

    ``overlong``: DAPO's soft overlong punishment (:class:`OverlongPenalty`) added to the scores first
    (:func:`shaped_scores`; ``credit/overlong=dapo``, on in the DAPO experiments); None: off."""

    def __init__(self, *, norm_by_std: bool = True, eps: float = 1e-6, unbiased: bool = True,
                 overlong: OverlongPenalty | None = None) -> None:
        self.norm_by_std = norm_by_std
        self.eps = eps
        self.unbiased = unbiased
        self.overlong = overlong

    def __call__(self, batch: RolloutBatch) -> CreditOutput:
        check_batch(batch, {"batch.scores": batch.scores})
        scores, metrics = shaped_scores(batch, self.overlong)
        out = grpo_advantages(
            scores, batch.response_mask, batch.group_ids, eps=self.eps, norm_by_std=self.norm_by_std,
            unbiased=self.unbiased,
        )
        out.metrics.update(metrics)
        return out


@register("dr_grpo")
class DrGRPOCredit(GRPOCredit):
    """Dr.GRPO: :class:`GRPOCredit` without the std division (``A_i = R_i - mean_{g(i)} R``)."""

    def __init__(self, *, norm_by_std: bool = False, eps: float = 1e-6,
                 overlong: OverlongPenalty | None = None) -> None:
        super().__init__(norm_by_std=norm_by_std, eps=eps, overlong=overlong)
