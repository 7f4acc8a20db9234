"""The stateful episode contract (issue 51): each rollout its own episode of the environment, made from the row and
a seed; observation texts and state keys in the RolloutBatch, aligned with the turn ids; continuing an episode by
replay or clone; batched stepping."""
from __future__ import annotations

import random

import pytest
import torch

from lit_credit.interfaces import Environment, Episode, TurnEpisode, fork, open_episode, resume, step_many
from lit_credit.models import build_tokenizer
from lit_credit.rollout import ChatCodec, Experience, run_episodes, to_batch
from lit_credit.rollout.loop import EPISODE_STREAM
from lit_credit.rollout.seeds import mix_seed
from lit_credit.tasks.base import SingleTurnEnvironment, TurnEnvironment
from lit_credit.tasks.revise import RevisionEnvironment, Verdict
from lit_credit.types import Completion, Feedback, RewardResult, SamplingParams, cat_batches, state_hash

ROW = {"prompt": [{"role": "user", "content": "Walk from 0 to 3."}], "id": "w", "start": 0, "goal": 3}


class Walk:
    """A stateful episode: a position on a line, moved by ``L`` / ``R`` replies; a seeded slip (probability 0.5)
    makes a move two steps. The state key is the position (the canonical state); the history is kept too."""

    def __init__(self, env: Walker, row: dict, seed: int) -> None:
        self.env, self.row, self.seed = env, row, seed

    def reset(self) -> list[dict[str, str]]:
        self.rng, self.pos, self.history = random.Random(self.seed), self.row["start"], []
        return list(self.row["prompt"])

    def step(self, reply: str) -> Feedback:
        self.env.steps += 1
        move = {"L": -1, "R": 1}.get(reply.strip(), 0) * (2 if self.rng.random() < 0.5 else 1)
        self.pos += move
        self.history.append(reply)
        done = self.pos == self.row["goal"] or len(self.history) >= self.env.max_turns
        return Feedback(done=done, messages=[{"role": "user", "content": f"You are at {self.pos}."}],
                        score=float(self.pos == self.row["goal"]))

    def state_key(self):
        return self.pos


class ClonableWalk(Walk):
    def clone(self) -> ClonableWalk:
        copy = ClonableWalk(self.env, self.row, self.seed)
        copy.rng, copy.pos, copy.history = random.Random(), self.pos, list(self.history)
        copy.rng.setstate(self.rng.getstate())
        return copy


class Walker:
    """The environment of :class:`Walk` (``episodes``: every episode it made, in order)."""

    max_turns = 3

    def __init__(self, clonable: bool = False) -> None:
        self.clonable, self.steps, self.episodes = clonable, 0, []

    def episode(self, row: dict, seed: int) -> Walk:
        ep = (ClonableWalk if self.clonable else Walk)(self, row, seed)
        self.episodes.append(ep)
        return ep


