"""Group statistics and bookkeeping every estimator shares (docs/methods.md §0).

``Norm_G(x) = (x - mean_G x) / (std_G x + eps)`` over the set G of a group's rollouts, unbiased (Bessel)
std; ``x - mean_G x`` with ``norm_by_std=False`` (Dr.GRPO). Presence guard: statistics use only the
present rollouts, and a group with fewer than 2 present gets 0 for all its rollouts; absent ones get 0.

Bookkeeping on device: the draw-order rank of each rollout's group and its place in the group, the groups with a
reward spread (DAPO's dynamic sampling keeps these), the first informative groups in draw order and one rank's
share of them.
"""
from __future__ import annotations

import torch
from torch import Tensor

from lit_credit.distributed import share
from lit_credit.types import RolloutBatch


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

def zero_group_frac(advantages: Tensor, group_ids: Tensor) -> float:
    """Share of groups whose rollouts all get 0 (constant scores, or fewer than 2 present)."""
    n = torch.unique(group_ids).numel()
    return 1.0 - torch.unique(group_ids[advantages != 0]).numel() / n if n else 0.0


def group_rank(group_ids: torch.Tensor) -> torch.Tensor:
    """[B] long: the rank of each rollout's group id among the batch's distinct ids, ascending (ids are minted
    in draw order, so this is the draw order). One stable sort and a cumsum: no host sync, no data-dependent
    shape."""
    ids, order = group_ids.sort(stable=True)
    new = torch.ones_like(ids, dtype=torch.bool)
    new[1:] = ids[1:] != ids[:-1]
    rank = torch.empty_like(order)
    rank[order] = new.long().cumsum(0) - 1
    return rank


def member_index(group_ids: torch.Tensor) -> torch.Tensor:
    """[B] long: each rollout's position among its group's rollouts, in batch order (0 for a group's first row).
    A group is generated whole on one rank, so this does not depend on how many processes share the step."""
    ids, order = group_ids.sort(stable=True)
    new = torch.ones_like(ids, dtype=torch.bool)
    new[1:] = ids[1:] != ids[:-1]
    position = torch.arange(len(ids), device=ids.device)
    start = torch.where(new, position, torch.zeros_like(position)).cummax(0).values  # each run's first position
    member = torch.empty_like(order)
    member[order] = position - start
    return member


def nonzero_variance_groups(batch: RolloutBatch) -> torch.Tensor:
    """[B] bool on the batch's device: rollouts whose group's scores are not all equal (DAPO's dynamic sampling
    keeps these): ``keep_i = max_{j in g(i)} r_j > min_{j in g(i)} r_j``, two segment reductions over the
    group ranks (:func:`group_rank`; also runs on the ``meta`` device)."""
    rank, scores = group_rank(batch.group_ids), batch.scores
    high = scores.new_full(scores.shape, -torch.inf).scatter_reduce(0, rank, scores, "amax")
    low = scores.new_full(scores.shape, torch.inf).scatter_reduce(0, rank, scores, "amin")
    return (high > low)[rank]


def first_informative_groups(batch: RolloutBatch, keep: torch.Tensor, limit: int) -> tuple[torch.Tensor, int]:
    """The first ``limit`` groups in draw order (by group id) among the groups ``keep`` ([B] bool, constant
    within a group) marks: ([B] bool, how many groups that is, at most ``limit``)."""
    rank = group_rank(batch.group_ids)
    kept = torch.zeros_like(rank).scatter_reduce(0, rank, keep.long(), "amax")  # [B]: group of rank r is kept
    before = kept.cumsum(0)  # kept groups of rank <= r
    return keep & (before[rank] <= limit), min(int(before[-1]), limit)


def kept_share(batch: RolloutBatch, keep: torch.Tensor, limit: int, rank: int, size: int
               ) -> tuple[torch.Tensor, int, bool]:
    """Rank ``rank``'s share of the groups DAPO keeps from ``batch`` (every rank's draws): the first ``limit``
    groups ``keep`` marks (:func:`first_informative_groups`), in draw order, split over ``size`` ranks in
    contiguous runs of whole groups (:func:`~lit_credit.distributed.share`), so the ranks' shares concatenated in
    rank order are the one-process batch, row for row. Returns (this rank's row indices into ``batch``, in group
    order and, within a group, in batch order; the number of kept groups; whether this rank got none). A rank
    that gets none (fewer kept groups than ranks) is given the first kept group's rows, for passes of weight 0
    that keep the ranks' collectives in step; none at all when no group is kept."""
    kept, found = first_informative_groups(batch, keep, limit)
    rows = kept.nonzero().squeeze(-1)
    rows = rows[batch.group_ids[rows].sort(stable=True).indices]
    groups = group_rank(batch.group_ids[rows])  # 0 .. found - 1, in draw order
    mine = share(found, rank, size)
    empty = mine.start == mine.stop
    if empty:
        mine = slice(0, min(found, 1))
    return rows[(groups >= mine.start) & (groups < mine.stop)], found, empty and found > 0
