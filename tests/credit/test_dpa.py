"""DPA paired counterfactual advantages (docs/methods.md §3): population std within each pair."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lit_credit.credit import DPACredit, dpa_pair_advantages

from .common import DTYPES, PROPS, TOL, make_batch, t


def ref_pairs(rewards, eps=1e-8):
    out = torch.zeros(rewards.shape, dtype=torch.float64)
    for n, (x, y) in enumerate(rewards.tolist()):
        mean = (x + y) / 2
        std = (((x - mean) ** 2 + (y - mean) ** 2) / 2) ** 0.5
        out[n] = torch.tensor([(x - mean) / (std + eps), (y - mean) / (std + eps)])
    return out


@pytest.mark.parametrize("dtype", DTYPES)
def test_hand_table(dtype):
    # [1, 0]: mean 0.5, population std 0.5 -> +-0.5 / (0.5 + 1e-8) = +-0.99999998
    # [1, -0.25] (a parsable vs an unparsable revision): mean 0.375, std 0.625 -> +-0.625 / (0.625 + 1e-8)
    # [0.5, 0.5]: a tie -> 0; [1.5, 1.2]: mean 1.35, std 0.15 -> +-0.15 / (0.15 + 1e-8)
    rewards = t([[1, 0], [0, 1], [1, -0.25], [0.5, 0.5], [1.5, 1.2]], dtype)
    a, b, c = 0.5 / (0.5 + 1e-8), 0.625 / (0.625 + 1e-8), 0.15 / (0.15 + 1e-8)
    want = t([[a, -a], [-a, a], [b, -b], [0, 0], [c, -c]], dtype)
    out = dpa_pair_advantages(rewards)
    assert out.dtype == dtype and out[3].tolist() == [0, 0]
    torch.testing.assert_close(out, want, **TOL[dtype])


def test_matches_loop_reference():
    rewards = torch.rand(50, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    rewards[::5, 1] = rewards[::5, 0]  # some ties
    torch.testing.assert_close(dpa_pair_advantages(rewards), ref_pairs(rewards))


@PROPS
@given(st.lists(st.tuples(st.integers(-1, 4), st.integers(-1, 4)), min_size=1, max_size=10))
def test_property_plus_minus_one_or_zero(pairs):
    rewards = t(pairs) / 4
    out = dpa_pair_advantages(rewards)
    torch.testing.assert_close(out.sum(1), torch.zeros(len(pairs), dtype=torch.float64))
    torch.testing.assert_close(
        out.abs(), (rewards[:, 0] != rewards[:, 1]).double()[:, None].expand_as(out), atol=1e-6, rtol=0
    )
    torch.testing.assert_close(dpa_pair_advantages(rewards.flip(1)), out.flip(1))


def test_registered_class_on_paired_sequences():
    # four action sequences = two decisions x {SAC, NS}; group_ids pair them
    scores = t([1, 0, 0, 0], torch.float32)
    mask = torch.tensor([[0, 1, 1], [0, 1, 0], [1, 1, 1], [0, 0, 1]], dtype=torch.float32)
    out = DPACredit()(make_batch(mask, torch.tensor([7, 7, 2, 2]), scores))
    pairs = dpa_pair_advantages(scores.view(2, 2)).view(4)
    torch.testing.assert_close(out.parts["rollout"], pairs)
    torch.testing.assert_close(out.advantages, pairs[:, None] * mask)