class BatchedWalker(Walker):
    """The same environment stepped in one call per turn (``calls``: the number of episodes of each call)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[int] = []

    def step_many(self, episodes, replies):
        self.calls.append(len(episodes))
        return [e.step(r) for e, r in zip(episodes, replies)]


class Scripted:
    """Replies from a script: ``script[call][j]`` is the text of completion j of engine call ``call``."""

    def __init__(self, tokenizer, script: list[list[str]]) -> None:
        self.tokenizer, self.script, self.calls = tokenizer, script, 0

    def bind(self, model, tokenizer):
        pass

    def completion(self, text: str) -> Completion:
        ids = [*self.tokenizer(text, add_special_tokens=False)["input_ids"], self.tokenizer.eos_token_id]
        return Completion(ids, [-0.5] * len(ids), text)

    def generate(self, prompts, sampling, seeds=None):
        texts, self.calls = self.script[self.calls], self.calls + 1
        if sampling.n > 1:
            return [[self.completion(x) for x in texts[i * sampling.n:(i + 1) * sampling.n]]
                    for i in range(len(prompts))]
        return [[self.completion(texts[i] if i < len(texts) else "R")] for i in range(len(prompts))]


@pytest.fixture(scope="module")
def codec():
    return ChatCodec(build_tokenizer(["Walk from 0 to 3. You are at 1. L R", "R L R"] * 20, 300))


# Three rollouts of one row: R R R, L R, R L R (the scripted turns of the active episodes, in order).
SCRIPT = [["R", "L", "R"], ["R", "R", "L"], ["R", "R"]]


def play(env, codec, seeds=(11,)):
    trajectories = run_episodes(Scripted(codec.tokenizer, SCRIPT), codec, env, [ROW], [4],
                                SamplingParams(n=3, max_new_tokens=4), max_turns=3, seeds=list(seeds))
    return trajectories, to_batch(trajectories, [RewardResult(0.0)] * len(trajectories), codec.pad_id)


def test_the_episodes_of_one_row_are_independent_with_their_own_seed_and_state(codec):
    env = Walker()
    trajectories, batch = play(env, codec)
    assert len(env.episodes) == 3 and len({id(e) for e in env.episodes}) == 3
    # Episode k of the row seeded 11 is seeded mix_seed(11, k, EPISODE_STREAM), and the batch keeps it.
    seeds = [mix_seed(11, k, EPISODE_STREAM) for k in range(3)]
    assert [e.seed for e in env.episodes] == seeds == [m["seed"] for m in batch.metadata]
    # Each episode's history is its own replies, and its position follows them with its own slips.
    assert [e.history for e in env.episodes] == [t.replies for t in trajectories]
    for ep, t in zip(env.episodes, trajectories):
        rng, pos = random.Random(ep.seed), 0
        for reply in t.replies:
            pos += {"L": -1, "R": 1}[reply] * (2 if rng.random() < 0.5 else 1)
        assert ep.pos == pos
    # Without seeds the group id stands for the row's seed.
    env = Walker()
    run_episodes(Scripted(codec.tokenizer, SCRIPT), codec, env, [ROW], [4], SamplingParams(n=3), max_turns=3)
    assert [e.seed for e in env.episodes] == [mix_seed(4, k, EPISODE_STREAM) for k in range(3)]


def test_observations_and_state_keys_are_aligned_with_the_turn_ids(codec):
    env = Walker()
    trajectories, batch = play(env, codec)
    turns = batch.turn_mask.sum(1).tolist()
    assert batch.state_keys.shape == batch.turn_mask.shape and batch.state_keys.dtype == torch.long
    for i, t in enumerate(trajectories):
        k_reached = turns[i]
        # Turn k of rollout i has tokens exactly where its state key is set.
        has_tokens = [bool((batch.turn_ids[i] == k).any()) for k in range(batch.turn_mask.shape[1])]
        assert has_tokens == (batch.state_keys[i] >= 0).tolist() == batch.turn_mask[i].tolist()
        assert len(batch.observations[i]) == k_reached == len(t.replies)
        # Turn 0: the prompt, state 0; turn k > 0: what the environment said after turn k - 1, and its position.
        assert batch.observations[i][0] == "Walk from 0 to 3."
        positions, pos, rng = [0], 0, random.Random(env.episodes[i].seed)
        for reply in t.replies[:-1]:
            pos += {"L": -1, "R": 1}[reply] * (2 if rng.random() < 0.5 else 1)
            positions.append(pos)
        assert batch.observations[i][1:] == [f"You are at {p}." for p in positions[1:]]
        assert batch.state_keys[i, :k_reached].tolist() == [state_hash(p) for p in positions]
    # Every rollout starts in the same state; rollouts 1 (L R R) and 2 (R L R) reach position -1 by different
    # histories before their last turn: one state, one key. Keys are stable ints (not Python's salted hash).
    assert batch.state_keys[:, 0].unique().numel() == 1
    assert [t.replies for t in trajectories] == [["R", "R", "R"], ["L", "R", "R"], ["R", "L", "R"]]
    assert batch.state_keys[1, 2] == batch.state_keys[2, 2] == state_hash(-1)
    assert state_hash("a") == state_hash("a") != state_hash("b") and 0 <= state_hash((1, "x")) < 2 ** 63


def test_state_keys_and_observations_survive_select_and_cat(codec):
    _, batch = play(Walker(), codec)
    picked = batch.select(torch.tensor([2, 0]))
    assert picked.observations == [batch.observations[2], batch.observations[0]]
    assert picked.state_keys.tolist() == batch.state_keys[[2, 0]].tolist()
    mask = batch.select(torch.tensor([False, True, True]))
    assert mask.observations == batch.observations[1:]
    one_turn = to_batch(run_episodes(Scripted(codec.tokenizer, [["R", "L"]]), codec, SingleTurnEnvironment(), [ROW],
                                     [5], SamplingParams(n=2)), [RewardResult(0.0)] * 2, codec.pad_id)
    hand = batch.select(torch.tensor([0]))
    hand.state_keys, hand.observations = None, []  # a batch not made by the loop
    both = cat_batches([batch, one_turn, hand], codec.pad_id)
    assert both.state_keys.shape == (6, 3)
    assert both.state_keys[:3].tolist() == batch.state_keys.tolist()
    assert both.state_keys[3:5].tolist() == [[state_hash("Walk from 0 to 3."), -1, -1]] * 2
    assert both.state_keys[5].tolist() == [-1, -1, -1]
    assert both.observations == [*batch.observations, ["Walk from 0 to 3."], ["Walk from 0 to 3."], []]


@pytest.mark.parametrize("clonable", [False, True])
def test_an_episode_continues_from_any_intermediate_state(codec, clonable):
    env = Walker(clonable)
    trajectories, batch = play(env, codec)
    for i, t in enumerate(trajectories):
        seed = batch.metadata[i]["seed"]
        for k in range(len(t.replies)):
            # Replaying the first k replies from the same seed reaches the state turn k was sampled in.
            again = resume(env, ROW, seed, t.replies[:k])
            assert state_hash(again.state_key()) == batch.state_keys[i, k].item()
            # ... and goes on as the rollout did.
            assert again.step(t.replies[k]).score == t.turn_scores[k]
    # A fork is independent of its original, and both go on the same way under the same replies.
    first = resume(env, ROW, 3, ["R"])
    other = fork(first, env, ROW, 3, ["R"])
    assert other is not first and other.state_key() == first.state_key()
    a, b = first.step("L"), other.step("L")
    assert a == b and first.state_key() == other.state_key()
    first.step("R")
    assert first.pos != other.pos or first.history != other.history
    if not clonable:
        with pytest.raises(ValueError, match="no clone"):
            fork(first)


def test_replay_gives_the_same_feedback_as_the_rollout(codec):
    env = Walker()
    trajectories, batch = play(env, codec)
    for i, t in enumerate(trajectories):
        episode = resume(env, ROW, batch.metadata[i]["seed"], [])
        scores = [episode.step(r).score for r in t.replies]
        assert scores == t.turn_scores


def test_batched_stepping_equals_single_stepping(codec):
    single, batched = Walker(), BatchedWalker()
    (t1, b1), (t2, b2) = play(single, codec), play(batched, codec)
    assert batched.calls == [len(t1), *[sum(len(t.replies) > k for t in t1) for k in (1, 2)]]  # one call a turn
    for name in ("input_ids", "response_mask", "turn_ids", "state_keys", "turn_scores", "turn_mask"):
        assert torch.equal(getattr(b1, name), getattr(b2, name)), name
    assert b1.observations == b2.observations and [t.replies for t in t1] == [t.replies for t in t2]
    # The default of step_many loops.
    env = Walker()
    episodes = [env.episode(ROW, s) for s in (1, 2)]
    for e in episodes:
        e.reset()
    assert step_many(env, episodes, ["R", "L"]) == [resume(Walker(), ROW, 1, []).step("R"),
                                                    resume(Walker(), ROW, 2, []).step("L")]


def test_episodes_that_raise_end_counted_and_a_failing_batch_ends_each():
    from lit_credit.backends import CountsSince
    from lit_credit.rollout.loop import env_steps

    class Broken(BatchedWalker):
        def step_many(self, episodes, replies):
            raise RuntimeError("remote environment down")

    env = Broken()
    episodes = [env.episode(ROW, s) for s in (1, 2)]
    counts = CountsSince()
    assert env_steps(env, episodes, ["R", "R"]) == [Feedback(done=True)] * 2
    assert counts.take().get("backend/environment/errors") == 2


def test_a_turn_environment_plays_its_step_and_keys_turns_by_observation(codec):
    verdicts = {"5": Verdict(1.0, "Right."), "4": Verdict(0.0, "4 is too low. Try again.")}
    env = RevisionEnvironment(lambda row, reply: verdicts[reply], max_turns=3, stop_on_success=False)
    assert isinstance(env, TurnEnvironment) and isinstance(env, Environment)
    episode = open_episode(env, ROW, 0)
    assert isinstance(episode, TurnEpisode) and isinstance(episode, Episode)
    assert episode.reset() == ROW["prompt"] and episode.state_key() == "Walk from 0 to 3."
    fb = episode.step("4")
    assert fb == env.step(ROW, 0, "4") and episode.state_key() == "4 is too low. Try again." == fb.observation_text()
    assert episode.step("5").messages == env.step(ROW, 1, "5").messages
    # Skipping to turn 2 asks the verifier nothing; the last turn ends the episode.
    skipped = resume(env, ROW, 0, ["?", "?"])
    assert skipped.turn == 2 and skipped.state_key() is None and skipped.step("5").done
    # An environment with only step(row, turn, reply) is played as a turn environment.

    class Legacy:
        max_turns = 1

        def step(self, row, turn, reply):
            return Feedback(done=True, score=float(reply == "5"))

    assert open_episode(Legacy(), ROW, 0).step("5").score == 1.0


def test_verify_continues_the_rollouts_episode(codec):
    env = Walker()
    exp = Experience(Scripted(codec.tokenizer, SCRIPT), env, lambda row, replies, **_: RewardResult(0.0),
                     SamplingParams(n=3), max_turns=3)
    exp.bind(torch.nn.Linear(1, 1), codec.tokenizer)
    batch = exp.rollout_groups([ROW], [0], SamplingParams(n=3, max_new_tokens=4), seeds=[11])
    meta = batch.metadata[0]
    fb = exp.verify(ROW, 1, "R", prefix=meta["replies"][:1], seed=meta["seed"])
    expected = resume(Walker(), ROW, meta["seed"], meta["replies"][:1]).step("R")
    assert fb == expected
    with pytest.raises(ValueError, match="prefix"):
        exp.verify(ROW, 1, "R")  # a stateful episode needs the replies before the turn
    with pytest.raises(ValueError, match="prefix of 0"):
        exp.verify(ROW, 1, "R", prefix=[])


def test_the_episodes_of_one_row_must_start_the_same(codec):
    class SeededStart(Walker):
        def episode(self, row, seed):
            ep = super().episode(row, seed)
            ep.reset = lambda: [{"role": "user", "content": f"board {seed}"}]
            return ep

    with pytest.raises(ValueError, match="start differently"):
        play(SeededStart(), codec)
