"""TCPO turn credit: retrospective, hindsight, counterfactual, presets, normalisation, turn types."""

import dataclasses
import math

import pytest
import torch
from hydra.utils import instantiate
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf

from lit_credit.credit import (
    SLCACredit,
    SLCATCPOCredit,
    TCPOCredit,
    available,
    counterfactual_credit,
    get,
    hindsight_credit,
    retrospective_credit,
    select_counterfactual_turns,
    tcpo_turn_advantages,
    turn_types,
    turns_to_tokens,
)
from lit_credit.credit.tcpo import PRESETS, TURN_TYPES, TCPOSettings
from lit_credit.train import CONF_DIR

from .common import (
    DEVICES,
    DTYPES,
    PROPS,
    TOL,
    build_runs,
    ids,
    make_batch,
    ref_group_normalize,
    run_layouts,
    t,
)

NAN = float("nan")
M = True  # reached
_ = False  # not reached

# One group of three rollouts, K = 3 (scores on unreached turns are junk that must be ignored):
#   A improves 0.2 -> 0.7 -> 1.0; B fails twice and stops early (reached 2 turns); C solves at once (1 turn).
GROUP_SCORES = [[0.2, 0.7, 1.0], [0.0, 0.0, 9.0], [1.0, -7.0, 9.0]]
GROUP_MASK = [[M, M, M], [M, M, _], [M, _, _]]


def bools(rows):
    return torch.tensor(rows, dtype=torch.bool)


# --- loop references -------------------------------------------------------------------------------------


def ref_retro(scores, mask, tau=1.0, mu=0.1, rho=1.0, r0=0.0):
    out = torch.zeros(scores.shape, dtype=torch.float64)
    for i in range(scores.shape[0]):
        seen = []
        for k in range(scores.shape[1]):
            if not mask[i, k]:
                continue
            r = float(scores[i, k])
            m = max(seen) if seen else r0
            solved = m >= tau
            out[i, k] = max(r - m, 0) + mu * (solved and r >= tau) - rho * solved * max(m - r, 0)
            seen.append(r)
    return out


def ref_hind(scores, mask, gids):
    b, n_turns = scores.shape
    future = torch.zeros(b, n_turns, dtype=torch.float64)
    for i in range(b):
        for k in range(n_turns):
            if mask[i, k]:
                future[i, k] = max(float(scores[i, t]) for t in range(k, n_turns) if mask[i, t])
    out = torch.zeros(b, n_turns, dtype=torch.float64)
    for k in range(n_turns):
        out[:, k] = ref_group_normalize(future[:, k], gids, mask[:, k], norm_by_std=False)
    return out


def ref_tcpo(scores, mask, gids, alt, w=(1.0, 1.0, 1.0), eps=1e-6):
    """Preset tcpo, normalize std: c = w . (retro, hind, cf), then c / (std of the group's reached c + eps)."""
    retro, hind = ref_retro(scores, mask), ref_hind(scores, mask, gids)
    b, n_turns = scores.shape
    c = torch.zeros(b, n_turns, dtype=torch.float64)
    for i in range(b):
        for k in range(n_turns):
            alts = [float(a) for a in alt[i, k] if not math.isnan(a)]
            cf = float(scores[i, k]) - sum(alts) / len(alts) if alts else 0.0
            c[i, k] = w[0] * retro[i, k] + w[1] * hind[i, k] + w[2] * cf
    out = torch.zeros(b, n_turns, dtype=torch.float64)
    for g in set(gids.tolist()):
        cells = [(i, k) for i in range(b) for k in range(n_turns) if gids[i] == g and mask[i, k]]
        if len(cells) < 2:
            continue
        std = torch.tensor([float(c[i, k]) for i, k in cells], dtype=torch.float64).std().item()
        for i, k in cells:
            out[i, k] = c[i, k] / (std + eps)
    return out


def ref_select(surprisal, mask, gids, top_l):
    out = torch.zeros(mask.shape, dtype=torch.bool)
    for g in set(gids.tolist()):
        cells = [
            (i, k) for i in range(mask.shape[0]) for k in range(mask.shape[1]) if gids[i] == g and mask[i, k]
        ]
        cells.sort(key=lambda ik: -float(surprisal[ik]))  # stable: ties keep (rollout, turn) order
        for i, k in cells[:top_l]:
            out[i, k] = True
    return out


