"""Every rank calls the engine's ``generate`` equally often (issue #49, finding 5): under tensor parallelism the
ranks of a group share one engine and each call is a collective, so a call only some ranks make hangs the run.

Two real gloo processes (:func:`tests.rollout.ranks.run_ranks`) run the experience layer with a scripted engine
that counts its calls; each scenario gives the two ranks different work: episodes that end at different turns,
one rank with no prompt, a failed attempt on one rank only, TCPO's counterfactual resampling with no turn (or no
scored turns at all) on one rank, and HFEngine's empty call under FSDP2. One spawn runs every scenario (module fixture); each test checks one.
"""
from __future__ import annotations

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from lit_credit.backends import Retry
from lit_credit.models import build_tokenizer
from lit_credit.rollout import Experience, HFEngine
from lit_credit.rollout.augment import CounterfactualTurns
from lit_credit.types import Completion, Feedback, RewardResult, SamplingParams
from tests.rollout.ranks import run_ranks

CORPUS = ["What is 3 + 4?\n7", "Try again.", "hello world"] * 10
SAMPLING = SamplingParams(n=2, max_new_tokens=4)


class CountingEngine:
    """Answers every prompt with ``n`` completions ``[10 + j, eos]``; records the number of prompts of every call;
    raises on its first ``fails`` calls."""

    def __init__(self, fails: int = 0) -> None:
        self.fails, self.calls = fails, []

    def bind(self, model, tokenizer):
        self.eos = tokenizer.eos_token_id

    def generate(self, prompts, sampling, seeds=None):
        self.calls.append(len(prompts))
        if self.fails > 0:
            self.fails -= 1
            raise ConnectionError("engine down")
        return [[Completion([10 + j, self.eos], [-0.5, -0.25], f"r{j}") for j in range(sampling.n)] for _ in prompts]

    def update_weights(self, model):
        pass

    def sleep(self):
        pass

    def wake(self):
        pass


class EndsAt:
    """An environment whose episodes end after turn ``row["turns"] - 1`` (feedback in between), scoring 1."""

    max_turns = 8

    def step(self, row, turn, reply):
        return Feedback(done=turn + 1 >= row["turns"], messages=[{"role": "user", "content": "Try again."}],
                        score=1.0)


class ToolTurns:
    """A reward with a per-turn tool-turn mask (``row["tool"]``: 1 scored, 0 not, None: no mask) and a turn score."""

    def __call__(self, row, replies, tool_responses=None, turn_scores=None):
        turns = {} if row["tool"] is None else {"tool_turn_mask": [float(row["tool"])] * len(replies)}
        return RewardResult(1.0, turns=turns)

    def turn_score(self, row, turn, reply):
        return 0.5


def rows(rank: int, **fields) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": "What is 3 + 4?"}], "id": f"{rank}", **fields}]


def experience(engine, tokenizer, env=None, reward=None, max_turns: int = 1) -> Experience:
    exp = Experience(engine, env or EndsAt(), reward or ToolTurns(), SAMPLING, max_turns=max_turns,
                     retry=Retry("engine", max_retries=2, backoff=0.0))
    exp.bind(torch.nn.Linear(1, 1), tokenizer)
    return exp


