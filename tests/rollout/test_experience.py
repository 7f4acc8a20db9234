"""The experience layer: every generation (main rollouts, counterfactual prompts, role prompts) shares the
engine's retries, failure counts and sleep / wake; scoring, verifying and turn scores fail soft and counted.

A fake engine (scripted completions, scripted failures, every call recorded) on a real tiny tokenizer.
"""
from __future__ import annotations

import math

import pytest
import torch

from lit_credit.backends import COUNTS, CountsSince, Retry
from lit_credit.models import build_tokenizer
from lit_credit.rollout import Experience
from lit_credit.tasks.base import SingleTurnEnvironment
from lit_credit.types import Completion, Feedback, RewardResult, RolloutBatch, SamplingParams, cat_batches

CORPUS = ["What is 3 + 4?\n7", "Try again.", "hello world"] * 10
ROWS = [{"prompt": [{"role": "user", "content": "What is 3 + 4?"}], "id": "a"},
        {"prompt": [{"role": "user", "content": "hello"}], "id": "b"}]
SAMPLING = SamplingParams(n=3, max_new_tokens=4)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(CORPUS, 300)


class FakeEngine:
    """Fails (raises) its first ``fails`` generate calls, then gives completion j of prompt i the tokens
    ``[10 + j, eos]`` and the text ``f"p{i}r{j}"``. Records every call, in order."""

    def __init__(self, fails: int = 0, sleep_mode: bool = False) -> None:
        self.fails, self.enable_sleep_mode, self.calls = fails, sleep_mode, []

    def bind(self, model, tokenizer):
        self.calls.append("bind")
        self.eos = tokenizer.eos_token_id

    def generate(self, prompts, sampling, seeds=None):
        self.calls.append(("generate", [list(p) for p in prompts], sampling.n))
        if self.fails > 0:
            self.fails -= 1
            raise ConnectionError("engine down")
        return [[Completion([10 + j, self.eos], [-0.5, -0.25], f"p{i}r{j}") for j in range(sampling.n)]
                for i in range(len(prompts))]

    def update_weights(self, model):
        self.calls.append("update_weights")

    def sleep(self):
        self.calls.append("sleep")

    def wake(self):
        self.calls.append("wake")

    @property
    def generates(self) -> int:
        return sum(isinstance(c, tuple) for c in self.calls)


class Constant:
    """Scores every episode 1 (``correct``), no per-turn lists; records what it was given."""

    def __init__(self) -> None:
        self.seen = []

    def __call__(self, row, replies, tool_responses=None, turn_scores=None):
        self.seen.append((row["id"], list(replies), list(turn_scores or [])))
        return RewardResult(1.0, {"correct": 1.0})


def experience(tokenizer, engine, reward=None, env=None, retry: bool = True) -> Experience:
    exp = Experience(engine, env or SingleTurnEnvironment(), reward or Constant(), SAMPLING, max_turns=1,
                     retry=Retry("engine", max_retries=2, backoff=0.0) if retry else None)
    exp.bind(torch.nn.Linear(1, 1), tokenizer)
    return exp


def changed(counts: CountsSince) -> dict[str, float]:
    """The counts that moved since ``counts`` was made (COUNTS is process-wide)."""
    return {k: v for k, v in counts.take().items() if v}


def ok(i: int, n: int, eos: int) -> list[Completion]:
    """What FakeEngine answers prompt i once it works."""
    return [Completion([10 + j, eos], [-0.5, -0.25], f"p{i}r{j}") for j in range(n)]


# The three generation paths, each returning the completions of every prompt (rollouts: per row, in order).
def counterfactual(exp: Experience, codec) -> list[list[Completion]]:
    return exp.sample([[1, 2, 3], [4, 5]], SAMPLING)  # two history prefixes, as TCPO resamples them


def role(exp: Experience, codec) -> list[list[Completion]]:
    prompts, completions = exp.sample_messages([r["prompt"] for r in ROWS], SAMPLING)  # DPA's role prompts
    assert prompts == [codec.prompt_ids(r["prompt"]) for r in ROWS]
    return completions


def rollouts(exp: Experience, codec) -> list[list[Completion]]:
    batch = exp.rollout_groups(ROWS, [0, 1], SAMPLING)
    n = SAMPLING.n
    return [[Completion(ids[mask > 0].tolist(), [], m["replies"][0], m["finish"][0])
             for ids, mask, m in zip(batch.input_ids[i * n:(i + 1) * n], batch.response_mask[i * n:(i + 1) * n],
                                     batch.metadata[i * n:(i + 1) * n])] for i in range(len(ROWS))]


