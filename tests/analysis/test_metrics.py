"""The rollout metrics of lit_credit.analysis.metrics by hand: the multi-turn outcome metrics, the per-step exact
match and the irrelevant-call rates, the success normaliser, the metric sets a method adds by config
(ToolMetrics, TurnMetrics) and SLCA's segment gradient cosine."""
from __future__ import annotations

import math

import pytest
import torch

from lit_credit.analysis.metrics import (
    ToolMetrics,
    TurnMetrics,
    irrelevant_call_rates,
    score_scale,
    segment_grad_cosine,
    step_exact_match,
    turn_metrics,
)
from lit_credit.losses import ClippedSurrogate, PolicyLoss
from tests.credit.common import make_batch


def test_multi_turn_metrics_by_hand():
    # Rollout 0 scores [0, 1] (solves at turn 2), rollout 1 [0] (one turn, never); the task allows 3 turns, so
    # pass@turn3 = pass@turn2.
    scores, mask = torch.tensor([[0.0, 1.0], [0.0, 0.0]]), torch.tensor([[True, True], [True, False]])
    logs = turn_metrics(scores, mask, success=1.0, max_turns=3)
    maintain = logs.pop("maintain_rate")
    assert logs == {"pass@turn1": 0.0, "pass@turn2": 0.5, "pass@turn3": 0.5, "success": 0.5,
                    "regress_after_success": 0.0, "turns_to_success": 2.0, "turns": 1.5}
    assert math.isnan(maintain)  # stop-at-success episodes: no turn follows a success
    # A kept success counts once, from its first turn: [1, 1] solves at turn 1.
    kept = turn_metrics(torch.tensor([[1.0, 1.0]]), torch.tensor([[True, True]]))
    assert kept["turns_to_success"] == 1.0 and kept["pass@turn1"] == 1.0 and kept["maintain_rate"] == 1.0


def test_multi_turn_metrics_after_success_by_hand():
    # Continue-after-success episodes, K = 3: KEPT [1, 1, 1], LOST [1, 0, 0], FLIP [0, 1, 0], LATE [0, 0, 1].
    scores = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    logs = turn_metrics(scores, torch.ones(4, 3, dtype=torch.bool), success=1.0, max_turns=3)
    assert logs == pytest.approx({
        "pass@turn1": 2 / 4,  # KEPT, LOST right at turn 1
        "pass@turn2": 3 / 4,  # + FLIP
        "pass@turn3": 4 / 4,  # + LATE: best-turn pass rate
        "success": 2 / 4,  # the final turn is right: KEPT, LATE (the outcome reward=final_turn scores)
        "regress_after_success": 2 / 4,  # right at some turn, wrong at the last: LOST, FLIP
        # turns after the first success: KEPT 2 (both right), LOST 2 (wrong), FLIP 1 (wrong), LATE 0 -> 2 / 5
        "maintain_rate": 2 / 5,
        "turns_to_success": (1 + 1 + 2 + 3) / 4,
        "turns": 3.0,
    })
    # A half-scored turn (code: 2/4 tests) is no success at success = 1.
    partial = turn_metrics(torch.tensor([[1.0, 0.5]]), torch.ones(1, 2, dtype=torch.bool))
    assert partial["success"] == 0.0 and partial["regress_after_success"] == 1.0 and partial["maintain_rate"] == 0.0


def test_step_exact_match_by_hand():
    # gold steps [3, 3, 2, 1]; turn k exact? r0 [1, 0, 0], r1 [1, 1, 1], r2 [0, 0, 0], r3 [1, 0, 0].
    # step 1: all four plans have it, exact 1, 1, 0, 1 -> 3/4; step 2: r0, r1, r2 -> 0, 1, 0 -> 1/3;
    # step 3: r0, r1 -> 0, 1 -> 1/2 (r3's exact turn 1 is past its one-step plan: not counted).
    exact = torch.tensor([[1.0, 0, 0], [1, 1, 1], [0, 0, 0], [1, 0, 0]])
    got = step_exact_match(exact, torch.tensor([3.0, 3, 2, 1]))
    assert got == pytest.approx({1: 3 / 4, 2: 1 / 3, 3: 1 / 2})
    # A plan deeper than any rollout's turns: the missing turns are misses.
    assert step_exact_match(torch.tensor([[1.0], [0.0]]), torch.tensor([2.0, 1.0])) == {1: 0.5, 2: 0.0}


def test_irrelevant_call_rates_by_hand():
    # 5 rollouts; gold steps [0, 0, 2, 0, 1] -> rollouts 0, 1, 3 are of no-call prompts. Tool tags [1, 0, 1, 1, 0]
    # -> on them 1, 0, 1: rate 2/3; valid calls [0, 0, 1, 1, 1] -> on them 0, 0, 1: 1/3
    parts = {"gold_steps": torch.tensor([0.0, 0, 2, 0, 1]), "tool_tag": torch.tensor([1.0, 0, 1, 1, 0]),
             "valid_call": torch.tensor([0.0, 0, 1, 1, 1])}
    assert irrelevant_call_rates(parts, "train") == pytest.approx(
        {"train/tool/irrelevant_call_rate": 2 / 3, "train/tool/irrelevant_valid_call_rate": 1 / 3})
    assert irrelevant_call_rates({**parts, "gold_steps": torch.ones(5)}, "val") == {}  # no no-call prompt
    assert irrelevant_call_rates({"gold_steps": parts["gold_steps"]}, "val") == {}     # a reward without tags


