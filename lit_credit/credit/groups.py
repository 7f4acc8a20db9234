"""Group bookkeeping on device: the draw-order rank of each rollout's group, the groups with a reward spread
(DAPO's dynamic sampling keeps these) and the first informative groups in draw order."""
from __future__ import annotations

import torch

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
