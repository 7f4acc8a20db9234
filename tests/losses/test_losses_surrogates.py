"""Hand-computed tables and gradient checks for ClippedSurrogate (PPO) and GSPOSurrogate."""

from __future__ import annotations

import math

import pytest
import torch

from lit_credit.losses import ClippedSurrogate, GSPOSurrogate, PolicyLoss

F64 = torch.float64


def _tokens(ratios: list[float], advs: list[float]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One row with the given per-token ratios: old_logp = 0, logp = ln r (leaf, requires grad)."""
    logp = torch.tensor([[math.log(r) for r in ratios]], dtype=F64, requires_grad=True)
    old = torch.zeros_like(logp)
    adv = torch.tensor([advs], dtype=F64)
    return logp, old, adv


# PPO with clip 0.2 / 0.2. loss = -min(r A, clip(r, 0.8, 1.2) A); where unclipped, d loss / d logp = -r A.
# columns: ratio r, advantage A, loss, gradient, clip binds?
SYMMETRIC = [
    (1.5, +1.0, -1.2, 0.0, True),  # min(1.5, 1.2) = 1.2 -> clipped branch, gradient 0
    (0.5, +1.0, -0.5, -0.5, False),  # min(0.5, 0.8) = 0.5 -> unclipped, grad -r A = -0.5
    (1.5, -1.0, 1.5, 1.5, False),  # min(-1.5, -1.2) = -1.5 -> unclipped (pessimistic), grad +1.5
    (0.5, -1.0, 0.8, 0.0, True),  # min(-0.5, -0.8) = -0.8 -> clipped at 1 - 0.2, gradient 0
    (1.1, +2.0, -2.2, -2.2, False),  # inside [0.8, 1.2]: both branches 2.2, grad -r A = -2.2
    (1.0, 0.0, 0.0, 0.0, False),  # A = 0: nothing to clip, no gradient
]
# DAPO clip-higher 0.2 / 0.28: the clip range is [0.8, 1.28].
CLIP_HIGHER = [
    (1.25, +1.0, -1.25, -1.25, False),  # 1.25 < 1.28 -> unclipped (0.2 / 0.2 would clip it to 1.2)
    (1.3, +1.0, -1.28, 0.0, True),  # min(1.3, 1.28) = 1.28 -> clipped, grad 0
    (0.75, -1.0, 0.8, 0.0, True),  # min(-0.75, -0.8) = -0.8 -> low side still 0.2, grad 0
    (0.85, -1.0, 0.85, 0.85, False),  # inside the range, grad -r A = +0.85
    (1.4, -1.0, 1.4, 1.4, False),  # min(-1.4, -1.28) = -1.4: the high clip never binds for A < 0
]


@pytest.mark.parametrize(
    ("surrogate", "table"),
    [(ClippedSurrogate(0.2), SYMMETRIC), (ClippedSurrogate(0.2, 0.28), CLIP_HIGHER)],
    ids=["symmetric", "clip-higher"],
)
def test_ppo_table(surrogate: ClippedSurrogate, table: list) -> None:
    ratios, advs, losses, grads, clipped = map(list, zip(*table, strict=True))
    logp, old, adv = _tokens(ratios, advs)
    mask = torch.ones_like(adv, dtype=torch.bool)
    loss, metrics = surrogate(logp, old, adv, mask)
    torch.testing.assert_close(loss, torch.tensor([losses], dtype=F64))
    loss.sum().backward()  # tokens are independent: the sum's gradient is each token's own
    torch.testing.assert_close(logp.grad, torch.tensor([grads], dtype=F64))
    assert metrics["clip_frac"].item() == pytest.approx(sum(clipped) / len(table))
    assert metrics["ratio_mean"].item() == pytest.approx(sum(ratios) / len(ratios))
    assert metrics["ratio_min"].item() == pytest.approx(min(ratios))
    assert metrics["ratio_max"].item() == pytest.approx(max(ratios))


def test_ppo_clip_frac_sides() -> None:
    ratios, advs, *_ = map(list, zip(*SYMMETRIC, strict=True))
    logp, old, adv = _tokens(ratios, advs)
    _, metrics = ClippedSurrogate(0.2)(logp, old, adv, torch.ones_like(adv))
    # one token clipped above (1.5, A=+1), one below (0.5, A=-1), out of 6
    assert metrics["clip_frac_high"].item() == pytest.approx(1 / 6)
    assert metrics["clip_frac_low"].item() == pytest.approx(1 / 6)
    # ppo_kl = mean(old - logp) = -mean(ln r)
    assert metrics["ppo_kl"].item() == pytest.approx(-sum(math.log(r) for r in ratios) / 6)


def test_ppo_masked_tokens_are_neutral() -> None:
    # Token 1 is masked: a huge ratio and NaN advantage there change neither loss nor clip stats.
    logp = torch.tensor([[0.0, 50.0, math.log(1.5)]], dtype=F64, requires_grad=True)
    old = torch.zeros_like(logp)
    adv = torch.tensor([[1.0, float("nan"), 1.0]], dtype=F64)
    mask = torch.tensor([[1, 0, 1]])
    loss, metrics = ClippedSurrogate(0.2)(logp, old, adv, mask)
    torch.testing.assert_close(loss, torch.tensor([[-1.0, 0.0, -1.2]], dtype=F64))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.0, 0.0, 0.0]], dtype=F64))
    assert metrics["clip_frac"].item() == pytest.approx(0.5)  # 1 of the 2 learnable tokens
    assert metrics["ratio_max"].item() == pytest.approx(1.5)


def test_gspo_sequence_ratio_and_clipping() -> None:
    # Row 0: log-ratios [0.3, -0.1, 0.1] (+ a masked 5.0) -> mean 0.1 -> s = e^0.1 = 1.10517 in [0.8, 1.2]:
    #        every token gets -s A = -1.10517 (A = +1).
    # Row 1: log-ratios [0.6, 0.3, 0.0] -> mean 0.3 -> s = e^0.3 = 1.34986 > 1.2 with A = +1 -> -1.2, grad 0.
    # Row 2: log-ratios [-0.3, -0.3, -0.3] -> s = e^-0.3 = 0.74082 < 0.8 with A = -1 -> +0.8, grad 0.
    # Row 3: no learnable token -> loss 0, not counted in the sequence metrics.
    logp = torch.tensor(
        [[0.3, -0.1, 0.1, 5.0], [0.6, 0.3, 0.0, 0.0], [-0.3, -0.3, -0.3, 0.0], [1.0, 2.0, 3.0, 4.0]],
        dtype=F64,
        requires_grad=True,
    )
    old = torch.zeros_like(logp)
    adv = torch.tensor([[1.0] * 4, [1.0] * 4, [-1.0] * 4, [1.0] * 4], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 0], [0, 0, 0, 0]])
    loss, metrics = GSPOSurrogate(0.2)(logp, old, adv, mask)
    s0 = math.exp(0.1)
    want = torch.tensor(
        [[-s0, -s0, -s0, 0.0], [-1.2, -1.2, -1.2, 0.0], [0.8, 0.8, 0.8, 0.0], [0.0] * 4], dtype=F64
    )
    torch.testing.assert_close(loss, want)
    loss.sum().backward()
    # Row 0 is unclipped: d(-s_{0,t} A)/d logp_t = -s0 per token (stop-gradient factor); rows 1, 2 clipped.
    want_grad = torch.zeros(4, 4, dtype=F64)
    want_grad[0, :3] = -s0
    torch.testing.assert_close(logp.grad, want_grad)
    # sequence-level metrics over the 3 present rows: 2 clipped (1 high, 1 low)
    assert metrics["clip_frac"].item() == pytest.approx(2 / 3)
    assert metrics["clip_frac_high"].item() == pytest.approx(1 / 3)
    assert metrics["clip_frac_low"].item() == pytest.approx(1 / 3)
    assert metrics["ratio_mean"].item() == pytest.approx((s0 + math.exp(0.3) + math.exp(-0.3)) / 3)


def test_gspo_gradient_at_ratio_one_is_A_over_length() -> None:
    # At logp = old, s_i = 1. GSPO objective J = s_i A with s_i = exp(mean_t (logp_t - old_t)), so
    # dJ/d logp_t = s_i A / |y_i| = A / |y_i|. Here A = 2, |y| = 3 -> the loss (= -J) has gradient -2/3 on
    # each learnable token and 0 on the masked ones. seq-mean-token-mean with B = 1 is exactly J's mean.
    logp = torch.tensor([[-0.5, -1.5, -2.0, -0.1, -3.0]], dtype=F64, requires_grad=True)
    old = logp.detach().clone()
    adv = torch.full_like(old, 2.0)
    mask = torch.tensor([[1, 0, 1, 1, 0]])
    loss, _ = PolicyLoss(GSPOSurrogate(0.2), aggregation="seq-mean-token-mean")(logp, old, adv, mask)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-2 / 3, 0.0, -2 / 3, -2 / 3, 0.0]], dtype=F64))


def test_gspo_matches_sequence_level_reference_loop() -> None:
    # Loop reference: GSPO's sequence objective, J = (1/G) sum_i min(s_i A_i, clip(s_i) A_i), with s_i
    # differentiated directly (no stop-gradient). The vectorised token form with seq-mean-token-mean must
    # give the same value and the same gradient.
    gen = torch.Generator().manual_seed(0)
    B, T = 5, 7
    logp = (-torch.rand(B, T, generator=gen, dtype=F64) * 3).requires_grad_(True)
    old = logp.detach() + 0.3 * torch.randn(B, T, generator=gen, dtype=F64)
    mask = torch.rand(B, T, generator=gen) < 0.7
    mask[:, 0] = True
    adv_seq = torch.randn(B, generator=gen, dtype=F64)
    adv = adv_seq[:, None].expand(B, T).clone()
    surrogate = GSPOSurrogate(0.1, 0.15)
    loss, _ = PolicyLoss(surrogate, aggregation="seq-mean-token-mean")(logp, old, adv, mask)
    (grad,) = torch.autograd.grad(loss, logp)

    logp_ref = logp.detach().clone().requires_grad_(True)
    terms = []
    for i in range(B):
        m = mask[i]
        s = torch.exp((logp_ref[i][m] - old[i][m]).mean())
        a = adv_seq[i]
        terms.append(-torch.minimum(s * a, s.clamp(0.9, 1.15) * a))
    ref_loss = torch.stack(terms).mean()
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad, logp_ref.grad)


def test_ppo_gradient_at_ratio_one_is_minus_A() -> None:
    # r = 1: d(-r A)/d logp_t = -A_t; token-mean over 4 learnable tokens divides by 4.
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.2, -9.0]], dtype=F64, requires_grad=True)
    adv = torch.tensor([[1.0, -2.0, 3.0], [0.5, 4.0, 7.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    loss, _ = PolicyLoss(ClippedSurrogate())(logp, logp.detach(), adv, mask)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.0, 2.0, 0.0], [-0.5, -4.0, 0.0]], dtype=F64) / 4)


@pytest.mark.parametrize("cls", [ClippedSurrogate, GSPOSurrogate])
def test_constructor_validation(cls: type) -> None:
    s = cls()
    assert (s.clip_low, s.clip_high) == (0.2, 0.2)
    assert (cls(0.2, 0.28).clip_low, cls(0.2, 0.28).clip_high) == (0.2, 0.28)
    with pytest.raises(ValueError):
        cls(clip_low=1.5)
    with pytest.raises(ValueError):
        cls(clip_low=0.2, clip_high=-0.1)
    with pytest.raises(ValueError):
        cls()(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 4))
