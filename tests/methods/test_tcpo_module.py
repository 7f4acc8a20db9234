"""TCPO end to end: turn bookkeeping, the math_revise task and verifier, the outcome reward, TCPOModule's
multi-turn metrics and its counterfactual resampling on a real (tiny) step."""
from __future__ import annotations

import math

import pytest
import torch

from lit_credit.methods import TCPOModule
from lit_credit.methods.tcpo import turn_metrics
from lit_credit.rewards import FinalTurnReward
from lit_credit.tasks import MathReviseTask
from lit_credit.tasks.math_revise import math_verdict
from lit_credit.train import build
from tests.credit.common import make_batch

MATH_SMALL = ["task.num_train=200", "task.num_test=20", "model.embedded.sft_steps=20"]


def two_turn_batch() -> object:
    # Rollout 0: prompt (2 tokens), turn 0 (2 tokens), feedback (1), turn 1 (3 tokens).
    # Rollout 1: prompt (2), turn 0 (3 tokens), padding (3).
    turn_ids = torch.tensor([[-1, -1, 0, 0, -1, 1, 1, 1], [-1, -1, 0, 0, 0, -1, -1, -1]])
    logp = torch.tensor([[0, 0, -1.0, -3.0, 0, -0.5, -0.5, -2.0], [0, 0, -0.2, -0.4, -0.6, 0, 0, 0]])
    return make_batch((turn_ids >= 0).float(), torch.tensor([0, 0]), torch.tensor([1.0, 0.0]),
                      turn_ids=turn_ids, behaviour_logprobs=logp,
                      turn_scores=torch.tensor([[0.0, 1.0], [0.0, 0.0]]),
                      turn_mask=torch.tensor([[True, True], [True, False]]))


def test_turn_surprisal_and_turn_starts_by_hand():
    batch = two_turn_batch()
    # Surprisal = mean -logp of a turn's tokens: (1 + 3) / 2 = 2, (0.5 + 0.5 + 2) / 3 = 1; (0.2+0.4+0.6)/3 = 0.4.
    assert torch.allclose(batch.turn_surprisal(), torch.tensor([[2.0, 1.0], [0.4, 0.0]]))
    # First token of each turn; T = 8 marks a turn not reached.
    assert batch.turn_starts().tolist() == [[2, 5], [2, 8]]


def test_final_turn_reward_is_the_last_turn_score():
    out = FinalTurnReward()({}, ["3", "5"], turn_scores=[0.0, 1.0])
    assert out == {"score": 1.0, "best": 1.0, "first": 0.0, "turns": 2.0}
    assert FinalTurnReward()({}, ["5", "4"], turn_scores=[1.0, None])["score"] == 0.0  # regression after success
    with pytest.raises(ValueError, match="task=math_revise"):
        FinalTurnReward()({}, ["3"])


def test_math_verdict_scores_and_hints():
    row = {"answer": "12"}
    assert math_verdict(row, "12").score == 1.0
    assert math_verdict(row, "The answer is 12.").score == 1.0
    assert (math_verdict(row, "15").score, math_verdict(row, "15").feedback) == (0.0, "15 is too high. Try again.")
    assert math_verdict(row, "9").feedback == "9 is too low. Try again."
    assert math_verdict(row, "no idea").feedback == "No answer found. Reply with the answer."


def test_math_revise_splits_environment_and_revision_demos():
    task = MathReviseTask(num_train=300, num_test=30, max_turns=3, seed=1)
    train, test = task.dataset("train"), task.dataset("test")
    assert len(train) == 300 and len(test) == 30 and not set(train["id"]) & set(test["id"])
    assert MathReviseTask(num_train=300, num_test=30, seed=1).dataset("test")["id"] == test["id"]
    row = test[0]
    env = task.environment()
    assert env.step(row, 0, row["answer"]).done and env.step(row, 0, row["answer"]).score == 1.0
    miss = env.step(row, 0, str(int(row["answer"]) + 1))
    assert not miss.done and miss.score == 0.0 and miss.messages[0]["role"] == "user"
    assert env.step(row, 2, "nope").done  # the turn budget ends the episode
    demos = list(task.demonstrations(200, seed=0))
    revised = [d for d in demos if len(d["messages"]) == 4]
    assert 0.25 < len(revised) / len(demos) < 0.55  # revise_frac 0.4
    for d in revised:  # the feedback is exactly what the environment says to the wrong first answer
        question = {"answer": d["messages"][3]["content"]}
        assert d["messages"][2]["content"] == math_verdict(question, d["messages"][1]["content"]).feedback
    assert not {d["messages"][0]["content"] for d in demos} & set(test["id"])


