"""SLCA x TCPO composed credit (docs/methods.md §4: §1 segments + §2 turn credit): hand tables and the SLCA
reduction."""

import math
from dataclasses import replace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lit_credit.credit import SLCATCPOCredit, get, slca_advantages, slca_tcpo_advantages
from lit_credit.credit.slca import SLCASettings
from lit_credit.credit.slca_tcpo import SLCATCPOSettings

from .common import DTYPES, PROPS, TOL, build_runs, ids, make_batch, run_layouts, t

EPS = 1e-6


def layout(tool_turns: list[int], width: int = 2):
    """Rollouts of ``tool_turns[i]`` tool turns then one summary turn, each turn ``width`` tokens after a
    1-token observation: (response_mask [B, T], turn_ids [B, T])."""
    mask, runs = build_runs([[(1, width)] * (n + 1) for n in tool_turns])
    return mask, runs


def per_token(mask, turn_ids, turn_adv, sum_adv, tool_turns):
    """The expected [B, T]: turn k's tokens get turn_adv[i][k], the last (summary) turn's tokens sum_adv[i]."""
    out = torch.zeros(mask.shape, dtype=torch.float64)
    for i, n in enumerate(tool_turns):
        for j, k in enumerate(turn_ids[i].tolist()):
            if k >= 0:
                out[i, j] = sum_adv[i] if k == n else turn_adv[i][k]
    return out


def turn_mask(tool_turns, k_max):
    return torch.tensor([[k < n for k in range(k_max)] for n in tool_turns])


@pytest.mark.parametrize("dtype", DTYPES)
def test_two_tool_turns_table(dtype):
    # TCPO's std scaling (normalize="std"; slca_tcpo's default turn_mean_std is the test after the next).
    # One group of three rollouts, two tool turns each, then a summary. tau = 1, mu = 0.1, rho = 1, r0 = 0.
    #   r0: [1.0, 1.0] both calls right; r1: [1.0, 0.5] first right, second wrong; r2: [0.5, 0.5].
    # retro (best so far m: m_0 = 0, m_1 = r_0):
    #   r0: [1 - 0, 0 + mu (kept: m = 1 >= tau, r = 1 >= tau)] = [1, 0.1]
    #   r1: [1, -rho * (1 - 0.5)] = [1, -0.5]            (a drop after a success)
    #   r2: [0.5, 0] (m = 0.5 < tau: no maintenance, no regression)
    # hind: H = max of the rest = r0 [1, 1], r1 [1, 0.5], r2 [0.5, 0.5]; group means 5/6 (turn 0), 2/3 (turn 1)
    #   r0: [1/6, 1/3]; r1: [1/6, -1/6]; r2: [-1/3, -1/6]
    # c = retro + hind: r0 [7/6, 13/30], r1 [7/6, -2/3], r2 [1/6, -1/6]
    # In 30ths: 35, 13, 35, -20, 5, -5: mean 10.5, squared deviations 600.25 + 6.25 + 600.25 + 930.25 +
    # 30.25 + 240.25 = 2407.5, unbiased var = 2407.5 / 5 / 900 = 0.535; A = c / (sqrt(0.535) + eps).
    # Summary: [0.9, 0.5, 0.7] -> mean 0.7, std 0.2 -> Norm = [0.2, -0.2, 0] / (0.2 + eps).
    tool_turns = [2, 2, 2]
    mask, turn_ids = layout(tool_turns)
    scores = t([[1.0, 1.0], [1.0, 0.5], [0.5, 0.5]], dtype)
    summary = t([0.9, 0.5, 0.7], dtype)
    out = slca_tcpo_advantages(scores, turn_mask(tool_turns, 2), summary, mask.to(dtype), turn_ids, ids([0, 0, 0]),
                               SLCATCPOSettings(normalize="std"))
    std = math.sqrt(0.535) + EPS
    c = [[7 / 6, 13 / 30], [7 / 6, -2 / 3], [1 / 6, -1 / 6]]
    turn_adv = [[x / std for x in row] for row in c]
    sum_adv = [0.2 / (0.2 + EPS), -0.2 / (0.2 + EPS), 0.0]
    torch.testing.assert_close(out.parts["turn"], t(turn_adv, dtype), **TOL[dtype])
    torch.testing.assert_close(out.parts["summary"], t(sum_adv, dtype), **TOL[dtype])
    torch.testing.assert_close(out.advantages, per_token(mask, turn_ids, turn_adv, sum_adv, tool_turns).to(dtype),
                               **TOL[dtype])
    # The point of the composition: rollout 1's right first call is credited (+1.595), its wrong second call
    # blamed (-0.911), where SLCA gives its whole tool segment one value.
    assert out.parts["turn"][1, 0] > 1.5 and out.parts["turn"][1, 1] < -0.9
    assert out.metrics["credit/tool_turns"] == pytest.approx(2.0)
    assert out.metrics["credit/turn_type/regress/frac"] == pytest.approx(1 / 6)  # r1's second turn