def strip(completions: list[list[Completion]]) -> list[list[tuple]]:
    """(tokens, text, finish) of every completion (rollouts keep log-probs in the batch, not per completion)."""
    return [[(c.token_ids, c.text, c.finish_reason) for c in per] for per in completions]


@pytest.mark.parametrize("path", [rollouts, counterfactual, role], ids=["rollouts", "counterfactual", "role"])
def test_a_flaky_engine_is_retried_and_counted_on_every_path(tokenizer, path):
    engine = FakeEngine(fails=2)
    exp = experience(tokenizer, engine)
    counts, calls = CountsSince(), COUNTS["backend/engine/calls"]
    out = path(exp, exp.codec)
    # attempts 0 and 1 raise, attempt 2 answers: the real completions, 2 retries, 3 calls, no failure
    assert strip(out) == strip([ok(i, 3, tokenizer.eos_token_id) for i in range(2)])
    assert engine.generates == 3 and len({str(c[1]) for c in engine.calls if isinstance(c, tuple)}) == 1
    assert changed(counts) == {"backend/engine/retries": 2.0}
    assert COUNTS["backend/engine/calls"] - calls == 3


@pytest.mark.parametrize("path", [rollouts, counterfactual, role], ids=["rollouts", "counterfactual", "role"])
def test_an_engine_that_never_answers_gives_n_error_completions_per_prompt(tokenizer, path):
    engine = FakeEngine(fails=10**9)
    exp = experience(tokenizer, engine)
    counts, calls = CountsSince(), COUNTS["backend/engine/calls"]
    out = path(exp, exp.codec)
    # 1 + max_retries = 3 attempts, then every prompt gets n = 3 empty completions, finish reason "error"
    assert strip(out) == [[([], "", "error")] * 3] * 2
    assert changed(counts) == {"backend/engine/retries": 2.0, "backend/engine/failures": 1.0}
    assert COUNTS["backend/engine/calls"] - calls == 3 and engine.generates == 3


def test_without_a_retry_an_engine_error_propagates(tokenizer):
    exp = experience(tokenizer, FakeEngine(fails=1), retry=False)
    with pytest.raises(ConnectionError, match="engine down"):
        exp.sample([[1, 2]], SAMPLING)


def test_no_prompt_no_engine_call(tokenizer):
    engine = FakeEngine(fails=10**9, sleep_mode=True)
    exp = experience(tokenizer, engine)
    exp.release()
    counts = CountsSince()
    assert exp.sample([], SAMPLING) == [] and exp.sample_messages([], SAMPLING) == ([], [])
    assert engine.calls == [] and changed(counts) == {}  # never handed the policy: not put to sleep, not called


def test_generation_wakes_an_engine_that_release_put_to_sleep(tokenizer):
    engine = FakeEngine(sleep_mode=True)
    exp = experience(tokenizer, engine)
    prefix = [[1, 2]]
    exp.release()  # the engine was not handed the policy yet (nothing generated): nothing to free
    exp.sample(prefix, SAMPLING)  # its first use: bound, then it generates
    exp.release()
    exp.release()  # already asleep: no second sleep
    exp.sample(prefix, SAMPLING)
    exp.sample(prefix, SAMPLING)  # awake: no second wake
    exp.release()
    exp.sample_messages([ROWS[0]["prompt"]], SAMPLING)
    exp.release()
    exp.rollout_groups(ROWS[:1], [0], SAMPLING)
    exp.release()
    exp.sync_weights(torch.nn.Linear(1, 1))  # after the update: wake, then push
    exp.sync_weights(torch.nn.Linear(1, 1))  # awake: push only
    names = [c if isinstance(c, str) else c[0] for c in engine.calls]
    assert names == ["bind", "generate", "sleep", "wake", "generate", "generate", "sleep", "wake", "generate",
                     "sleep", "wake", "generate", "sleep", "wake", "update_weights", "update_weights"]


def test_without_sleep_mode_release_and_sync_never_sleep_or_wake(tokenizer):
    engine = FakeEngine(sleep_mode=False)
    exp = experience(tokenizer, engine)
    exp.release()
    exp.sample([[1]], SAMPLING)
    exp.sync_weights(torch.nn.Linear(1, 1))
    assert [c if isinstance(c, str) else c[0] for c in engine.calls] == ["bind", "generate", "update_weights"]
    assert not exp.sleep_mode and experience(tokenizer, FakeEngine(sleep_mode=True)).sleep_mode


