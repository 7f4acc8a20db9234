"""Hand-computed tables for the four aggregation modes (lit_credit.losses.aggregate)."""

from __future__ import annotations

import math

import pytest
import torch

from lit_credit.losses import AGGREGATION_MODES, aggregate, masked_mean

NAN = float("nan")

# Ragged batch, B=3, T=4. Row 2 has no learnable token; masked entries hold garbage (NaN, inf, 100)
# that must never enter.
LOSS = torch.tensor(
    [
        [1.0, 2.0, 3.0, NAN],
        [5.0, float("inf"), 100.0, 100.0],
        [NAN, 10.0, 11.0, 12.0],
    ],
    dtype=torch.float64,
)
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
# Row sums S = [1+2+3, 5, 0] = [6, 5, 0]; token counts n = [3, 1, 0]; B = 3; T = 4.
EXPECTED = {
    # sum S / sum n = 11 / 4
    "token-mean": 11 / 4,
    # (1/B) sum S = 11 / 3 (the empty row counts in B)
    "seq-mean-token-sum": 11 / 3,
    # mean over non-empty rows of S_i / n_i = (6/3 + 5/1) / 2 = 3.5 (the empty row is left out)
    "seq-mean-token-mean": 3.5,
    # (1/B) sum S_i / T = (6/4 + 5/4 + 0) / 3 = 11 / 12
    "seq-mean-token-sum-norm": 11 / 12,
}


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_ragged_table(mode: str) -> None:
    got = aggregate(LOSS, MASK, mode)
    assert got.shape == ()
    assert got.item() == pytest.approx(EXPECTED[mode], abs=1e-12)


def test_modes_are_exactly_the_four() -> None:
    assert set(AGGREGATION_MODES) == set(EXPECTED)


def test_drgrpo_norm_length_overrides_T() -> None:
    # (6 + 5 + 0) / (3 rows * 10) = 11 / 30
    assert aggregate(LOSS, MASK, "seq-mean-token-sum-norm", norm_length=10).item() == pytest.approx(11 / 30)
    # norm_length is ignored by the other modes
    assert aggregate(LOSS, MASK, "token-mean", norm_length=10).item() == pytest.approx(11 / 4)


def test_without_empty_row() -> None:
    loss, mask = LOSS[:2], MASK[:2]
    # S = [6, 5], n = [3, 1], B = 2, T = 4
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(11 / 4)
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx(11 / 2)
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 5) / 2)
    assert aggregate(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(11 / 8)


def test_float_mask_weights_tokens() -> None:
    loss = torch.tensor([[1.0, 3.0]], dtype=torch.float64)
    mask = torch.tensor([[0.5, 1.0]], dtype=torch.float64)
    # (0.5*1 + 1*3) / (0.5 + 1) = 3.5 / 1.5
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(3.5 / 1.5)


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_all_zero_mask_gives_finite_zero_and_zero_grad(mode: str) -> None:
    loss = torch.tensor([[1.0, NAN], [float("inf"), -2.0]], dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(2, 2, dtype=torch.bool)
    out = aggregate(loss, mask, mode)
    assert math.isfinite(out.item()) and out.item() == 0.0
    out.backward()
    assert torch.equal(loss.grad, torch.zeros_like(loss))


def test_gradient_weights_per_mode() -> None:
    # d L / d l_{i,t} on a masked-in token: token-mean 1/sum n = 1/4; seq-mean-token-sum 1/B = 1/3;
    # seq-mean-token-mean 1/(|P| n_i) = [1/6, 1/2] for rows 0, 1; norm 1/(B T) = 1/12.
    expected = {
        "token-mean": [1 / 4, 1 / 4],
        "seq-mean-token-sum": [1 / 3, 1 / 3],
        "seq-mean-token-mean": [1 / 6, 1 / 2],
        "seq-mean-token-sum-norm": [1 / 12, 1 / 12],
    }
    for mode, (g_row0, g_row1) in expected.items():
        loss = torch.zeros(3, 4, dtype=torch.float64, requires_grad=True)
        aggregate(loss, MASK, mode).backward()
        want = torch.zeros(3, 4, dtype=torch.float64)
        want[0, :3] = g_row0
        want[1, 0] = g_row1
        torch.testing.assert_close(loss.grad, want, msg=mode)


def test_unknown_mode_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm"):
        aggregate(LOSS, MASK, "seq-sum")  # type: ignore[arg-type]


def test_bad_shapes_and_norm_length() -> None:
    with pytest.raises(ValueError):
        aggregate(LOSS, MASK[:, :3])
    with pytest.raises(ValueError):
        aggregate(LOSS[0], MASK[0])
    with pytest.raises(ValueError):
        aggregate(LOSS, MASK, "seq-mean-token-sum-norm", norm_length=0)


def test_masked_mean() -> None:
    x = torch.tensor([[1.0, NAN], [3.0, 5.0]])
    m = torch.tensor([[True, False], [True, True]])
    assert masked_mean(x, m).item() == pytest.approx(3.0)  # (1 + 3 + 5) / 3
    torch.testing.assert_close(masked_mean(x, m, dim=-1), torch.tensor([1.0, 4.0]))
    assert masked_mean(x, torch.zeros_like(m)).item() == 0.0