@pytest.mark.parametrize("dtype", DTYPES)
def test_three_tool_turns_table_with_unequal_lengths_and_a_singleton_group(dtype):
    # normalize="std", as the table above. Group 0: r0 three tool turns [0.5, 1, 1]; r1 two tool turns [1, 0]. Group 1: r2, one tool turn [0.8].
    # retro: r0 [0.5 (m=0), 0.5 (m=0.5 < tau: the gain only), 0 + mu = 0.1 (kept)]; r1 [1, -rho * 1 = -1].
    # hind: H r0 [1, 1, 1], r1 [1, 0]. Turn 0: both reached, mean 1 -> 0, 0. Turn 1: mean 0.5 -> +0.5, -0.5.
    #   Turn 2: only r0 reached it -> presence guard -> 0.
    # c: r0 [0.5, 1.0, 0.1], r1 [1, -1.5]; mean 0.22, squared deviations .0784 + .6084 + .0144 + .6084 +
    #   2.9584 = 4.268, unbiased var 1.067; A = c / (sqrt(1.067) + eps).
    # r2: one tool turn in its group -> fewer than 2 turns to scale by -> 0; its summary is alone -> 0.
    # Summary of group 0: [0.6, 0.2] -> +-0.2 / (sqrt(0.08) + eps).
    tool_turns = [3, 2, 1]
    mask, turn_ids = layout(tool_turns)
    scores = t([[0.5, 1.0, 1.0], [1.0, 0.0, 0.0], [0.8, 0.0, 0.0]], dtype)
    summary = t([0.6, 0.2, 0.9], dtype)
    out = slca_tcpo_advantages(scores, turn_mask(tool_turns, 3), summary, mask.to(dtype), turn_ids, ids([0, 0, 1]),
                               SLCATCPOSettings(normalize="std"))
    std = math.sqrt(1.067) + EPS
    turn_adv = [[0.5 / std, 1.0 / std, 0.1 / std], [1.0 / std, -1.5 / std, 0.0], [0.0, 0.0, 0.0]]
    s = 0.2 / (math.sqrt(0.08) + EPS)
    sum_adv = [s, -s, 0.0]
    torch.testing.assert_close(out.parts["turn"], t(turn_adv, dtype), **TOL[dtype])
    torch.testing.assert_close(out.advantages, per_token(mask, turn_ids, turn_adv, sum_adv, tool_turns).to(dtype),
                               **TOL[dtype])
    assert out.metrics["credit/turn/2/adv_mean"] == pytest.approx(0.1 / std)


