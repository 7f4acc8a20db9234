"""Hand-computed KL estimator values and properties (lit_credit.losses.kl_penalty)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lit_credit.losses import KL_ESTIMATORS, kl_penalty

E = math.e

# (logp, ref_logp) -> (k1, k2, k3), with d = ref - logp:
# k1 = logp - ref = -d, k2 = 0.5 d^2, k3 = exp(d) - d - 1.
TABLE = [
    # d = -1: k1 = 1, k2 = 0.5, k3 = e^-1 + 1 - 1 = 0.36788
    ((-1.0, -2.0), (1.0, 0.5, math.exp(-1))),
    # d = +1: k1 = -1, k2 = 0.5, k3 = e - 1 - 1 = 0.71828
    ((-2.0, -1.0), (-1.0, 0.5, E - 2)),
    # d = 0: all estimators vanish
    ((-0.7, -0.7), (0.0, 0.0, 0.0)),
    # d = ln(0.5 / 0.25) = ln 2 (ref twice as likely): k1 = -ln 2, k2 = 0.5 ln^2 2, k3 = 2 - ln 2 - 1
    ((math.log(0.25), math.log(0.5)), (-math.log(2), 0.5 * math.log(2) ** 2, 1 - math.log(2))),
]


@pytest.mark.parametrize(("inputs", "expected"), TABLE)
def test_table(inputs: tuple[float, float], expected: tuple[float, float, float]) -> None:
    logp = torch.tensor([[inputs[0]]], dtype=torch.float64)
    ref = torch.tensor([[inputs[1]]], dtype=torch.float64)
    for name, want in zip(KL_ESTIMATORS, expected, strict=True):
        got = kl_penalty(logp, ref, name)
        assert got.shape == (1, 1)
        assert got.item() == pytest.approx(want, abs=1e-12), name


def test_default_is_k3() -> None:
    logp, ref = torch.tensor([[-1.0]]), torch.tensor([[-2.0]])
    assert kl_penalty(logp, ref).item() == pytest.approx(math.exp(-1), rel=1e-6)


def test_k1_and_k3_are_unbiased_on_a_categorical() -> None:
    # pi = [0.5, 0.5], ref = [0.25, 0.75]. KL(pi||ref) = 0.5 ln 2 + 0.5 ln(2/3).
    # E_pi[k1] = sum pi ln(pi/ref) = KL exactly; E_pi[k3] = sum pi (ref/pi - 1 - ln(ref/pi)) = 1 - 1 + KL.
    pi = torch.tensor([0.5, 0.5], dtype=torch.float64)
    ref = torch.tensor([0.25, 0.75], dtype=torch.float64)
    kl = 0.5 * math.log(2) + 0.5 * math.log(2 / 3)
    for name in ("k1", "k3"):
        per_token = kl_penalty(pi.log()[None], ref.log()[None], name)[0]
        assert (pi * per_token).sum().item() == pytest.approx(kl, abs=1e-12), name


@settings(max_examples=200, deadline=None)
@given(
    st.floats(-30.0, 0.0, allow_nan=False),
    st.floats(-30.0, 0.0, allow_nan=False),
)
def test_k2_k3_nonnegative_and_finite(logp: float, ref: float) -> None:
    a = torch.tensor([[logp]], dtype=torch.float32)
    b = torch.tensor([[ref]], dtype=torch.float32)
    for name in ("k2", "k3"):
        v = kl_penalty(a, b, name)
        assert torch.isfinite(v).all() and (v >= 0).all(), (name, logp, ref, v)


def test_unknown_estimator_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "low_var_kl")  # type: ignore[arg-type]


def test_shape_mismatch() -> None:
    with pytest.raises(ValueError):
        kl_penalty(torch.zeros(1, 2), torch.zeros(1, 3))
