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


# verl's dual-clip, clip_ratio_c = c = 3 on top of PPO 0.2 / 0.2: where A < 0, loss = min(PPO loss, -c A),
# i.e. a negative-advantage token's loss is at most 3 |A|; where that bound binds the gradient is 0.
# columns: ratio r, advantage A, loss, gradient, dual clip binds?
DUAL = [
    (4.0, -1.0, 3.0, 0.0, True),  # PPO: -min(-4, -1.2) = 4 > 3 * 1 = 3 -> 3, gradient 0
    (2.0, -1.0, 2.0, 2.0, False),  # PPO: 2 < 3 -> 2, gradient -r A = 2
    (3.5, -0.5, 1.5, 0.0, True),  # PPO: -min(-1.75, -0.6) = 1.75 > 3 * 0.5 = 1.5 -> 1.5, gradient 0
    (5.0, +1.0, -1.2, 0.0, False),  # A > 0: never dual-clipped; PPO's high clip: -min(5, 1.2) = -1.2
    (0.5, -1.0, 0.8, 0.0, False),  # PPO's low clip: -min(-0.5, -0.8) = 0.8 < 3 -> 0.8, gradient 0
    (1.0, -2.0, 2.0, 2.0, False),  # PPO: 2 < 3 * 2 = 6 -> 2, gradient -r A = 2
]
# DAPO's clip-higher 0.2 / 0.28 goes through the same code: the range is [0.8, 1.28], the bound the same.
DUAL_CLIP_HIGHER = [
    (3.2, -1.0, 3.0, 0.0, True),  # PPO: -min(-3.2, -1.28) = 3.2 > 3 -> 3, gradient 0
    (2.9, -1.0, 2.9, 2.9, False),  # PPO: 2.9 < 3 -> 2.9, gradient -r A = 2.9
    (1.3, +1.0, -1.28, 0.0, False),  # high clip at 1.28, no dual clip for A > 0
]


@pytest.mark.parametrize(
    ("surrogate", "table"),
    [
        (ClippedSurrogate(0.2, clip_ratio_c=3.0), DUAL),
        (ClippedSurrogate(0.2, 0.28, clip_ratio_c=3.0), DUAL_CLIP_HIGHER),
    ],
    ids=["symmetric", "clip-higher"],
)
def test_dual_clip_table(surrogate: ClippedSurrogate, table: list) -> None:
    ratios, advs, losses, grads, dual = map(list, zip(*table, strict=True))
    logp, old, adv = _tokens(ratios, advs)
    loss, metrics = surrogate(logp, old, adv, torch.ones_like(adv))
    torch.testing.assert_close(loss, torch.tensor([losses], dtype=F64))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([grads], dtype=F64))
    assert metrics["clip_frac_dual"].item() == pytest.approx(sum(dual) / len(table))


def test_dual_clip_by_hand_through_the_policy_loss_and_off_is_the_plain_clip() -> None:
    ratios, advs, *_ = map(list, zip(*DUAL, strict=True))
    logp, old, adv = _tokens(ratios, advs)
    mask = torch.ones_like(adv)
    # token-mean over the 6 tokens: (3 + 2 + 1.5 - 1.2 + 0.8 + 2) / 6 = 8.1 / 6 = 1.35
    loss, metrics = PolicyLoss(ClippedSurrogate(0.2, clip_ratio_c=3.0))(logp, old, adv, mask)
    assert loss.item() == pytest.approx(1.35)
    assert metrics["loss/clip_frac_dual"] == pytest.approx(2 / 6)  # tokens 0 and 2
    assert metrics["loss/clip_frac"] == pytest.approx(2 / 6)  # PPO's own clip: tokens 3 (high) and 4 (low)
    # off (null, the default): the PPO loss, (4 + 2 + 1.75 - 1.2 + 0.8 + 2) / 6 = 9.35 / 6, no dual metric
    loss, metrics = PolicyLoss(ClippedSurrogate(0.2, clip_ratio_c=None))(logp, old, adv, mask)
    assert loss.item() == pytest.approx(9.35 / 6)
    assert "loss/clip_frac_dual" not in metrics


def test_dual_clip_matches_verls_formula_and_off_is_the_previous_loss() -> None:
    # verl's compute_policy_loss: l1 = -A r, l2 = -A clip(r), c1 = max(l1, l2), l3 = -A c,
    # loss = where(A < 0, min(l3, c1), c1). Off, the loss is c1 (this project's loss before the option).
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(6, 9, generator=gen, dtype=F64) * 3
    old = logp + torch.randn(6, 9, generator=gen, dtype=F64)  # log-ratio spread 1: the bound binds at times
    adv = torch.randn(6, 9, generator=gen, dtype=F64)
    mask = torch.ones_like(adv)
    ratio = torch.exp(logp - old)
    c1 = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.28))
    verl = torch.where(adv < 0, torch.minimum(-adv * 3.0, c1), c1)
    off, off_metrics = ClippedSurrogate(0.2, 0.28)(logp, old, adv, mask)
    on, on_metrics = ClippedSurrogate(0.2, 0.28, clip_ratio_c=3.0)(logp, old, adv, mask)
    torch.testing.assert_close(off, c1)
    torch.testing.assert_close(on, verl)
    binds = (adv < 0) & (c1 > -adv * 3.0)
    assert 0 < binds.sum() < binds.numel()
    assert on_metrics["clip_frac_dual"].item() == pytest.approx(binds.double().mean().item())
    assert set(on_metrics) - set(off_metrics) == {"clip_frac_dual"}
    assert all(torch.equal(on_metrics[k], off_metrics[k]) for k in off_metrics)


def test_gspo_dual_clip_bounds_the_sequence_ratio() -> None:
    # Row 0: log-ratios [1.2, 1.2] -> s = e^1.2 = 3.32012 > 3, A = -1: PPO loss 3.32012 per token -> 3,
    #        gradient 0.
    # Row 1: log-ratios [0.3, 0.3] -> s = e^0.3 = 1.34986, A = -1: 1.34986 < 3, gradient s (-A) = 1.34986
    #        per token.
    logp = torch.tensor([[1.2, 1.2], [0.3, 0.3]], dtype=F64, requires_grad=True)
    adv = torch.full((2, 2), -1.0, dtype=F64)
    mask = torch.ones_like(adv)
    loss, metrics = GSPOSurrogate(0.2, clip_ratio_c=3.0)(logp, torch.zeros_like(adv), adv, mask)
    s1 = math.exp(0.3)
    torch.testing.assert_close(loss, torch.tensor([[3.0, 3.0], [s1, s1]], dtype=F64))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.0], [s1, s1]], dtype=F64))
    assert metrics["clip_frac_dual"].item() == pytest.approx(1 / 2)  # sequence level


@pytest.mark.parametrize("cls", [ClippedSurrogate, GSPOSurrogate])
def test_dual_clip_needs_c_above_one(cls: type) -> None:
    assert cls().clip_ratio_c is None and cls(clip_ratio_c=3).clip_ratio_c == 3.0
    for bad in (1.0, 0.5, -3.0):
        with pytest.raises(ValueError, match=r"clip_ratio_c must be > 1 \(verl's 3.0\) or None"):
            cls(clip_ratio_c=bad)