def scenarios(rank: int) -> dict[str, dict]:
    """Every scenario on this rank: its engine's calls (prompts per call) and what it returned."""
    tokenizer = build_tokenizer(CORPUS, 300)
    out = {}

    # Episodes end after 1 turn on rank 0, after 3 on rank 1 (max_turns 4): rank 0 joins 2 more calls, empty.
    engine = CountingEngine()
    batch = experience(engine, tokenizer, max_turns=4).rollout_groups(rows(rank, turns=1 + 2 * rank, tool=1), [rank],
                                                                       SAMPLING, seeds=[rank])
    out["episodes"] = {"calls": engine.calls, "turns": batch.turn_mask.sum(1).tolist()}

    # No prompt on rank 0, two on rank 1.
    engine = CountingEngine()
    got = experience(engine, tokenizer).sample([[1, 2, 3]] * 2 * rank, SAMPLING)
    out["empty"] = {"calls": engine.calls, "got": len(got)}

    # Rank 1's first attempt fails: rank 0, whose first attempt worked, attempts again with it.
    engine = CountingEngine(fails=rank)
    got = experience(engine, tokenizer).sample([[1, 2, 3]], SAMPLING)
    out["retry"] = {"calls": engine.calls, "finish": [c.finish_reason for c in got[0]]}

    # TCPO's counterfactuals: rank 0's rollouts have no tool turn to resample (no prefix selected), rank 1's do;
    # then rank 0's reward gives no tool-turn mask at all (no scored turns: the augmenter returned early).
    for name, tool in (("counterfactual", 0), ("no_scored_turns", None)):
        engine = CountingEngine()
        exp = experience(engine, tokenizer)
        batch = exp.rollout_groups(rows(rank, turns=1, tool=tool if rank == 0 else 1), [rank], SAMPLING, seeds=[rank])
        metrics = CounterfactualTurns(top_l=5, samples=2, score="reward")(batch, exp)
        out[name] = {"calls": engine.calls, "cf_turns": metrics.get("tcpo/cf_turns", 0.0)}

    # HFEngine, an FSDP2 policy over both ranks: an empty call still gathers it for the phase (a collective),
    # touches nothing else (no seed drawn) and returns [].
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    mesh = init_device_mesh("cpu", (2,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    engine = HFEngine()
    engine.bind(model, tokenizer)
    rng = torch.get_rng_state()
    got = engine.generate([], SAMPLING)
    out["fsdp_empty"] = {"got": got, "gathered": len(engine._unsharded), "rng_kept": torch.equal(rng, torch.get_rng_state())}
    engine.sleep()
    return out


@pytest.fixture(scope="module")
def ranks():
    return run_ranks(scenarios)


def test_episodes_that_end_at_different_turns_make_equal_calls(ranks):
    # rank 0: its first turn (2 prompts' worth: 1 row, n = 2, one call), then two empty follow-up calls
    assert [r["episodes"]["calls"] for r in ranks] == [[1, 0, 0], [1, 2, 2]]
    assert [r["episodes"]["turns"] for r in ranks] == [[1, 1], [3, 3]]


def test_an_empty_sample_still_calls_the_engine_with_several_ranks(ranks):
    assert [r["empty"] for r in ranks] == [{"calls": [0], "got": 0}, {"calls": [2], "got": 2}]


def test_a_failed_attempt_on_one_rank_is_repeated_on_every_rank(ranks):
    assert [r["retry"]["calls"] for r in ranks] == [[1, 1], [1, 1]]
    assert [r["retry"]["finish"] for r in ranks] == [["stop", "stop"]] * 2  # the second attempt's, everywhere


def test_counterfactuals_with_no_selected_turn_on_one_rank_make_equal_calls(ranks):
    # the rollouts' call (one row), then the counterfactual call: none on rank 0, one prefix per rollout on rank 1
    assert [r["counterfactual"]["calls"] for r in ranks] == [[1, 0], [1, 2]]
    assert [r["counterfactual"]["cf_turns"] for r in ranks] == [0.0, 2.0]


def test_counterfactuals_with_no_scored_turns_on_one_rank_make_equal_calls(ranks):
    assert [r["no_scored_turns"]["calls"] for r in ranks] == [[1, 0], [1, 2]]
    assert [r["no_scored_turns"]["cf_turns"] for r in ranks] == [0.0, 2.0]


def test_an_empty_hf_engine_call_still_gathers_an_fsdp2_policy(ranks):
    assert [r["fsdp_empty"] for r in ranks] == [{"got": [], "gathered": 3, "rng_kept": True}] * 2