@pytest.mark.parametrize("dtype", DTYPES)
def test_default_centres_the_first_turn_so_a_worse_first_call_is_not_credited_positive(dtype):
    # Why slca_tcpo's default is normalize="turn_mean_std" (docs/methods.md §4). One group of three rollouts,
    # one tool turn each (then a summary). HierR gives a well-formed single call on a one-call step at least 0.4
    # (format 0.1 + parallel 0.3, the wrong tool): r0 and r1 call the wrong tool (0.4), r2 the right one, every argument
    # right (1.0). retro_hindsight, r0 = 0, tau = 1:
    #   retro = [r - 0]_+ = [0.4, 0.4, 1.0] (no success before, so no mu / rho term);
    #   hind: H = r (one turn), group mean 0.6 -> [-0.2, -0.2, 0.4];
    #   c = [0.2, 0.2, 1.4]; mean 0.6, deviations [-0.4, -0.4, 0.8], unbiased var (0.16 + 0.16 + 0.64) / 2 = 0.48.
    # std (uncentred): A = c / (sqrt(0.48) + eps) = [0.2887, 0.2887, 2.0207]: the two worse-than-group first
    #   calls get a POSITIVE credit (every first call earns its own score; only hindsight separates them).
    # turn_mean_std (the default): A = (c - 0.6) / (sqrt(0.48) + eps) = [-0.5774, -0.5774, 1.1547]: the sign
    #   of each call's score against its group.
    tool_turns = [1, 1, 1]
    mask, turn_ids = layout(tool_turns)
    scores, summary = t([[0.4], [0.4], [1.0]], dtype), t([0.5, 0.5, 0.5], dtype)
    args = (scores, turn_mask(tool_turns, 1), summary, mask.to(dtype), turn_ids, ids([0, 0, 0]))
    std = math.sqrt(0.48) + EPS
    uncentred = slca_tcpo_advantages(*args, SLCATCPOSettings(normalize="std")).parts["turn"]
    torch.testing.assert_close(uncentred, t([[0.2 / std], [0.2 / std], [1.4 / std]], dtype), **TOL[dtype])
    assert (uncentred[:2] > 0).all()  # worse than the group's mean score (0.6), credited positive
    centred = slca_tcpo_advantages(*args).parts["turn"]
    torch.testing.assert_close(centred, t([[-0.4 / std], [-0.4 / std], [0.8 / std]], dtype), **TOL[dtype])
    assert (centred[:2] < 0).all() and centred[2] > 0
    torch.testing.assert_close(SLCATCPOCredit()(make_batch(
        mask.to(dtype), ids([0, 0, 0]), t([1.0] * 3, dtype), turn_ids=turn_ids, reward_parts={"summary": summary},
        turn_parts={"tool_scores": scores, "tool_turn_mask": turn_mask(tool_turns, 1).to(dtype)})).parts["turn"],
        centred)
    assert SLCATCPOCredit().normalize == "turn_mean_std"


def test_w_process_scales_turn_credit_and_w_summary_the_summary():
    tool_turns = [2, 2]
    mask, turn_ids = layout(tool_turns)
    args = (t([[1.0, 0.0], [0.0, 1.0]]), turn_mask(tool_turns, 2), t([0.9, 0.1]), mask.double(), turn_ids, ids([0, 0]))
    base = slca_tcpo_advantages(*args)
    scaled = slca_tcpo_advantages(*args, SLCATCPOSettings(w_process=0.5, w_summary=2.0))
    torch.testing.assert_close(scaled.parts["turn"], 0.5 * base.parts["turn"])
    torch.testing.assert_close(scaled.parts["summary"], 2.0 * base.parts["summary"])
    # weights left None (the default) are the reward's where given, else 1.0
    from_reward = slca_tcpo_advantages(*args, reward_weights={"process": 0.5, "summary": 2.0})
    torch.testing.assert_close(from_reward.advantages, scaled.advantages, rtol=0, atol=0)


def test_omission_zeroes_the_tool_turns_and_puts_the_score_on_the_summary():
    # r1 omitted a needed call (score -0.5): its tool scores count as 0, its summary score is -0.5.
    tool_turns = [1, 1]
    mask, turn_ids = layout(tool_turns)
    scores = t([[0.4], [0.9]])
    out = slca_tcpo_advantages(scores, turn_mask(tool_turns, 1), t([0.5, 0.5]), mask.double(), turn_ids, ids([0, 0]),
                               SLCATCPOSettings(preset="trajectory"), score_total=t([0.9, -0.5]),
                               should_call_but_no_call=t([0.0, 1.0]))
    # trajectory: Norm([0.4, 0]) = +-0.2 / (sqrt(0.08) + eps); summary Norm([0.5, -0.5]) = +-0.5 / (sqrt(.5) + eps)
    a = 0.2 / (math.sqrt(0.08) + EPS)
    b = 0.5 / (math.sqrt(0.5) + EPS)
    torch.testing.assert_close(out.parts["turn"], t([[a], [-a]]))
    torch.testing.assert_close(out.parts["summary"], t([b, -b]))
    assert out.metrics["credit/omission_frac"] == 0.5