# --- hand-computed tables ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_retrospective_table(dtype):
    # tau 1, mu 0.1, rho 1, r0 0. m = best score before the turn (r0 for the first).
    rows = [
        [0.2, 0.7, 1.0],  # improvement: m [0, 0.2, 0.7] -> gains [0.2, 0.5, 0.3]
        [1.0, 1.0, 1.0],  # maintenance: m [0, 1, 1] -> [1, 0 + mu, 0 + mu] = [1, 0.1, 0.1]
        [1.0, 0.4, 1.0],  # regression after success: m [0, 1, 1] -> [1, -rho * 0.6, mu] = [1, -0.6, 0.1]
        [0.5, 0.3, 0.6],  # drop before any success is free: m [0, 0.5, 0.5] -> [0.5, 0, 0.1]
        [0.5, 9.0, 9.0],  # turns not reached -> 0
    ]
    mask = bools([[M, M, M]] * 4 + [[M, _, _]])
    out = retrospective_credit(t(rows, dtype), mask)
    want = [[0.2, 0.5, 0.3], [1, 0.1, 0.1], [1, -0.6, 0.1], [0.5, 0, 0.1], [0.5, 0, 0]]
    torch.testing.assert_close(out, t(want, dtype), **TOL[dtype])


def test_retrospective_r0_and_weights():
    # r0 0.5 is the first turn's reference only: m [0.5, 0.2] -> [[0.2 - 0.5]_+, 0.7 - 0.2] = [0, 0.5]
    out = retrospective_credit(t([[0.2, 0.7]]), bools([[M, M]]), r0=0.5)
    torch.testing.assert_close(out, t([[0.0, 0.5]]))
    # tau 0.5, mu 0.3, rho 2: [0.6, 0.6, 0.2] m [0, 0.6, 0.6] -> [0.6, mu, -rho * 0.4] = [0.6, 0.3, -0.8]
    out = retrospective_credit(t([[0.6, 0.6, 0.2]]), bools([[M, M, M]]), tau=0.5, mu=0.3, rho=2.0)
    torch.testing.assert_close(out, t([[0.6, 0.3, -0.8]]))


def test_hindsight_table():
    # H = best score from the turn on: A [1, 1, 1], B [0, 0, -], C [1, -, -]
    # turn 0, reached by all: mean H = 2/3 -> [1/3, -2/3, 1/3]
    # turn 1, reached by A and B: mean 0.5 -> [0.5, -0.5, 0]
    # turn 2, reached by A only: presence guard -> 0
    out = hindsight_credit(t(GROUP_SCORES), bools(GROUP_MASK), ids([4, 4, 4]))
    torch.testing.assert_close(out, t([[1 / 3, 0.5, 0], [-2 / 3, -0.5, 0], [1 / 3, 0, 0]]))


def test_counterfactual():
    # turn 0: r 1, alternatives [0, 1, NaN] -> mean 0.5 -> cf 0.5; turn 1: nothing sampled -> 0
    scores, alt = t([[1.0, 0.5]]), t([[[0, 1, NAN], [NAN, NAN, NAN]]])
    torch.testing.assert_close(counterfactual_credit(scores, alt), t([[0.5, 0.0]]))
    torch.testing.assert_close(counterfactual_credit(scores, alt, bools([[_, M]])), t([[0.0, 0.0]]))


def test_select_counterfactual_turns():
    # groups: {0, 1} and {2}; top_l 2 per group over reached turns.
    # group 0 reached cells: (0,0) 3, (0,1) 1, (0,2) 2, (1,0) 5, (1,1) 0 [(1,2) not reached, surprisal 99 ignored]
    #   -> top 2: (1,0) 5, (0,0) 3. group 1: (2,0) 4, (2,1) 9, (2,2) 9 -> (2,1), (2,2)
    surprisal = t([[3, 1, 2], [5, 0, 99], [4, 9, 9]])
    mask, gids = bools([[M, M, M], [M, M, _], [M, M, M]]), ids([10, 10, 3])
    out = select_counterfactual_turns(surprisal, mask, gids, top_l=2)
    assert out.tolist() == [[M, _, _], [M, _, _], [_, M, M]]
    assert torch.equal(select_counterfactual_turns(surprisal, mask, gids, mode="all"), mask)
    # random: ranked by the noise given, like surprisal; group 0's top 2 by noise are (1,1) .9 and (0,2) .8
    noise = t([[0.1, 0.2, 0.8], [0.3, 0.9, 1.0], [0.5, 0.4, 0.7]])
    rnd = select_counterfactual_turns(surprisal, mask, gids, top_l=2, mode="random", noise=noise)
    assert rnd.tolist() == [[_, _, M], [_, M, _], [M, _, M]]
    with pytest.raises(ValueError, match="needs noise of shape"):
        select_counterfactual_turns(surprisal, mask, gids, mode="random")
    with pytest.raises(ValueError, match="surprisal, random, all"):
        select_counterfactual_turns(surprisal, mask, gids, mode="best")