def test_the_engine_is_handed_the_policy_once_at_its_first_use(tokenizer):
    model, first, second = torch.nn.Linear(1, 1), FakeEngine(), FakeEngine()
    exp = Experience(first, SingleTurnEnvironment(), Constant(), SAMPLING, max_turns=1)
    exp.bind(model, tokenizer)  # the module's setup: the codec now, the engine at its first use
    assert first.calls == [] and exp.codec.pad_id == tokenizer.pad_token_id
    exp.sample([[1]], SAMPLING)
    exp.sync_weights(model)  # bound already: the push only
    exp.bind(model, tokenizer)  # the same policy again (a later stage's setup): a no-op
    exp.sample([[1]], SAMPLING)
    assert [c if isinstance(c, str) else c[0] for c in first.calls] == ["bind", "generate", "update_weights",
                                                                        "generate"]
    exp.engine = second  # swapped in after the first use (a test's scripted engine, say): bound at its own first use
    exp.sync_weights(model)
    exp.sample([[1]], SAMPLING)
    assert [c if isinstance(c, str) else c[0] for c in second.calls] == ["bind", "update_weights", "generate"]
    exp.bind(torch.nn.Linear(1, 1), tokenizer)  # another policy: handed to the engine at its next use
    exp.sample([[1]], SAMPLING)
    assert [c if isinstance(c, str) else c[0] for c in second.calls][3:] == ["bind", "generate"]


def test_generation_before_bind_names_the_fix():
    exp = Experience(FakeEngine(), SingleTurnEnvironment(), Constant(), SAMPLING, max_turns=1)
    with pytest.raises(RuntimeError, match=r"before bind\(model, tokenizer\)"):
        exp.rollout_groups(ROWS, [0, 1], SAMPLING)


class Verifier(SingleTurnEnvironment):
    """Scores ``right`` 1 and ``wrong`` 0; raises on anything else (an environment bug on odd input)."""

    def step(self, row, turn, reply):
        return Feedback(done=True, score={"right": 1.0, "wrong": 0.0}[reply])


def test_verify_turns_an_environment_error_into_the_end_of_the_episode(tokenizer):
    exp = experience(tokenizer, FakeEngine(), env=Verifier())
    counts = CountsSince()
    assert exp.verify(ROWS[0], 0, "right") == Feedback(done=True, score=1.0)  # the environment's own answer
    assert changed(counts) == {}
    assert exp.verify(ROWS[0], 0, "odd") == Feedback(done=True)  # KeyError -> done, no score, no message
    assert changed(counts) == {"backend/environment/errors": 1.0}


class TurnScored(Constant):
    """A reward with a per-turn score: 0.25 per turn index; raises on the reply ``bug``."""

    def turn_score(self, row, turn, reply):
        if reply == "bug":
            raise IndexError("no gold step")
        return 0.25 * turn


def test_turn_score_is_the_rewards_and_a_raising_one_scores_zero_counted(tokenizer):
    exp = experience(tokenizer, FakeEngine(), reward=TurnScored())
    counts = CountsSince()
    assert exp.turn_score(ROWS[0], 2, "call") == 0.5  # 0.25 * 2
    assert changed(counts) == {}
    assert exp.turn_score(ROWS[0], 2, "bug") == 0.0
    assert changed(counts) == {"backend/reward/errors": 1.0}


def test_turn_score_of_a_reward_without_one_names_the_fix(tokenizer):
    exp = experience(tokenizer, FakeEngine(), reward=Constant())
    with pytest.raises(ValueError, match=r"Constant has no turn_score: augment=counterfactual_tool .*reward=hierr"
                                         r".*augment=counterfactual \(the environment's verifier\)"):
        exp.turn_score(ROWS[0], 0, "call")


class Scripted:
    """Returns the scripted RewardResults in order, with ``part_weights`` (ints on purpose)."""

    def __init__(self, results) -> None:
        self.results, self.part_weights = iter(results), {"process": 1, "summary": 0.5}

    def __call__(self, row, replies, tool_responses=None, turn_scores=None):
        return next(self.results)


