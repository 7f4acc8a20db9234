"""Group bookkeeping on device: the draw-order rank of each rollout's group, the groups with a reward spread
(DAPO's dynamic sampling keeps these), the first informative groups in draw order and one rank's share of them."""
from __future__ import annotations

import torch

from lit_credit.distributed import share
from lit_credit.types import RolloutBatch


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