# Two rollouts, one group, both reach both turns: A fixes at turn 1 [0, 1]; B solves at once and keeps [1, 1].
PAIR = t([[0.0, 1.0], [1.0, 1.0]])
PAIR_MASK = bools([[M, M], [M, M]])


def test_presets_ladder_on_a_pair():
    def run(preset, **kw):
        return tcpo_turn_advantages(PAIR, PAIR_MASK, ids([0, 0]), TCPOSettings(preset=preset, **kw))

    # trajectory: final scores [1, 1] -> zero variance -> 0 everywhere
    torch.testing.assert_close(run("trajectory"), t([[0, 0], [0, 0]]))
    # turn: turn 0 [0, 1]: -+0.5 / (sqrt(0.5) + 1e-6) = -+0.70710578; turn 1 [1, 1] -> 0
    a = 0.5 / (0.5**0.5 + 1e-6)
    torch.testing.assert_close(run("turn"), t([[-a, 0], [a, 0]]))
    # diff: c = A [0 - 0, 1 - 0], B [1 - 0, 1 - 1] = [[0, 1], [1, 0]]; std over the 4 reached turns sqrt(1/3)
    #   -> c / (0.57735027 + 1e-6) = c * 1.73204781
    torch.testing.assert_close(run("diff"), t([[0, 1], [1, 0]]) / (3**-0.5 + 1e-6))
    # retro: A m [0, 0] -> [0, 1]; B m [0, 1] -> [1, 0 + mu] = [1, 0.1]. c {0, 1, 1, 0.1}: mean 0.525,
    #   var (0.525^2 + 0.475^2 + 0.475^2 + 0.425^2) / 3 = 0.9075 / 3 = 0.3025, std 0.55 -> c / (0.55 + 1e-6)
    retro = t([[0, 1], [1, 0.1]])
    torch.testing.assert_close(run("retro"), retro / (0.55 + 1e-6))
    # hindsight: H = [[1, 1], [1, 1]] -> 0, so retro_hindsight = tcpo (no alternatives) = retro
    torch.testing.assert_close(run("retro_hindsight"), retro / (0.55 + 1e-6))
    torch.testing.assert_close(run("tcpo"), retro / (0.55 + 1e-6))
    # normalize modes on retro: mean_std (c - 0.525) / (0.55 + 1e-6)
    torch.testing.assert_close(run("retro", normalize="mean_std"), (retro - 0.525) / (0.55 + 1e-6))
    # turn_mean_std: turn 0 [0, 1] -> -+0.70710578; turn 1 [1, 0.1]: +-0.45 / (sqrt(0.405) + 1e-6) = +-0.70710567
    b = 0.45 / (0.405**0.5 + 1e-6)
    torch.testing.assert_close(run("retro", normalize="turn_mean_std"), t([[-a, b], [a, -b]]))
    torch.testing.assert_close(run("retro", normalize="none"), retro)
    with pytest.raises(ValueError, match="retro_hindsight"):
        run("hindsight")
    with pytest.raises(ValueError, match="turn_mean_std"):
        run("retro", normalize="z")


