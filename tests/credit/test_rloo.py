"""RLOO (the worked example of docs/extending.md): leave-one-out advantages by hand."""
from __future__ import annotations

import pytest
import torch

from lit_credit.credit import registry
from lit_credit.credit.rloo import RLOOCredit
from lit_credit.types import RolloutBatch


def batch(scores: list[float], groups: list[int]) -> RolloutBatch:
    b, t = len(scores), 3
    mask = torch.tensor([[0.0, 1.0, 1.0]] * b)
    return RolloutBatch(input_ids=torch.zeros(b, t, dtype=torch.long), attention_mask=torch.ones(b, t, dtype=torch.long),
                        response_mask=mask, turn_ids=torch.zeros(b, t, dtype=torch.long),
                        group_ids=torch.tensor(groups), behaviour_logprobs=torch.zeros(b, t),
                        scores=torch.tensor(scores, dtype=torch.float))


def test_rloo_leave_one_out_by_hand():
    # Group 0: R = (1, 0, 0, 1). For rollout 0 the others' mean is (0 + 0 + 1) / 3 = 1/3, so A_0 = 1 - 1/3 = 2/3;
    # rollout 1: others (1, 0, 1) mean 2/3, A_1 = -2/3. Group 1: R = (3, 1): A = 3 - 1 = 2 and 1 - 3 = -2.
    # Group 2 is a single rollout: 0.
    out = RLOOCredit()(batch([1, 0, 0, 1, 3, 1, 5], [0, 0, 0, 0, 1, 1, 2]))
    expected = torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 2.0, -2.0, 0.0])
    torch.testing.assert_close(out.parts["rollout"], expected)
    torch.testing.assert_close(out.advantages, expected[:, None] * torch.tensor([0.0, 1.0, 1.0]))


def test_rloo_is_registered_and_checks_its_input():
    assert registry.get("rloo") is RLOOCredit
    with pytest.raises(ValueError, match=r"batch.scores has 1 non-finite"):
        RLOOCredit()(batch([1.0, float("nan")], [0, 0]))
