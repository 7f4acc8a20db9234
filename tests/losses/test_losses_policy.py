"""PolicyLoss: KL wiring, metrics, masking properties, all-zero masks, and config instantiation."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lit_credit.losses import (
    AGGREGATION_MODES,
    ClippedSurrogate,
    GSPOSurrogate,
    PolicyLoss,
    ReinforceSurrogate,
    Surrogate,
    aggregate,
)

F64 = torch.float64
SURROGATES = [ClippedSurrogate(0.2), ClippedSurrogate(0.2, 0.28), GSPOSurrogate(0.2),
              ClippedSurrogate(0.2, 0.28, clip_ratio_c=3.0), GSPOSurrogate(0.2, clip_ratio_c=3.0)]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def test_grpo_loss_with_k3_by_hand() -> None:
    # logp = old (r = 1), A = +1 on 2 tokens -> surrogate -1 per token.
    # logp = -1, ref = -2 -> k3 = e^-1 = 0.36788 per token; kl_coef 0.1.
    # token-mean: total = -1 + 0.1 * 0.36788 = -0.963212.
    logp = torch.full((1, 2), -1.0, dtype=F64, requires_grad=True)
    ref = torch.full((1, 2), -2.0, dtype=F64)
    adv = torch.ones(1, 2, dtype=F64)
    mask = torch.ones(1, 2)
    loss, metrics = PolicyLoss(ClippedSurrogate(0.2), kl_coef=0.1)(logp, logp.detach(), adv, mask, ref)
    assert loss.item() == pytest.approx(-1 + 0.1 * math.exp(-1))
    assert metrics["loss/total"] == pytest.approx(loss.item())
    assert metrics["loss/policy"] == pytest.approx(-1.0)
    assert metrics["loss/kl"] == pytest.approx(math.exp(-1))
    assert metrics["loss/clip_frac"] == 0.0
    assert metrics["loss/ratio_mean"] == pytest.approx(1.0)
    assert all(type(v) is float for v in metrics.values())
    # gradient per token / 2 tokens: d(-r A)/d logp = -1; d k3/d logp = d(e^d - d - 1)/d logp with
    # d = ref - logp -> -(e^d - 1) = 1 - e^-1. Total (-1 + 0.1 (1 - e^-1)) / 2.
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.full((1, 2), (-1 + 0.1 * (1 - math.exp(-1))) / 2, dtype=F64))


def test_kl_coef_needs_ref_logp() -> None:
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="ref_logp"):
        PolicyLoss(ClippedSurrogate(), kl_coef=0.01)(x, x, x, torch.ones(1, 2))


def test_kl_is_logged_but_not_added_when_coef_zero() -> None:
    logp = torch.full((1, 3), -1.0, requires_grad=True)
    ref = torch.full((1, 3), -2.0)
    adv = torch.tensor([[1.0, 2.0, 3.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss_fn = PolicyLoss(ClippedSurrogate())
    loss, metrics = loss_fn(logp, logp.detach(), adv, mask, ref_logp=ref)
    assert loss.item() == pytest.approx(-1.5)  # -(1 + 2) / 2, KL not added
    assert metrics["loss/kl"] == pytest.approx(math.exp(-1), rel=1e-6)
    _, metrics_no_ref = loss_fn(logp, logp.detach(), adv, mask)
    assert "loss/kl" not in metrics_no_ref


def test_drgrpo_aggregation_with_norm_length() -> None:
    # r = 1, A = 1: per-token loss -1. Row 0 has 3 tokens, row 1 has 1 -> token sums [-3, -1];
    # seq-mean-token-sum-norm with N = 8: ((-3 - 1) / 8) / 2 = -0.25.
    logp = torch.zeros(2, 4, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    loss_fn = PolicyLoss(ClippedSurrogate(), aggregation="seq-mean-token-sum-norm", norm_length=8)
    loss, metrics = loss_fn(logp, logp.detach(), torch.ones(2, 4), mask)
    assert loss.item() == pytest.approx(-0.25)
    assert metrics["loss/policy"] == pytest.approx(-0.25)


def test_constructor_validation() -> None:
    with pytest.raises(ValueError, match="token-mean"):
        PolicyLoss(ClippedSurrogate(), aggregation="mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k3"):
        PolicyLoss(ClippedSurrogate(), kl_estimator="k4")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        PolicyLoss(ClippedSurrogate(), kl_coef=-1.0)
    with pytest.raises(ValueError):
        PolicyLoss(ClippedSurrogate(), norm_length=0)
    with pytest.raises(ValueError, match=r"length_normalize=True .* needs aggregation='seq-mean-token-sum'"):
        PolicyLoss(ReinforceSurrogate(), aggregation="seq-mean-token-mean", length_normalize=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("surrogate", SURROGATES, ids=repr)
@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_all_zero_mask_is_finite_zero(device: str, surrogate: Surrogate, mode: str) -> None:
    logp = torch.tensor([[-1.0, float("-inf")], [float("nan"), 3.0]], device=device, requires_grad=True)
    old = torch.tensor([[-80.0, 0.0], [1.0, float("nan")]], device=device)
    adv = torch.tensor([[1.0, float("inf")], [-1.0, 2.0]], device=device)
    mask = torch.zeros(2, 2, device=device)
    loss, metrics = PolicyLoss(surrogate, mode, kl_coef=0.1)(logp, old, adv, mask, ref_logp=old)
    assert loss.item() == 0.0
    assert all(math.isfinite(v) for v in metrics.values())
    assert metrics["loss/clip_frac"] == 0.0 and metrics["loss/ratio_mean"] == 1.0
    loss.backward()
    assert torch.equal(logp.grad, torch.zeros_like(logp))


@st.composite
def batches(draw: st.DrawFn) -> dict:
    b, t = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    n = b * t

    def vec(lo: float, hi: float) -> torch.Tensor:
        vals = draw(st.lists(st.floats(lo, hi, allow_nan=False), min_size=n, max_size=n))
        return torch.tensor(vals, dtype=F64).reshape(b, t)

    mask = torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n))).reshape(b, t)
    return {
        "logp": vec(-20.0, 0.0),
        "old": vec(-20.0, 0.0),
        "ref": vec(-20.0, 0.0),
        "adv": vec(-5.0, 5.0),
        "mask": mask,
        "surrogate": draw(st.sampled_from(SURROGATES)),
        "mode": draw(st.sampled_from(AGGREGATION_MODES)),
        "kl_estimator": draw(st.sampled_from(["k1", "k2", "k3"])),
        "length_normalize": draw(st.booleans()),
    }


def _run(batch: dict, logp: torch.Tensor, old: torch.Tensor, ref: torch.Tensor, adv: torch.Tensor):
    normalize = batch["length_normalize"] and batch["mode"] == "seq-mean-token-sum"
    loss_fn = PolicyLoss(batch["surrogate"], batch["mode"], kl_coef=0.05, kl_estimator=batch["kl_estimator"],
                         length_normalize=normalize)
    leaf = logp.clone().requires_grad_(True)
    loss, metrics = loss_fn(leaf, old, adv, batch["mask"], ref_logp=ref)
    loss.backward()
    return loss.detach(), metrics, leaf.grad


@settings(max_examples=60, deadline=None)
@given(batches())
def test_finite_in_finite_out(batch: dict) -> None:
    loss, metrics, grad = _run(batch, batch["logp"], batch["old"], batch["ref"], batch["adv"])
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert all(math.isfinite(v) for v in metrics.values())


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from([float("nan"), float("-inf"), 1e6, -1e6, 7.0]))
def test_masked_positions_are_irrelevant(batch: dict, junk: float) -> None:
    # Overwrite every input at masked positions with junk: loss, metrics and the gradient on learnable
    # tokens are unchanged, and masked tokens get exactly zero gradient.
    off = ~batch["mask"]

    def spoil(x: torch.Tensor) -> torch.Tensor:
        return torch.where(off, torch.full_like(x, junk), x)

    loss_a, metrics_a, grad_a = _run(batch, batch["logp"], batch["old"], batch["ref"], batch["adv"])
    loss_b, metrics_b, grad_b = _run(
        batch, spoil(batch["logp"]), spoil(batch["old"]), spoil(batch["ref"]), spoil(batch["adv"])
    )
    torch.testing.assert_close(loss_a, loss_b)
    assert metrics_a == pytest.approx(metrics_b)
    torch.testing.assert_close(grad_a, grad_b)
    assert torch.equal(grad_b[off], torch.zeros_like(grad_b[off]))


def test_aggregate_of_policy_matches_manual() -> None:
    # PolicyLoss = aggregate(surrogate + kl_coef * kl) for every mode.
    gen = torch.Generator().manual_seed(1)
    logp = -torch.rand(3, 5, generator=gen, dtype=F64)
    old = logp + 0.2 * torch.randn(3, 5, generator=gen, dtype=F64)
    ref = logp + 0.2 * torch.randn(3, 5, generator=gen, dtype=F64)
    adv = torch.randn(3, 5, generator=gen, dtype=F64)
    mask = torch.rand(3, 5, generator=gen) < 0.6
    for mode in AGGREGATION_MODES:
        surrogate = ClippedSurrogate(0.2, 0.28)
        per_token, _ = surrogate(logp, old, adv, mask)
        kl = torch.exp(ref - logp) - (ref - logp) - 1
        want = aggregate(per_token + 0.01 * kl, mask, mode)
        got, _ = PolicyLoss(surrogate, mode, kl_coef=0.01)(logp, old, adv, mask, ref)
        torch.testing.assert_close(got, want, msg=mode)


def test_length_normalize_divides_each_row_by_its_length() -> None:
    # Rows of 2, 1 and 0 learnable tokens, float mask weights 2 and 1 (the third row all masked), REINFORCE,
    # no KL: per-token loss -A logp = [1, 2 | 0.5 | -], row means 1.5 and 0.5, weighted
    # 2 * 1.5 + 1 * 0.5 = 3.5, over B = 3 rows -> 3.5 / 3 (seq-mean-token-mean would give (1.5 + 0.5) / 2: the
    # weights divided out, the empty row not counted). Summed instead: (2 * 3 + 0.5) / 3 = 6.5 / 3.
    logp = torch.tensor([[-1.0, -2.0], [-0.5, 9.0], [4.0, 4.0]], dtype=F64)
    adv = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]], dtype=F64)
    mask = torch.tensor([[2.0, 2.0], [1.0, 0.0], [0.0, 0.0]], dtype=F64)
    normalized = PolicyLoss(ReinforceSurrogate(), "seq-mean-token-sum", length_normalize=True)
    loss, metrics = normalized(logp, logp, adv, mask)
    assert loss.item() == pytest.approx(3.5 / 3) and metrics["loss/policy"] == pytest.approx(3.5 / 3)
    summed = PolicyLoss(ReinforceSurrogate(), "seq-mean-token-sum")(logp, logp, adv, mask)[0]
    assert summed.item() == pytest.approx(6.5 / 3)


def test_hydra_instantiate() -> None:
    hydra_utils = pytest.importorskip("hydra.utils")
    cfg = {
        "_target_": "lit_credit.losses.PolicyLoss",
        "surrogate": {"_target_": "lit_credit.losses.ClippedSurrogate", "clip_low": 0.2, "clip_high": 0.28},
        "aggregation": "token-mean",
        "kl_coef": 0.0,
    }
    loss_fn = hydra_utils.instantiate(cfg)
    assert isinstance(loss_fn, PolicyLoss) and isinstance(loss_fn.surrogate, ClippedSurrogate)
    assert loss_fn.surrogate.clip_high == 0.28


def test_jsonargparse_class_path() -> None:
    jsonargparse = pytest.importorskip("jsonargparse")
    parser = jsonargparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--loss", type=PolicyLoss)
    cfg = parser.parse_object(
        {
            "loss": {
                "class_path": "lit_credit.losses.PolicyLoss",
                "init_args": {
                    "surrogate": {
                        "class_path": "lit_credit.losses.GSPOSurrogate",
                        "init_args": {"clip_low": 0.1},
                    },
                    "aggregation": "seq-mean-token-mean",
                    "kl_coef": 0.001,
                },
            }
        }
    )
    loss_fn = parser.instantiate_classes(cfg).loss
    assert isinstance(loss_fn, PolicyLoss) and isinstance(loss_fn.surrogate, GSPOSurrogate)
    assert (loss_fn.aggregation, loss_fn.kl_coef, loss_fn.surrogate.clip_low) == (
        "seq-mean-token-mean",
        0.001,
        0.1,
    )
