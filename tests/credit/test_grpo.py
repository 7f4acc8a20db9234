"""GRPO / Dr.GRPO credit and the group statistics every estimator shares (docs/methods.md "Notation", §0)."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lit_credit.credit import DrGRPOCredit, GRPOCredit, group_normalize, group_stats, grpo_advantages

from .common import DEVICES, DTYPES, PROPS, TOL, ids, make_batch, ref_group_normalize, t

# --- hand-computed tables ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device", DEVICES)
def test_one_group_binary(dtype, device):
    # scores [1, 0, 1, 0], one group: mean 0.5, unbiased var = 4 * 0.25 / 3 = 1/3, std = 0.57735027
    # A = +-0.5 / (0.57735027 + 1e-6) = +-0.86602390
    out = group_normalize(t([1, 0, 1, 0], dtype).to(device), ids([5, 5, 5, 5]).to(device))
    a = 0.5 / (3**-0.5 + 1e-6)
    assert a == pytest.approx(0.8660239, abs=1e-7)
    assert out.dtype == dtype and out.device.type == device
    torch.testing.assert_close(out.cpu(), t([a, -a, a, -a], dtype), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_dr_grpo_only_centres(dtype):
    # norm_by_std=False: A = R - mean = [1, 0, 1, 0] - 0.5
    out = group_normalize(t([1, 0, 1, 0], dtype), ids([0, 0, 0, 0]), norm_by_std=False)
    torch.testing.assert_close(out, t([0.5, -0.5, 0.5, -0.5], dtype))


def test_interleaved_non_contiguous_ids():
    # ids [7, 3, 7, 3, 7], scores [1, 2, 3, 6, 5]
    # group 7 = {1, 3, 5}: mean 3, deviations [-2, 0, 2], var (4 + 0 + 4) / 2 = 4, std 2
    #   -> [-2, 0, 2] / (2 + 1e-6) = [-0.9999995, 0, 0.9999995]
    # group 3 = {2, 6}: mean 4, deviations [-2, 2], var (4 + 4) / 1 = 8, std 2.8284271
    #   -> [-2, 2] / (2.8284271 + 1e-6) = [-0.70710653, 0.70710653]
    out = group_normalize(t([1, 2, 3, 6, 5]), ids([7, 3, 7, 3, 7]))
    a, b = 2 / (2 + 1e-6), 2 / (8**0.5 + 1e-6)
    assert (a, b) == pytest.approx((0.9999995, 0.70710653), abs=1e-8)
    torch.testing.assert_close(out, t([-a, -b, 0, b, a]))


def test_singleton_groups_get_zero():
    # every group has one rollout: no baseline, A = 0 (not (R - R) / eps, not R / 1)
    assert group_normalize(t([3, -1, 2]), ids([0, 1, 2])).tolist() == [0, 0, 0]


def test_presence_guard():
    # one group [1, 2, 3]; present [T, F, F]: only 1 present -> the whole group gets 0
    out = group_normalize(t([1, 2, 3]), ids([0, 0, 0]), torch.tensor([True, False, False]))
    assert out.tolist() == [0, 0, 0]
    # present [T, T, F]: stats over {1, 2}: mean 1.5, std sqrt(0.5) = 0.70710678
    # -> -+0.5 / (0.70710678 + 1e-6) = -+0.70710578; the absent rollout gets 0 (its score 3 is ignored)
    out = group_normalize(t([1, 2, 3]), ids([0, 0, 0]), torch.tensor([1.0, 1.0, 0.0]))
    a = 0.5 / (0.5**0.5 + 1e-6)
    assert a == pytest.approx(0.70710578, abs=1e-8)
    torch.testing.assert_close(out, t([-a, a, 0]))


def test_constant_group_is_exactly_zero_in_float32():
    # mean of three 0.8f is not exactly 0.8f when summed naively; a naive (x - mean) / (std + 1e-6) then gives
    # a spurious ~0.06. Every equal-valued group must give exactly 0.
    out = group_normalize(t([0.8, 0.8, 0.8, 0.3, 0.3], torch.float32), ids([1, 1, 1, 2, 2]))
    assert out.tolist() == [0, 0, 0, 0, 0]


def test_group_stats_population_std():
    # pair [0, 1]: population std 0.5, unbiased std sqrt(0.5); counts 2
    centred, std, n = group_stats(t([0, 1]), ids([4, 4]), unbiased=False)
    assert centred.tolist() == [-0.5, 0.5] and std.tolist() == [0.5, 0.5] and n.tolist() == [2, 2]
    assert group_stats(t([0, 1]), ids([4, 4]))[1].tolist() == pytest.approx([0.5**0.5] * 2)


def test_grpo_advantages_tokens_parts_metrics():
    # two groups: {0, 1} scores [1, 0] -> A = +-0.5 / (0.70710678 + 1e-6) = +-0.70710578; {2, 3} scores [1, 1] -> 0
    scores, gids = t([1, 0, 1, 1]), ids([0, 0, 9, 9])
    mask = t([[0, 1, 1, 0], [0, 1, 0, 0], [1, 1, 0, 0], [0, 0, 0, 1]], torch.float32)
    out = grpo_advantages(scores, mask, gids)
    a = 0.5 / (0.5**0.5 + 1e-6)
    torch.testing.assert_close(out.parts["rollout"], t([a, -a, 0, 0]))
    torch.testing.assert_close(out.advantages, t([[0, a, a, 0], [0, -a, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]))
    # learnable token values: a, a, -a, 0, 0, 0 -> mean a/6, abs max a; group {2, 3} has zero variance
    assert out.metrics["credit/adv_mean"] == pytest.approx(a / 6)
    assert out.metrics["credit/adv_abs_max"] == pytest.approx(a)
    assert out.metrics["credit/zero_variance_group_frac"] == 0.5


def test_registered_classes_read_the_batch():
    batch = make_batch(torch.ones(4, 3), ids([0, 0, 0, 0]), t([1, 0, 1, 0], torch.float32))
    # GRPO: +-0.8660239 (see test_one_group_binary); Dr.GRPO: +-0.5
    torch.testing.assert_close(
        GRPOCredit()(batch).parts["rollout"], t([1, -1, 1, -1], torch.float32) * 0.8660239
    )
    torch.testing.assert_close(
        DrGRPOCredit()(batch).parts["rollout"], t([0.5, -0.5, 0.5, -0.5], torch.float32)
    )
    assert GRPOCredit(norm_by_std=False, eps=0.1).eps == 0.1


def test_population_std_option():
    # The DPA-GRPO paper's GRPO row: group of 2, population std. Group {0, 1} scores [1, 0]: mean 0.5, deviations
    # +-0.5, population var (0.25 + 0.25) / 2 = 0.25, std 0.5 -> A = +-0.5 / (0.5 + 1e-8) = +-(1 - 2e-8).
    # Group {2, 3, 4} scores [2, 0, 1]: mean 1, deviations [1, -1, 0], population var 2/3, std 0.81649658
    # -> A = [1, -1, 0] / (0.81649658 + 1e-8) = [1.22474486, -1.22474486, 0] (unbiased: var 1, std 1 -> +-1).
    batch = make_batch(torch.ones(5, 2), ids([0, 0, 3, 3, 3]), t([1, 0, 2, 0, 1], torch.float64))
    pop = GRPOCredit(unbiased=False, eps=1e-8)(batch).parts["rollout"]
    a, c = 0.5 / (0.5 + 1e-8), 1 / ((2 / 3) ** 0.5 + 1e-8)
    assert (a, c) == pytest.approx((0.99999998, 1.22474486), abs=1e-8)
    torch.testing.assert_close(pop, t([a, -a, c, -c, 0], torch.float64))
    # The default is unchanged: Bessel std sqrt(0.5) for the pair, 1 for the triple.
    b2, c2 = 0.5 / (0.5**0.5 + 1e-6), 1 / (1 + 1e-6)
    torch.testing.assert_close(GRPOCredit()(batch).parts["rollout"], t([b2, -b2, c2, -c2, 0], torch.float64))
    out = grpo_advantages(batch.scores, batch.response_mask, batch.group_ids, eps=1e-8, unbiased=False)
    torch.testing.assert_close(out.advantages, pop[:, None].expand(5, 2))


# --- loop reference vs vectorised ---------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_matches_loop_reference(seed, norm_by_std):
    g = torch.Generator().manual_seed(seed)
    B = 40
    scores = torch.rand(B, generator=g, dtype=torch.float64)
    gids = torch.randint(0, 12, (B,), generator=g) * 13 - 50  # negative, gappy ids
    present = torch.rand(B, generator=g) < 0.7
    for p in (None, present):
        out = group_normalize(scores, gids, p, norm_by_std=norm_by_std)
        torch.testing.assert_close(out, ref_group_normalize(scores, gids, p, norm_by_std=norm_by_std))


# --- properties ------------------------------------------------------------------------------------------


@st.composite
def grouped_scores(draw, max_b=10):
    """(scores on a 1/4 grid: well-conditioned, group ids in 0..3, presence flags)."""
    b = draw(st.integers(1, max_b))
    scores = draw(st.lists(st.integers(0, 8), min_size=b, max_size=b))
    gids = draw(st.lists(st.integers(0, 3), min_size=b, max_size=b))
    present = draw(st.lists(st.booleans(), min_size=b, max_size=b))
    return [s / 4 for s in scores], gids, present


@pytest.mark.parametrize("dtype", DTYPES)
@PROPS
@given(data=grouped_scores(), seed=st.integers(0, 2**16))
def test_property_permutation_equivariant(dtype, data, seed):
    scores, gids, present = t(data[0], dtype), ids(data[1]), torch.tensor(data[2])
    perm = torch.randperm(len(scores), generator=torch.Generator().manual_seed(seed))
    out = group_normalize(scores, gids, present)
    torch.testing.assert_close(
        group_normalize(scores[perm], gids[perm], present[perm]), out[perm], **TOL[dtype]
    )


@pytest.mark.parametrize("dtype", DTYPES)
@PROPS
@given(
    data=grouped_scores(), labels=st.lists(st.integers(-(2**40), 2**40), min_size=4, max_size=4, unique=True)
)
def test_property_relabelled_groups(dtype, data, labels):
    scores, gids, present = t(data[0], dtype), ids(data[1]), torch.tensor(data[2])
    relabelled = torch.tensor(labels)[gids]
    torch.testing.assert_close(
        group_normalize(scores, relabelled, present), group_normalize(scores, gids, present)
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_by_std", [True, False])
@PROPS
@given(data=grouped_scores(), shift=st.lists(st.floats(-10, 10), min_size=4, max_size=4))
def test_property_group_constant_shift(dtype, norm_by_std, data, shift):
    scores, gids, present = t(data[0], dtype), ids(data[1]), torch.tensor(data[2])
    shifted = scores + t(shift, dtype)[gids]
    torch.testing.assert_close(
        group_normalize(shifted, gids, present, norm_by_std=norm_by_std),
        group_normalize(scores, gids, present, norm_by_std=norm_by_std),
        rtol=1e-4 if dtype == torch.float32 else 1e-9,
        atol=1e-4 if dtype == torch.float32 else 1e-9,
    )


@st.composite
def token_batch(draw):
    scores, gids, _ = draw(grouped_scores())
    b = len(scores)
    n_tok = draw(st.integers(1, 6))
    mask = draw(st.lists(st.lists(st.booleans(), min_size=n_tok, max_size=n_tok), min_size=b, max_size=b))
    return scores, gids, mask


@pytest.mark.parametrize("dtype", DTYPES)
@PROPS
@given(data=token_batch(), where=st.lists(st.integers(0, 6), min_size=1, max_size=3))
def test_property_masked_tokens_zero_and_inserted_columns_change_nothing(dtype, data, where):
    scores, gids, mask = t(data[0], dtype), ids(data[1]), torch.tensor(data[2], dtype=torch.float32)
    out = grpo_advantages(scores, mask, gids).advantages
    assert out.shape == mask.shape and out.dtype == dtype
    assert (out[mask == 0] == 0).all()
    # insert all-zero (environment-injected) columns: the other tokens keep their advantages, new ones get 0
    keep = torch.ones(mask.shape[1], dtype=torch.bool)
    for w in sorted(where, reverse=True):
        w = min(w, mask.shape[1])
        mask = torch.cat([mask[:, :w], torch.zeros(len(mask), 1), mask[:, w:]], 1)
        keep = torch.cat([keep[:w], torch.tensor([False]), keep[w:]])
    wider = grpo_advantages(scores, mask, gids).advantages
    assert torch.equal(wider[:, keep], out) and (wider[:, ~keep] == 0).all()


def test_empty_batch():
    out = grpo_advantages(t([]), torch.zeros(0, 3), ids([]))
    assert out.advantages.shape == (0, 3) and out.metrics["credit/adv_mean"] == 0.0
    assert not math.isnan(out.metrics["credit/zero_variance_group_frac"])


# --- DAPO's soft overlong punishment ------------------------------------------------------------------------


def test_overlong_penalty_by_hand():
    # R_len = 0 for |y| <= L_max - L_cache, ((L_max - L_cache) - |y|) / L_cache up to L_max, -1 beyond.
    # L_max = 10, L_cache = round(0.2 * 10) = 2: 8 tokens 0, 9 tokens (8 - 9) / 2 = -0.5, 10 tokens -1, 11 -1.
    from lit_credit.credit import OverlongPenalty

    shaping = OverlongPenalty(max_len=10)
    assert shaping.cache == 2
    torch.testing.assert_close(shaping(ids([0, 8, 9, 10, 11])), torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]))
    # the paper's setting: L_max 20480, L_cache 4096 (= 0.2 * 20480): the penalty starts past 16384 tokens
    paper = OverlongPenalty(max_len=20480)
    assert paper.cache == 4096
    torch.testing.assert_close(paper(ids([16384, 18432, 20480])), torch.tensor([0.0, -0.5, -1.0]))
    # an explicit cache and factor; a tiny L_max keeps a 1-token cache
    torch.testing.assert_close(OverlongPenalty(max_len=8, cache=4, factor=0.5)(ids([5, 8])), torch.tensor([-0.125, -0.5]))
    assert OverlongPenalty(max_len=2).cache == 1
    with pytest.raises(ValueError, match=r"credit\.overlong\.cache=11: must be in \[1, max_len=10\]"):
        OverlongPenalty(max_len=10, cache=11)


def test_grpo_credit_shapes_the_scores_before_normalising():
    # One group of two, both right (score 1); lengths 8 and 10 with L_max 10, L_cache 2: penalties 0 and -1,
    # shaped [1, 0]: mean 0.5, unbiased std sqrt(0.5) -> A = +-0.5 / (0.70710678 + 1e-6). Unshaped: a tie, 0.
    from lit_credit.credit import OverlongPenalty

    mask = torch.zeros(2, 10)
    mask[0, :8], mask[1, :] = 1, 1
    batch = make_batch(mask, ids([0, 0]), t([1.0, 1.0], torch.float32))
    assert GRPOCredit()(batch).advantages.abs().sum() == 0
    out = GRPOCredit(overlong=OverlongPenalty(max_len=10))(batch)
    a = 0.5 / (0.5**0.5 + 1e-6)
    torch.testing.assert_close(out.parts["rollout"], torch.tensor([a, -a]))
    assert out.metrics["credit/overlong_frac"] == 0.5 and out.metrics["credit/overlong_penalty_mean"] == -0.5
    out = DrGRPOCredit(overlong=OverlongPenalty(max_len=10))(batch)  # Dr.GRPO: centred only
    torch.testing.assert_close(out.parts["rollout"], torch.tensor([0.5, -0.5]))


def test_overlong_shaping_is_on_in_the_dapo_experiments_only(make_cfg):
    from hydra.utils import instantiate

    from lit_credit.credit import OverlongPenalty

    for experiment, max_len in (("dapo_arith", 8), ("dapo_form", 10)):
        cfg = make_cfg(f"experiment={experiment}", fast_task=experiment == "dapo_arith")
        credit = instantiate(cfg.credit)
        assert isinstance(credit.overlong, OverlongPenalty), experiment
        assert (credit.overlong.max_len, credit.overlong.cache, credit.overlong.factor) == (max_len, 2, 1.0)
        assert cfg.data.sampling.max_new_tokens == max_len
    for experiment in ("grpo_arith", "grpo_form", "gspo_form"):
        cfg = make_cfg(f"experiment={experiment}", fast_task=experiment == "grpo_arith")
        assert "overlong" not in cfg.credit and instantiate(cfg.credit).overlong is None, experiment
    # composable with any GRPO run, and off again in a DAPO one
    cfg = make_cfg("loss=dapo", "method.dynamic_sampling=true", "credit/overlong=dapo", "data.sampling.max_new_tokens=20")
    assert instantiate(cfg.credit).overlong.cache == 4
    assert instantiate(make_cfg("experiment=dapo_arith", "~credit/overlong").credit).overlong is None