def test_multi_turn_metrics_by_hand():
    batch = two_turn_batch()
    # Rollout 0 solves at turn 2, rollout 1 never; the task allows 3 turns, so pass@turn3 = pass@turn2.
    logs = turn_metrics(batch.turn_scores, batch.turn_mask, success=1.0, max_turns=3)
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


def test_counterfactual_resampling_uses_exact_histories_and_the_verifier(make_cfg):
    cfg = make_cfg("experiment=tcpo_math", "debug=fdr", *MATH_SMALL, "data.prompts_per_step=2",
                   "data.sampling.n=4", "method.cf_top_l=2", "method.cf_samples=3", fast_task=False)
    module, datamodule, trainer = build(cfg)
    assert isinstance(module, TCPOModule) and module.credit.uses_counterfactual
    calls, seen = [], []
    generate = datamodule.engine.generate
    datamodule.engine.generate = lambda prompts, sampling: calls.append((prompts, sampling)) or generate(prompts,
                                                                                                         sampling)
    augment = module.augment_experience
    module.augment_experience = lambda batch: seen.append(batch) or augment(batch)
    trainer.fit(module, datamodule=datamodule)
    batch = seen[0]
    # tcpo_math continues after success (task.stop_on_success=false): every rollout plays all 3 turns.
    assert batch.turn_mask.shape[1] == 3 and batch.turn_mask.all()
    selected = batch.reward_parts["cf_mask"]
    # top-L = 2 turns per group (every group has >= 2 reached turns: 4 rollouts each).
    assert selected.sum().item() == 2 * 2 and not (selected & ~batch.turn_mask).any()
    cf_calls = [prompts for prompts, sampling in calls if sampling.n == 3]  # rollouts use n=4, validation n=1
    assert len(cf_calls) == 1 and len(cf_calls[0]) == 4
    prompts = cf_calls[0]
    starts = batch.turn_starts()
    expected = [batch.input_ids[i, :starts[i, k]].tolist() for i, k in selected.nonzero().tolist()]
    assert prompts == expected
    alt = batch.reward_parts["alt_scores"]
    assert alt.shape == (*batch.turn_mask.shape, 3)
    assert torch.isnan(alt[~selected]).all() and ((alt[selected] == 0) | (alt[selected] == 1)).all()
    m = {k: float(v) for k, v in trainer.callback_metrics.items()}
    assert m["tcpo/cf_turns"] == 4.0 and 0.0 < m["perf/extra_experience_frac"] < 1.0
    assert "train/pass@turn3" in m and "credit/turn_type/improve/frac" in m
    assert 0.0 <= m["train/regress_after_success"] <= m["train/pass@turn3"]
    if not math.isnan(m["tcpo/cf_alt_mean"]):
        assert m["tcpo/cf_alt_mean"] == pytest.approx(alt[selected].mean().item())


@pytest.mark.parametrize("credit", ["grpo", "mt_grpo", "tcpo"])
def test_baselines_and_method_share_the_module(credit, make_cfg):
    cfg = make_cfg("experiment=tcpo_math", f"credit={credit}", "debug=fdr", *MATH_SMALL, fast_task=False)
    module, datamodule, trainer = build(cfg)
    assert isinstance(module, TCPOModule)
    trainer.fit(module, datamodule=datamodule)
    m = {k: float(v) for k, v in trainer.callback_metrics.items()}
    assert ("perf/extra_experience_frac" in m) == (credit == "tcpo")  # counterfactuals only for TCPO
    assert 0.0 <= m["train/success"] <= 1.0


@pytest.mark.parametrize("preset", ["trajectory", "turn", "diff", "retro", "retro_hindsight", "tcpo"])
def test_every_rung_of_the_ladder_composes(preset, make_cfg):
    from hydra.utils import instantiate

    credit = instantiate(make_cfg("experiment=tcpo_math", f"credit.preset={preset}", fast_task=False).credit)
    assert credit.preset == preset and credit.uses_counterfactual == (preset == "tcpo")  # resampling only for tcpo