def test_tcpo_full_on_the_group():
    # retro (see test_retrospective_table): A [0.2, 0.5, 0.3], B [0, 0, -], C [1, -, -]
    # hind (see test_hindsight_table):      A [1/3, 0.5, 0], B [-2/3, -0.5, -], C [1/3, -, -]
    # cf: A turn 0 alternatives [0, 0.4] -> 0.2 - 0.2 = 0; B turn 1 alternative [1] -> 0 - 1 = -1; w_cf 0.5
    # c: A [8/15, 1, 0.3], B [-2/3, -0.5 - 0.5, -], C [4/3, -, -]
    alt = torch.full((3, 3, 2), NAN, dtype=torch.float64)
    alt[0, 0] = t([0.0, 0.4])
    alt[1, 1, 0] = 1.0
    c = t([[8 / 15, 1, 0.3], [-2 / 3, -1.0, 0], [4 / 3, 0, 0]])
    args = (t(GROUP_SCORES), bools(GROUP_MASK), ids([1] * 3))
    torch.testing.assert_close(
        tcpo_turn_advantages(*args, TCPOSettings(w_cf=0.5, normalize="none"), alt_scores=alt), c
    )
    # std over the 6 reached turns: mean (8/15 + 1 + 0.3 - 2/3 - 1 + 4/3) / 6 = 1.5 / 6 = 0.25,
    #   sum of squares 0.28444 + 1 + 0.09 + 0.44444 + 1 + 1.77778 = 4.59667, var (4.59667 - 6 * 0.0625) / 5 = 0.84433
    var = (sum(x * x for x in (8 / 15, 1, 0.3, 2 / 3, 1, 4 / 3)) - 6 * 0.25**2) / 5
    assert var == pytest.approx(0.844333, abs=1e-6)
    out = tcpo_turn_advantages(*args, TCPOSettings(w_cf=0.5), alt_scores=alt)
    torch.testing.assert_close(out, c / (var**0.5 + 1e-6))
    assert out[0, 1] > 0 and out[1, 0] < 0  # improvements stay positive, failures negative (no centring)


def test_std_presence_guard_and_absent_turns():
    # a group with a single reached turn in total -> 0; the other group is normalised; unreached turns -> 0
    scores, mask = t([[1.0, 5.0], [0.3, 0.0], [0.9, 0.0]]), bools([[M, _], [M, _], [M, _]])
    out = tcpo_turn_advantages(scores, mask, ids([0, 1, 1]), TCPOSettings(preset="retro"))
    # group 1: retro [0.3, 0.9] (m = r0 = 0), std sqrt(0.3^2 + 0.3^2) = sqrt(0.18) = 0.42426407
    #   -> [0.3, 0.9] / (0.42426407 + 1e-6); group 0 (one reached turn) -> 0
    s = 0.18**0.5 + 1e-6
    torch.testing.assert_close(out, t([[0, 0], [0.3 / s, 0], [0.9 / s, 0]]))


def test_turns_to_tokens_and_types():
    values = t([[0.5, -1.0]])
    turn_ids = torch.tensor([[-1, 0, 0, -1, 1, 1, -1]])  # prompt, turn 0, feedback, turn 1, pad
    assert turns_to_tokens(values, turn_ids).tolist() == [[0, 0.5, 0.5, 0, -1, -1, 0]]
    # types with tau 1: [0.2 improve, 0.2 flat, 1 improve, 1 maintain, 0.4 regress, 0.7 regress (m = 1)]
    kinds = turn_types(t([[0.2, 0.2, 1.0, 1.0, 0.4, 0.7]]), bools([[M] * 6]))
    assert [TURN_TYPES[k] for k in kinds[0]] == [
        "improve",
        "flat",
        "improve",
        "maintain",
        "regress",
        "regress",
    ]
    assert turn_types(t([[0.5, 0.4]]), bools([[M, _]])).tolist() == [[1, -1]]


def _batch(scores, mask, gids, turn_ids, **extras):
    return make_batch(
        (turn_ids >= 0).float(),
        gids,
        scores.amax(1),
        turn_ids=turn_ids,
        extras=extras,
        turn_scores=scores,
        turn_mask=mask,
    )