def test_counterfactual_preset_adds_w_cf_times_the_fixed_history_gap():
    # preset tcpo = retro_hindsight + w_cf * (r - mean of the alternatives), here on r0's second turn only.
    tool_turns = [2, 2]
    mask, turn_ids = layout(tool_turns)
    args = (t([[1.0, 0.5], [1.0, 1.0]]), turn_mask(tool_turns, 2), t([0.5, 0.5]), mask.double(), turn_ids, ids([0, 0]))
    alt = torch.full((2, 2, 2), float("nan"), dtype=torch.float64)
    alt[0, 1] = t([1.0, 0.0])  # r0 turn 1: r = 0.5, alternatives' mean 0.5 -> cf = 0
    alt[1, 0] = t([0.5, 0.0])  # r1 turn 0: r = 1.0, alternatives' mean 0.25 -> cf = 0.75, times w_cf = 2 -> 1.5
    plain = slca_tcpo_advantages(*args, SLCATCPOSettings(normalize="none"))
    with_cf = slca_tcpo_advantages(*args, SLCATCPOSettings(normalize="none", preset="tcpo", w_cf=2.0), alt_scores=alt)
    torch.testing.assert_close(with_cf.parts["turn"] - plain.parts["turn"], t([[0.0, 0.0], [1.5, 0.0]]))


@given(run_layouts(max_runs=2), st.data())
@PROPS
def test_one_tool_turn_and_turn_credit_off_is_slca_exactly(layout_, data):
    # With at most one tool turn per rollout whose score is the process score, the trajectory preset (turn
    # credit off: Norm of the last tool turn's score over the rollouts with one) is SLCA's A_tool.
    gids, rows = layout_
    mask, runs = build_runs(rows)
    b = len(rows)
    floats = st.lists(st.floats(0, 1), min_size=b, max_size=b)
    process, summary = t(data.draw(floats)), t(data.draw(floats))
    total = t(data.draw(st.lists(st.sampled_from([-0.5, 0.3, 1.2, 2.0]), min_size=b, max_size=b)))
    flag = t(data.draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=b, max_size=b)))
    has_tool = torch.tensor([len(r) == 2 for r in rows])
    w = data.draw(st.sampled_from([1.0, 0.7]))
    kw = dict(score_total=total, should_call_but_no_call=flag)
    slca = slca_advantages(process, summary, mask.double(), ids(gids), SLCASettings(w_process=w, w_summary=2.0 - w),
                           **kw)
    both = slca_tcpo_advantages(process[:, None], has_tool[:, None], summary, mask.double(), runs, ids(gids),
                                SLCATCPOSettings(preset="trajectory", w_process=w, w_summary=2.0 - w), **kw)
    torch.testing.assert_close(both.advantages, slca.advantages, rtol=0, atol=0)
    torch.testing.assert_close(both.parts["summary"], slca.parts["summary"], rtol=0, atol=0)


def tool_batch(tool_turns, scores, summary, **fields):
    """A batch of ``tool_turns[i]`` tool turns then a summary per rollout (one group), its per-turn tool
    scores in ``turn_parts`` and its summary scores in ``reward_parts``."""
    mask, turn_ids = layout(tool_turns)
    turns = {"tool_scores": t(scores), "tool_turn_mask": turn_mask(tool_turns, len(scores[0])).double()}
    return make_batch(mask.double(), ids([0] * len(tool_turns)), t([1.0] * len(tool_turns)), turn_ids=turn_ids,
                      reward_parts={"summary": t(summary), **fields.pop("parts", {})}, turn_parts=turns, **fields)