def test_rollouts_carry_the_part_weights_and_finite_turn_parts(tokenizer):
    nan, inf = float("nan"), math.inf
    reward = Scripted([RewardResult(1.0, {"process": 0.5}, {"tool_scores": [1.0, nan]}),
                       RewardResult(inf, {"process": 1.0}, {"tool_scores": [inf]}),
                       RewardResult(0.5, {"process": nan}, {"tool_scores": [0.25, 0.5]}),
                       RewardResult(0.0, {}, {}, {"judge": "no call"})])
    exp = Experience(FakeEngine(), SingleTurnEnvironment(), reward, SamplingParams(n=2), max_turns=1)
    exp.bind(torch.nn.Linear(1, 1), tokenizer)
    counts = CountsSince()
    batch = exp.rollout_groups(ROWS, [5, 6], SamplingParams(n=2, temperature=0.5))
    # Non-finite values are 0: the score inf (episode 1), process NaN (2), tool_scores NaN (0) and inf (1): 4.
    assert batch.scores.tolist() == [1.0, 0.0, 0.5, 0.0]
    assert batch.reward_parts["process"].tolist() == [0.5, 1.0, 0.0, 0.0]  # episode 3 has no process part: 0
    # One turn reached, but the longest list has 2: [B, 2], right-padded with 0, a missing list all 0.
    assert batch.turn_parts["tool_scores"].tolist() == [[1.0, 0.0], [0.0, 0.0], [0.25, 0.5], [0.0, 0.0]]
    assert changed(counts) == {"backend/reward/nonfinite": 4.0}
    assert batch.reward_weights == {"process": 1.0, "summary": 0.5}
    assert all(type(w) is float for w in batch.reward_weights.values())
    assert batch.group_ids.tolist() == [5, 5, 6, 6] and batch.temperature == 0.5 and batch.extras == {}
    assert batch.metadata[3]["reward_extras"] == {"judge": "no call"} and "reward_extras" not in batch.metadata[0]
    assert exp.last_generation_s > 0
    # A reward without part_weights: {}; the reward saw the engine's replies.
    plain = Constant()
    assert experience(tokenizer, FakeEngine(), reward=plain).rollout_groups(ROWS[:1], [0], SAMPLING).reward_weights == {}
    assert plain.seen == [("a", [f"p0r{j}"], [None]) for j in range(3)]


def test_a_raising_reward_scores_zero_and_a_wrong_return_type_names_the_fix(tokenizer):
    def raising(row, replies, **kw):
        raise ValueError("bug")

    exp = experience(tokenizer, FakeEngine(), reward=raising)
    counts = CountsSince()
    batch = exp.rollout_groups(ROWS[:1], [0], SAMPLING)
    assert batch.scores.tolist() == [0.0] * 3 and batch.reward_parts == {}
    assert changed(counts) == {"backend/reward/errors": 3.0}
    exp.reward = lambda row, replies, **kw: {"score": 1.0}  # the old dict return
    with pytest.raises(TypeError, match=r"reward function returned a dict: a reward returns a "
                                        r"lit_credit.types.RewardResult"):
        exp.rollout_groups(ROWS[:1], [0], SAMPLING)


def batch(rows: int, width: int, turns: int, turn_parts, extras, weights) -> RolloutBatch:
    """A batch of ``rows`` rollouts of ``width`` tokens (ids 1.., response on the last token) and ``turns``."""
    ids = torch.arange(1, width + 1).repeat(rows, 1)
    response = torch.zeros(rows, width)
    response[:, -1] = 1
    turn_ids = torch.full((rows, width), -1)
    turn_ids[:, -1] = 0
    return RolloutBatch(input_ids=ids, attention_mask=torch.ones(rows, width, dtype=torch.long),
                        response_mask=response, turn_ids=turn_ids, group_ids=torch.arange(rows),
                        behaviour_logprobs=-response, scores=torch.ones(rows), turn_parts=turn_parts, extras=extras,
                        reward_weights=weights, turn_mask=torch.ones(rows, turns, dtype=torch.bool),
                        metadata=[{"id": i} for i in range(rows)])