def test_registered_class():
    turn_ids = torch.tensor([[-1, 0, -1, 1, 1], [-1, 0, -1, 1, -1]])
    batch = _batch(PAIR, PAIR_MASK, ids([0, 0]), turn_ids)
    out = TCPOCredit(preset="retro")(batch)
    a = t([[0, 1], [1, 0.1]]) / (0.55 + 1e-6)  # see test_presets_ladder_on_a_pair
    torch.testing.assert_close(out.parts["turn"], a)
    torch.testing.assert_close(out.advantages, turns_to_tokens(a, turn_ids))
    # types: A [flat (0 = r0), improve], B [improve, maintain]
    assert out.metrics["credit/turn_type/improve/frac"] == 0.5
    assert (
        out.metrics["credit/turn_type/flat/frac"] == 0.25
        and out.metrics["credit/turn_type/flat/adv_mean"] == 0
    )
    assert out.metrics["credit/turn_type/maintain/adv_mean"] == pytest.approx(0.1 / 0.55, abs=1e-5)
    assert out.metrics["credit/turn/1/adv_mean"] == pytest.approx(1.1 / 2 / 0.55, abs=1e-5)
    # alternatives come from batch.extras (an augmenter's), here of A's turn 0
    alt, chosen = t([[[0.0], [NAN]], [[NAN], [NAN]]]), bools([[M, _], [_, _]])
    with_cf = TCPOCredit(normalize="none")(_batch(PAIR, PAIR_MASK, ids([0, 0]), turn_ids, alt_scores=alt,
                                                  cf_mask=chosen))
    torch.testing.assert_close(with_cf.parts["turn"], t([[0, 1], [1, 0.1]]))  # cf of A turn 0 = 0 - 0 = 0
    alt[0, 0, 0] = -1.0
    with_cf = TCPOCredit(normalize="none")(_batch(PAIR, PAIR_MASK, ids([0, 0]), turn_ids, alt_scores=alt,
                                                  cf_mask=chosen))
    torch.testing.assert_close(with_cf.parts["turn"], t([[1, 1], [1, 0.1]]))  # cf = 0 - (-1) = 1
    masked = _batch(PAIR, PAIR_MASK, ids([0, 0]), turn_ids, alt_scores=alt, cf_mask=bools([[_, _], [_, _]]))
    torch.testing.assert_close(TCPOCredit(normalize="none")(masked).parts["turn"], t([[0, 1], [1, 0.1]]))
    with pytest.raises(ValueError, match=r"unknown credit\.preset 'nope'; valid: trajectory, turn, diff"):
        TCPOCredit(preset="nope")
    with pytest.raises(ValueError, match=r"unknown credit\.normalize 'z'; valid: std, mean_std"):
        TCPOSettings(normalize="z")


# --- loop reference vs vectorised ---------------------------------------------------------------------


def _random_turns(seed, b=20, n_turns=4):
    g = torch.Generator().manual_seed(seed)
    reached = torch.randint(0, n_turns + 1, (b,), generator=g)
    mask = torch.arange(n_turns)[None] < reached[:, None]
    scores = (torch.randint(0, 5, (b, n_turns), generator=g) / 4).double()  # ties and exact successes
    gids = torch.randint(0, 5, (b,), generator=g) * 3 + 100
    alt = torch.where(
        torch.rand(b, n_turns, 3, generator=g) < 0.5, torch.rand(b, n_turns, 3, generator=g), NAN
    )
    return scores.double(), mask, gids, alt.double(), g


@pytest.mark.parametrize("seed", range(5))
def test_matches_loop_reference(seed):
    scores, mask, gids, alt, g = _random_turns(seed)
    torch.testing.assert_close(retrospective_credit(scores, mask), ref_retro(scores, mask))
    torch.testing.assert_close(hindsight_credit(scores, mask, gids), ref_hind(scores, mask, gids))
    out = tcpo_turn_advantages(scores, mask, gids, TCPOSettings(w_hind=0.5, w_cf=2.0), alt_scores=alt)
    torch.testing.assert_close(out, ref_tcpo(scores, mask, gids, alt, w=(1.0, 0.5, 2.0)))
    surprisal = torch.randint(0, 4, scores.shape, generator=g).double()
    for top_l in (1, 3):
        assert torch.equal(
            select_counterfactual_turns(surprisal, mask, gids, top_l=top_l),
            ref_select(surprisal, mask, gids, top_l),
        )


@pytest.mark.parametrize("device", DEVICES)
def test_runs_on_device(device):
    scores, mask, gids, alt, _ = _random_turns(0)
    want = tcpo_turn_advantages(scores, mask, gids, alt_scores=alt)
    got = tcpo_turn_advantages(scores.to(device), mask.to(device), gids.to(device), alt_scores=alt.to(device))
    assert got.device.type == device
    torch.testing.assert_close(got.cpu(), want)


# --- properties ------------------------------------------------------------------------------------------


@st.composite
def turn_data(draw, max_b=8, max_k=4):
    b, k = draw(st.integers(1, max_b)), draw(st.integers(1, max_k))
    reached = draw(st.lists(st.integers(0, k), min_size=b, max_size=b))
    scores = draw(st.lists(st.lists(st.integers(0, 4), min_size=k, max_size=k), min_size=b, max_size=b))
    gids = draw(st.lists(st.integers(0, 2), min_size=b, max_size=b))
    mask = torch.arange(k)[None] < torch.tensor(reached)[:, None]
    return t(scores) / 4, mask, ids(gids)