def test_estimator_reads_the_turn_parts_and_is_registered():
    batch = tool_batch([2, 1], [[1.0, 0.5], [0.5, 0.0]], [0.5, 0.8], parts={"should_call_but_no_call": t([0, 0])})
    credit = get("slca_tcpo")()
    assert isinstance(credit, SLCATCPOCredit) and credit.preset == "retro_hindsight" and not credit.needs
    turns, parts = batch.turn_parts, batch.reward_parts
    direct = slca_tcpo_advantages(turns["tool_scores"], turns["tool_turn_mask"], parts["summary"],
                                  batch.response_mask, batch.turn_ids, batch.group_ids, score_total=t([1.0, 1.0]),
                                  should_call_but_no_call=t([0.0, 0.0]))
    torch.testing.assert_close(credit(batch).advantages, direct.advantages)
    assert isinstance(credit, SLCATCPOSettings) and credit == SLCATCPOCredit()  # the estimator is its settings
    with pytest.raises(ValueError, match=r"unknown credit\.preset 'segment'"):
        SLCATCPOCredit(preset="segment")


def test_missing_turn_parts_and_extras_name_the_field_and_the_fix():
    batch = tool_batch([1, 1], [[1.0], [0.5]], [0.0, 0.0])
    old_layout = replace(batch, turn_parts={}, reward_parts={**batch.reward_parts, **batch.turn_parts})
    with pytest.raises(ValueError, match=r"credit=slca_tcpo needs batch\.turn_parts\['tool_scores'\], "
                                         r"batch\.turn_parts\['tool_turn_mask'\] \(batch\.turn_parts has \[\]\); "
                                         r"fix: use reward=hierr on a tool task"):
        SLCATCPOCredit()(old_layout)  # per-turn lists as reward parts: not read
    counterfactual = SLCATCPOCredit(preset="tcpo")
    assert counterfactual.needs == {"alt_scores", "cf_mask"} and not SLCATCPOCredit(preset="tcpo", w_cf=0.0).needs
    with pytest.raises(ValueError, match=r"needs batch\.extras\['alt_scores'\], batch\.extras\['cf_mask'\] "
                                         r"\(batch\.extras has \[\]\); fix: augment=counterfactual_tool"):
        counterfactual(batch)
    # with them: the function's result given the extras (r0 turn 0: r = 1, alternatives' mean 0.5 -> cf 0.5)
    batch.extras = {"alt_scores": t([[[1.0, 0.0]], [[float("nan"), float("nan")]]]),
                    "cf_mask": torch.tensor([[True], [False]])}
    direct = slca_tcpo_advantages(batch.turn_parts["tool_scores"], batch.turn_parts["tool_turn_mask"], t([0, 0]),
                                  batch.response_mask, batch.turn_ids, batch.group_ids,
                                  SLCATCPOSettings(preset="tcpo"), score_total=t([1.0, 1.0]),
                                  alt_scores=batch.extras["alt_scores"], cf_mask=batch.extras["cf_mask"])
    torch.testing.assert_close(counterfactual(batch).advantages, direct.advantages)


def test_segment_weights_follow_the_reward_unless_set():
    # One tool turn each, preset trajectory: A_turn = w_process * Norm([1, 0]) = w_process * (+-0.5 /
    # (sqrt(0.5) + eps)), A_sum = w_summary * Norm([0.9, 0.1]) = w_summary * (+-0.4 / (sqrt(0.32) + eps)).
    batch = tool_batch([1, 1], [[1.0], [0.0]], [0.9, 0.1], reward_weights={"process": 0.5, "summary": 2.0})
    a, b = 0.5 / (math.sqrt(0.5) + EPS), 0.4 / (math.sqrt(0.32) + EPS)
    out = SLCATCPOCredit(preset="trajectory")(batch)  # None: the reward's 0.5 and 2.0
    torch.testing.assert_close(out.parts["turn"], t([[0.5 * a], [-0.5 * a]]))
    torch.testing.assert_close(out.parts["summary"], t([2.0 * b, -2.0 * b]))
    out = SLCATCPOCredit(preset="trajectory", w_process=1.0)(batch)  # set: the reward's weight is not read
    torch.testing.assert_close(out.parts["turn"], t([[a], [-a]]))
    torch.testing.assert_close(out.parts["summary"], t([2.0 * b, -2.0 * b]))