def test_cat_batches_pads_turn_parts_and_extras_and_refuses_different_reward_weights():
    weights = {"process": 0.5, "summary": 0.5}
    a = batch(2, 3, 1, {"tool_scores": torch.tensor([[0.5], [1.0]])},
              {"alt_scores": torch.tensor([[[0.125, 0.25]], [[0.375, 0.5]]]), "cf_mask": torch.tensor([[True], [False]])},
              weights)
    b = batch(1, 4, 2, {"tool_scores": torch.tensor([[0.25, 0.75]]), "tool_turn_mask": torch.tensor([[1.0, 1.0]])},
              {}, dict(weights))
    out = cat_batches([a, b], pad_id=9)
    # [B, T]: a's rows padded from 3 to 4 tokens (pad 9, turn -1, masks 0); [B, K]: from 1 to 2 turns with 0.
    assert out.input_ids.tolist() == [[1, 2, 3, 9], [1, 2, 3, 9], [1, 2, 3, 4]]
    assert out.turn_ids.tolist() == [[-1, -1, 0, -1], [-1, -1, 0, -1], [-1, -1, -1, 0]]
    assert out.turn_mask.tolist() == [[True, False], [True, False], [True, True]]
    assert out.turn_parts["tool_scores"].tolist() == [[0.5, 0.0], [1.0, 0.0], [0.25, 0.75]]
    assert out.turn_parts["tool_turn_mask"].tolist() == [[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]]  # a lacks it: 0
    # extras: b lacks both, so its row is 0 / False; a's [B, K, M] keep their size (K = 1: b has no K there).
    assert out.extras["alt_scores"].tolist() == [[[0.125, 0.25]], [[0.375, 0.5]], [[0.0, 0.0]]]
    assert out.extras["cf_mask"].dtype == torch.bool and out.extras["cf_mask"].tolist() == [[True], [False], [False]]
    assert out.reward_weights == weights and [m["id"] for m in out.metadata] == [0, 1, 0]
    with pytest.raises(ValueError, match="reward_weights differ"):
        cat_batches([a, batch(1, 4, 2, {}, {}, {"process": 0.25, "summary": 0.75})], pad_id=9)


def test_the_experience_layer_mints_groups_and_moves_the_datamodules_stream(tokenizer):
    from data_modules.rollout import RolloutDataModule
    from lit_credit.tasks import ArithTask

    data = RolloutDataModule(ArithTask(max_operand=9, num_test=4), Constant(), FakeEngine(), SamplingParams(n=2),
                             prompts_per_step=2, val_prompts=4)
    exp = data.experience
    exp.bind(torch.nn.Linear(1, 1), tokenizer)
    with pytest.raises(RuntimeError, match=r"before the DataModule's setup"):
        exp.draw([])
    data.setup()  # attaches the prompt stream and this process's rank to the experience layer
    assert exp.prompts is data.stream and (exp.rank, exp.world_size) == (0, 1)
    assert exp.max_turns == exp.env.max_turns == 1  # max_turns=None: the environment's own limit
    rows = next(iter(data.train_dataloader()))  # the dataloader hands out batch 0 (pending until consumed)
    assert data.position == {"next_batch": 1, "pending": [0]}
    batch = exp.draw(rows)  # the step's draw: batch 0 leaves pending; groups 0, 1 x n = 2
    assert batch.group_ids.tolist() == [0, 0, 1, 1] and data.position == {"next_batch": 1, "pending": []}
    refill = exp.refill()  # the stream's next batch, never served by the dataloader; groups 2, 3
    assert refill.group_ids.tolist() == [2, 2, 3, 3] and data.position["next_batch"] == 2
    assert [m["id"] for m in refill.metadata[::2]] == [r["id"] for r in data.stream.batch(1)]
    val = exp.draw_validation(list(data.val_set))  # greedy, n = 1; pending untouched
    assert val.group_ids.tolist() == [4, 5, 6, 7] and val.temperature == 1.0 and exp.next_group == 8
    assert data.state_dict() == {"next_batch": 2, "pending": [], "next_group": 8}
    fresh = RolloutDataModule(ArithTask(max_operand=9, num_test=4), Constant(), FakeEngine(), SamplingParams(n=2),
                              prompts_per_step=2, val_prompts=4)
    fresh.load_state_dict(data.state_dict())  # a resumed run: the stream's position and the group counter
    assert fresh.position == data.position and fresh.experience.next_group == 8


def test_the_datamodule_refuses_bad_settings(tokenizer):
    from data_modules.rollout import RolloutDataModule
    from lit_credit.tasks import ArithTask

    task = ArithTask(max_operand=9, num_test=4)
    with pytest.raises(ValueError, match=r"data.max_turns=0: must be >= 1 or null"):
        RolloutDataModule(task, Constant(), FakeEngine(), SamplingParams(n=2), max_turns=0)
    with pytest.raises(ValueError, match=r"data.sampling.n=1: .*set data.sampling.n=2 or more"):
        RolloutDataModule(task, Constant(), FakeEngine(), SamplingParams(n=1))
    data = RolloutDataModule(task, Constant(), FakeEngine(), SamplingParams(n=2), max_turns=3)
    assert data.experience.max_turns == 3
    for name in ("engine", "codec", "max_turns", "sampling", "reward", "env", "bind", "generate_experience"):
        assert not hasattr(data, name)  # the experience layer's alone: datamodule.experience.<name>