@pytest.mark.parametrize("dtype", DTYPES)
@PROPS
@given(data=turn_data(), seed=st.integers(0, 2**16), labels=st.permutations([5, -2, 2**33]))
def test_property_permutation_relabelling_and_masking(dtype, data, seed, labels):
    scores, mask, gids = data
    scores = scores.to(dtype)
    perm = torch.randperm(len(gids), generator=torch.Generator().manual_seed(seed))
    for preset in PRESETS:
        settings = TCPOSettings(preset=preset)
        out = tcpo_turn_advantages(scores, mask, gids, settings)
        assert out.dtype == dtype and (out[~mask] == 0).all()
        torch.testing.assert_close(
            tcpo_turn_advantages(scores[perm], mask[perm], gids[perm], settings), out[perm]
        )
        torch.testing.assert_close(tcpo_turn_advantages(scores, mask, ids(labels)[gids], settings), out)


@PROPS
@given(data=turn_data())
def test_property_retro_sign_follows_turn_type(data):
    # with tau 1 and scores in [0, 1]: improvements and maintenance earn, regressions after success cost,
    # flat turns get nothing
    scores, mask, _ = data
    retro, kinds = retrospective_credit(scores, mask), turn_types(scores, mask)
    assert (retro[kinds == 1] > 0).all() and (retro[kinds == 2] > 0).all()
    assert (retro[kinds == 3] < 0).all() and (retro[kinds == 0] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@PROPS
@given(data=turn_data(), shift=st.lists(st.floats(-5, 5), min_size=3, max_size=3))
def test_property_group_shift_invariance(dtype, data, shift):
    # hindsight and the per-turn normalisation compare a rollout only with its group: a per-group constant
    # added to every score changes nothing
    scores, mask, gids = data
    scores, moved = scores.to(dtype), (scores + t(shift)[gids][:, None]).to(dtype)
    tol = dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(
        hindsight_credit(moved, mask, gids), hindsight_credit(scores, mask, gids), **tol
    )
    for preset in ("turn", "trajectory"):
        torch.testing.assert_close(
            tcpo_turn_advantages(moved, mask, gids, TCPOSettings(preset=preset)),
            tcpo_turn_advantages(scores, mask, gids, TCPOSettings(preset=preset)),
            **tol,
        )


@PROPS
@given(
    layout=run_layouts(),
    extra=st.lists(st.lists(st.integers(0, 3), min_size=3, max_size=3), min_size=8, max_size=8),
)
def test_property_longer_feedback_changes_nothing(layout, extra):
    # turn k = run k of learnable tokens; more feedback tokens between turns leave every turn token's value
    gids, rows = layout
    n_turns = 3
    mask = torch.tensor([[k < len(r) for k in range(n_turns)] for r in rows])
    scores = torch.linspace(0, 1, len(rows) * n_turns, dtype=torch.float64).view(len(rows), n_turns)
    adv = tcpo_turn_advantages(scores, mask, ids(gids))
    (_, run), (_, wider) = build_runs(rows), build_runs(rows, extra)
    out, more = turns_to_tokens(adv, run), turns_to_tokens(adv, wider)
    assert (
        torch.equal(more[wider >= 0], out[run >= 0])
        and (more[wider < 0] == 0).all()
        and (out[run < 0] == 0).all()
    )


# --- continue-after-success episodes (task.stop_on_success=false) -------------------------------------------
# One group of four 0/1 rollouts that all run K = 3 turns (tau = 1, mu = 0.1, rho = 1, r0 = 0):
#   KEPT [1, 1, 1] keeps its success; LOST [1, 0, 0] regresses after success and stays wrong;
#   FLIP [0, 1, 0] fixes then regresses; LATE [0, 0, 1] is solved at the last turn.
CONTINUE = [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
# The same problems with stop-at-success episodes: each ends at its first success (LOST's drop never happens).
STOPPED = [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
STOPPED_MASK = [[M, _, _], [M, _, _], [M, M, _], [M, M, M]]


def test_retro_equals_diff_when_episodes_stop_at_success():
    # Before the first success every 0/1 score is 0, so m = r_prev and [r - m]_+ = r - r_prev; no turn has
    # m >= tau, so mu and rho never act: retro == diff, the reason stop-at-success episodes cannot test TCPO.
    scores, mask, gids = t(STOPPED), bools(STOPPED_MASK), ids([0] * 4)
    retro = tcpo_turn_advantages(scores, mask, gids, TCPOSettings(preset="retro", normalize="none"))
    diff = tcpo_turn_advantages(scores, mask, gids, TCPOSettings(preset="diff", normalize="none"))
    torch.testing.assert_close(retro, diff)
    torch.testing.assert_close(retro, t([[1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]]))


def test_retro_differs_from_diff_by_the_mu_and_rho_terms_after_success():
    scores, mask, gids = t(CONTINUE), bools([[M] * 3] * 4), ids([0] * 4)
    retro = tcpo_turn_advantages(scores, mask, gids, TCPOSettings(preset="retro", normalize="none"))
    diff = tcpo_turn_advantages(scores, mask, gids, TCPOSettings(preset="diff", normalize="none"))
    # m = best before: KEPT [0, 1, 1], LOST [0, 1, 1], FLIP [0, 0, 1], LATE [0, 0, 0].
    # retro = [r - m]_+ + 0.1 * 1[m >= 1, r >= 1] - 1 * 1[m >= 1] * [m - r]_+:
    #   KEPT [1, 0 + 0.1, 0 + 0.1]; LOST [1, -1, -1]; FLIP [0, 1, -1]; LATE [0, 0, 1].
    torch.testing.assert_close(retro, t([[1, 0.1, 0.1], [1, -1, -1], [0, 1, -1], [0, 0, 1]]))
    # diff = r_k - r_{k-1}: KEPT [1, 0, 0]; LOST [1, -1, 0]; FLIP [0, 1, -1]; LATE [0, 0, 1].
    torch.testing.assert_close(diff, t([[1, 0, 0], [1, -1, 0], [0, 1, -1], [0, 0, 1]]))
    # retro - diff: the kept success earns mu twice; the lasting regression pays rho again at turn 3 (diff
    # only sees the drop once); a single drop after success (rho * 1 = -1) and a late fix agree.
    torch.testing.assert_close(retro - diff, t([[0, 0.1, 0.1], [0, 0, -1], [0, 0, 0], [0, 0, 0]]))
    # And retro minus its gain-only version (mu = rho = 0) is exactly the mu and rho terms.
    gain = retrospective_credit(scores, mask, mu=0.0, rho=0.0)
    torch.testing.assert_close(gain, t([[1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]]))
    torch.testing.assert_close(retro - gain, t([[0, 0.1, 0.1], [0, -1, -1], [0, 0, -1], [0, 0, 0]]))


def test_turn_type_shares_after_success():
    scores, mask = t(CONTINUE), bools([[M] * 3] * 4)
    # KEPT [improve, maintain, maintain]; LOST [improve, regress, regress]; FLIP [flat (0 = r0), improve,
    # regress]; LATE [flat, flat, improve] -> of 12 turns: improve 4, maintain 2, regress 3, flat 3.
    assert turn_types(scores, mask).tolist() == [[1, 2, 2], [1, 3, 3], [0, 1, 3], [0, 0, 1]]
    turn_ids = torch.tensor([[-1, 0, -1, 1, -1, 2]] * 4)
    out = TCPOCredit(preset="retro", normalize="none")(_batch(scores, mask, ids([0] * 4), turn_ids))
    m = out.metrics
    frac = {k: m[f"credit/turn_type/{k}/frac"] for k in TURN_TYPES}
    assert frac == pytest.approx({"improve": 4 / 12, "maintain": 2 / 12, "regress": 3 / 12, "flat": 3 / 12})
    # With normalize=none A = retro: maintain turns earn mu, regressions after success cost rho * 1.
    assert m["credit/turn_type/maintain/adv_mean"] == pytest.approx(0.1)
    assert m["credit/turn_type/regress/adv_mean"] == pytest.approx(-1.0)
    assert m["credit/turn_type/improve/adv_mean"] == pytest.approx(1.0)
    assert m["credit/turn_type/flat/adv_mean"] == 0.0
    # The stopped episodes of the same problems have no maintain or regress turn at all.
    stopped = TCPOCredit(preset="retro")(_batch(t(STOPPED), bools(STOPPED_MASK), ids([0] * 4), turn_ids)).metrics
    assert stopped["credit/turn_type/maintain/frac"] == stopped["credit/turn_type/regress/frac"] == 0.0


def test_needs_the_counterfactuals_only_when_they_count():
    # preset tcpo with w_cf != 0 reads alt_scores and cf_mask (an augmenter adds them); every other preset,
    # or w_cf = 0, reads none and ignores any given
    assert TCPOCredit().needs == {"alt_scores", "cf_mask"}
    assert TCPOCredit(w_cf=0.0).needs == TCPOCredit(preset="retro_hindsight").needs == frozenset()
    turn_ids = torch.tensor([[-1, 0, -1, 1, 1], [-1, 0, -1, 1, -1]])
    plain = _batch(PAIR, PAIR_MASK, ids([0, 0]), turn_ids)
    with pytest.raises(ValueError, match=r"credit=tcpo needs batch\.extras\['alt_scores'\], "
                                         r"batch\.extras\['cf_mask'\] \(batch\.extras has \[\]\); "
                                         r"fix: augment=counterfactual"):
        TCPOCredit()(plain)
    alt_only = _batch(PAIR, PAIR_MASK, ids([0, 0]), turn_ids, alt_scores=t([[[0.0], [NAN]], [[NAN], [NAN]]]))
    with pytest.raises(ValueError, match=r"needs batch\.extras\['cf_mask'\] \(batch\.extras has \['alt_scores'\]\)"):
        TCPOCredit()(alt_only)
    # w_cf = 0: the retro_hindsight result, alternatives or not
    want = TCPOCredit(preset="retro_hindsight")(plain).advantages
    torch.testing.assert_close(TCPOCredit(w_cf=0.0)(plain).advantages, want, rtol=0, atol=0)
    some = _batch(PAIR, PAIR_MASK, ids([0, 0]), turn_ids, alt_scores=t([[[-1.0], [NAN]], [[NAN], [NAN]]]),
                  cf_mask=bools([[M, _], [_, _]]))
    torch.testing.assert_close(TCPOCredit(w_cf=0.0)(some).advantages, want, rtol=0, atol=0)


# --- settings: one dataclass per estimator family, passed whole, one config key per field ------------------
# TCPOCredit is TCPOSettings, SLCACredit SLCASettings, SLCATCPOCredit SLCATCPOSettings (both families): a setting
# is a dataclass field plus its line in conf/credit/<name>.yaml, which the test below holds to the fields.
DATACLASS_ESTIMATORS = [name for name in available() if dataclasses.is_dataclass(get(name))]


def test_the_settings_families_are_dataclasses():
    assert {"tcpo", "slca", "slca_tcpo"} <= set(DATACLASS_ESTIMATORS)


@pytest.mark.parametrize("name", DATACLASS_ESTIMATORS)
def test_the_conf_file_lists_every_setting_with_its_default(name):
    cls = get(name)
    conf = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "credit" / f"{name}.yaml"))
    assert conf.pop("_target_") == f"lit_credit.credit.{cls.__name__}"
    assert conf == {f.name: f.default for f in dataclasses.fields(cls)}


@pytest.mark.parametrize(("overrides", "want"), [
    (["credit=tcpo", "credit.preset=turn", "credit.eps=0.5"], TCPOCredit(preset="turn", eps=0.5)),
    (["credit=slca_tcpo", "credit.normalize=std", "credit.w_process=0.5"],
     SLCATCPOCredit(normalize="std", w_process=0.5)),
    (["credit=slca", "credit.norm_by_std=false"], SLCACredit(norm_by_std=False)),
], ids=["tcpo", "slca_tcpo", "slca"])
def test_a_credit_override_reaches_the_estimators_field(make_cfg, overrides, want):
    credit = instantiate(make_cfg(*overrides).credit)
    assert type(credit) is type(want) and credit == want


def test_the_estimator_is_its_settings():
    # the estimator passes itself whole: same result as the function with the same settings, bit for bit
    turn_ids = torch.tensor([[-1, 0, -1, 1, 1], [-1, 0, -1, 1, -1]])
    batch = _batch(PAIR, PAIR_MASK, ids([0, 0]), turn_ids)
    credit = TCPOCredit(preset="turn", eps=1e-3)
    assert isinstance(credit, TCPOSettings) and credit == TCPOCredit(preset="turn", eps=1e-3)
    want = tcpo_turn_advantages(PAIR, PAIR_MASK, ids([0, 0]), TCPOSettings(preset="turn", eps=1e-3))
    torch.testing.assert_close(credit(batch).parts["turn"], want, rtol=0, atol=0)
    with pytest.raises(TypeError):
        TCPOSettings("turn")  # keyword-only, as every estimator's arguments
