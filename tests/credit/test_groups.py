"""Group bookkeeping of dynamic sampling (lit_credit.credit.groups), by hand."""
from __future__ import annotations

import torch

from lit_credit.credit.groups import first_informative_groups, nonzero_variance_groups
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