def test_score_scale_is_w_process_plus_w_summary():
    assert score_scale({"process": 1.0, "summary": 1.0}) == 2.0  # HierR's defaults
    assert score_scale({"process": 0.5, "summary": 2.0, "format": 9.0}) == 2.5  # other parts do not count
    assert score_scale({}) == 1.0  # a reward without part weights (exact match)
    assert score_scale({"process": 1.0}) == 1.0  # one of the two missing
    assert score_scale({"process": 0.0, "summary": 0.0}) == 1.0  # no positive sum


def tool_batch():
    """4 rollouts of HierR-like rewards with weights 1 + 1 = 2. Scores [2, 1.4, 1, 0] -> normalised
    [1, 0.7, 0.5, 0]. Parts: rollout 0 exact (name = key = value = 1), rollout 1 wrong value, rollouts 2, 3
    misses; gold steps [2, 2, 0, 1]; per-turn exact [[1, 1], [1, 0], [0, 0], [0, 0]]; the no-call prompt's
    rollout (2) made a tool tag but no valid call."""
    parts = {"name": torch.tensor([1.0, 1, 0, 0]), "key": torch.tensor([1.0, 1, 0, 1]),
             "value": torch.tensor([1.0, 0, 0, 0]), "gold_steps": torch.tensor([2.0, 2, 0, 1]),
             "tool_tag": torch.tensor([1.0, 1, 1, 0]), "valid_call": torch.tensor([1.0, 1, 0, 0])}
    return make_batch(torch.ones(4, 3), torch.tensor([0, 0, 1, 1]), torch.tensor([2.0, 1.4, 1.0, 0.0]),
                      reward_parts=parts, reward_weights={"process": 1.0, "summary": 1.0},
                      turn_parts={"tool_exact": torch.tensor([[1.0, 1], [1, 0], [0, 0], [0, 0]])},
                      turn_scores=torch.tensor([[0.0, 1.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]),
                      turn_mask=torch.tensor([[True, True], [True, True], [True, False], [True, True]]))


def test_tool_metrics_by_hand():
    logs = ToolMetrics()(tool_batch(), "train", {"max_turns": 2})
    assert logs == pytest.approx({
        # success@t: share of normalised scores [1, 0.7, 0.5, 0] >= t
        "train/success@0.7": 2 / 4, "train/success@0.8": 1 / 4, "train/success@0.9": 1 / 4,
        "train/success@1.0": 1 / 4,
        "train/tool/exact_match": 1 / 4,  # rollout 0 only
        # step 1: gold steps >= 1 for rollouts 0, 1, 3 with exact 1, 1, 0 -> 2/3; step 2: rollouts 0, 1 -> 1/2
        "train/step1/exact_match": 2 / 3, "train/step2/exact_match": 1 / 2,
        # the no-call prompt's one rollout (2): a tool tag, no valid call
        "train/tool/irrelevant_call_rate": 1.0, "train/tool/irrelevant_valid_call_rate": 0.0,
    })
    # Without part weights the scores are not rescaled: [2, 1.4, 1, 0] >= 1 for three of four.
    unweighted = tool_batch()
    unweighted.reward_weights = {}
    assert ToolMetrics(success_thresholds=[1.0])(unweighted, "val", {})["val/success@1.0"] == 3 / 4


def test_turn_metrics_set_prefixes_the_stage_and_reads_max_turns_from_the_context():
    batch = tool_batch()
    logs = TurnMetrics(success=1.0)(batch, "val", {"max_turns": 3})
    expected = turn_metrics(batch.turn_scores, batch.turn_mask, 1.0, 3)
    assert logs.keys() == {f"val/{k}" for k in expected} and "val/pass@turn3" in logs
    assert logs["val/success"] == 2 / 4  # final turns hit: rollouts 0, 1
    no_turns = make_batch(torch.ones(2, 2), torch.tensor([0, 0]), torch.tensor([1.0, 0.0]))
    assert TurnMetrics()(no_turns, "train", {"max_turns": 3}) == {}  # no per-turn verifier scores


def test_segment_grad_cosine_by_hand():
    # One rollout, response mask [1, 0, 1, 1]: a tool run (token 0) and the summary run (tokens 2, 3). A
    # log-linear policy logp_t = w . x_t with x_0 = (1, 0), x_2 = (1, 1), x_3 = (0, 1) and advantages 1. At ratio
    # 1 the clipped surrogate's gradient is -A grad logp, token-mean over each segment:
    # g_tool = -x_0 = -(1, 0), g_summary = -(x_2 + x_3) / 2 = -(1/2, 1): cos = (1/2) / (1 * sqrt(5/4)) = 1/sqrt(5).
    w = torch.nn.Parameter(torch.tensor([0.3, -0.2]))
    x = torch.tensor([[1.0, 0.0], [5.0, 5.0], [1.0, 1.0], [0.0, 1.0]])
    logp = (x @ w)[None]
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    loss = PolicyLoss(ClippedSurrogate(0.2), aggregation="token-mean")
    cosine = segment_grad_cosine(loss, logp, torch.ones(1, 4), mask, [w])
    assert cosine == pytest.approx(1 / math.sqrt(5), rel=1e-6)
    # Zero advantage on the summary: its gradient is 0, the cosine undefined (None).
    assert segment_grad_cosine(loss, logp, torch.tensor([[1.0, 1.0, 0.0, 0.0]]), mask, [w]) is None
    # One run only (no tool segment): None.
    assert segment_grad_cosine(loss, logp, torch.ones(1, 4), torch.tensor([[0.0, 0.0, 1.0, 1.0]]), [w]) is None
