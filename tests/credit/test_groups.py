"""Group bookkeeping of dynamic sampling (lit_credit.credit.groups), by hand."""
from __future__ import annotations

import torch

from lit_credit.credit.groups import (
    first_informative_groups,
    kept_share,
    member_index,
    nonzero_variance_groups,
)
from tests.credit.common import make_batch


def test_nonzero_variance_groups_hand_table():
    # groups 5: scores (1, 1) -> constant, dropped; 9: (0, 1) -> kept; 2: (0.5) singleton -> constant, dropped.
    batch = make_batch(torch.ones(5, 2), torch.tensor([5, 5, 9, 9, 2]), torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5]))
    assert nonzero_variance_groups(batch).tolist() == [False, False, True, True, False]


def test_nonzero_variance_groups_stays_on_the_batch_device():
    # The meta device has shapes but no data: any host sync or CPU scratch tensor would fail here.
    batch = make_batch(torch.ones(5, 2), torch.tensor([5, 5, 9, 9, 2]), torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5]))
    keep = nonzero_variance_groups(batch.to("meta"))
    assert keep.device.type == "meta" and keep.shape == (5,) and keep.dtype == torch.bool


def test_informative_groups_keeps_the_first_in_draw_order():
    # groups 3: (0, 1) spread; 1: (1, 1) none; 7: (0, 1) spread; 5: (1, 0) spread. Draw order is id order:
    # 1, 3, 5, 7 -> the informative ones in order 3, 5, 7; limit 2 keeps 3 and 5.
    batch = make_batch(torch.ones(8, 2), torch.tensor([3, 3, 1, 1, 7, 7, 5, 5]),
                       torch.tensor([0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0]))
    keep = nonzero_variance_groups(batch)
    assert keep.tolist() == [True, True, False, False, True, True, True, True]
    chosen, found = first_informative_groups(batch, keep, 2)
    assert found == 2 and chosen.tolist() == [True, True, False, False, False, False, True, True]
    assert first_informative_groups(batch, keep, 5)[1] == 3
    assert first_informative_groups(batch, torch.zeros(8, dtype=torch.bool), 2)[1] == 0


def test_kept_share_deals_the_kept_groups_out_in_draw_order_as_whole_groups():
    # Every rank's draws, gathered in rank order (rank 0's rows, then rank 1's): group ids 0, 2 | 1, 3 | 4, 5 with
    # spreads in 0, 1, 3, 5 (2 and 4 constant). Draw order is id order, so the first 3 informative are 0, 1, 3.
    ids = torch.tensor([0, 0, 2, 2, 1, 1, 3, 3, 4, 4, 5, 5])
    scores = torch.tensor([0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    batch = make_batch(torch.ones(12, 2), ids, scores)
    keep = nonzero_variance_groups(batch)
    # one process: the kept rows in group order (0 at rows 0-1, 1 at rows 4-5, 3 at rows 6-7)
    rows, found, empty = kept_share(batch, keep, 3, 0, 1)
    assert (rows.tolist(), found, empty) == ([0, 1, 4, 5, 6, 7], 3, False)
    # two ranks: share(3, r, 2) gives rank 0 groups 0-1 (ids 0, 1), rank 1 group 2 (id 3); concatenated in rank
    # order they are the one-process rows
    assert kept_share(batch, keep, 3, 0, 2)[0].tolist() == [0, 1, 4, 5]
    assert kept_share(batch, keep, 3, 1, 2)[0].tolist() == [6, 7]
    # fewer kept groups than ranks: rank 1 of 2 gets none and is handed group 0's rows for weight-0 passes
    assert kept_share(batch, keep, 1, 0, 2)[0].tolist() == [0, 1]
    rows, found, empty = kept_share(batch, keep, 1, 1, 2)
    assert (rows.tolist(), found, empty) == ([0, 1], 1, True)
    # nothing informative: no rows, and not a weight-0 rank (the step does not update at all)
    rows, found, empty = kept_share(batch, torch.zeros(12, dtype=torch.bool), 3, 1, 2)
    assert (rows.tolist(), found, empty) == ([], 0, False)


def test_member_index_counts_each_rollout_within_its_group_in_batch_order():
    # groups 7, 3, 7, 7, 3, 9 -> 7's rows 0, 2, 3 are its members 0, 1, 2; 3's rows 1, 4 are 0, 1; 9's row 5 is 0
    assert member_index(torch.tensor([7, 3, 7, 7, 3, 9])).tolist() == [0, 0, 1, 2, 1, 0]
