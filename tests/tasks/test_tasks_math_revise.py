"""math_revise's episode protocols: stop at the first success (task.stop_on_success=true) or continue to
max_turns turns after a neutral "correct" (false), through the environment, the real rollout loop, the
final-turn reward, the SFT demonstrations and the embedded policy's cache key."""
from __future__ import annotations

import pytest
import torch

from lit_credit.models import build_tokenizer
from lit_credit.models.embedded import EmbeddedPolicy
from lit_credit.rewards import FinalTurnReward
from lit_credit.rollout import ChatCodec, run_episodes, to_batch
from lit_credit.tasks import MathReviseTask
from lit_credit.tasks.math_revise import CORRECT, math_verdict
from lit_credit.tasks.revise import RevisionEnvironment
from lit_credit.types import Completion, SamplingParams

ROW = {"prompt": [{"role": "user", "content": "What is 2 + 3?"}], "answer": "5", "id": "2+3"}


def test_continue_mode_says_correct_and_goes_on_to_max_turns():
    env = RevisionEnvironment(math_verdict, max_turns=3, stop_on_success=False)
    first = env.step(ROW, 0, "5")
    # A right answer before the last turn: scored 1, answered neutrally, the episode goes on.
    assert (first.done, first.score, first.messages) == (False, 1.0, [{"role": "user", "content": CORRECT}])
    assert CORRECT == "Your answer is correct."  # says it is right, and nothing more (no "stop", no hint)
    assert env.step(ROW, 1, "5").done is False
    assert env.step(ROW, 2, "5").done is True  # turn K = 3 ends it, right or wrong
    assert env.step(ROW, 2, "7").done is True
    miss = env.step(ROW, 1, "7")  # a regression after success gets the ordinary hint
    assert (miss.done, miss.score, miss.messages[0]["content"]) == (False, 0.0, "7 is too high. Try again.")


def test_stop_mode_is_unchanged():
    env = RevisionEnvironment(math_verdict, max_turns=3)  # stop_on_success=True is the default
    right = env.step(ROW, 0, "5")
    assert (right.done, right.score, right.messages) == (True, 1.0, [])
    assert env.step(ROW, 0, "4").done is False and env.step(ROW, 2, "4").done is True
    assert MathReviseTask(num_train=20, num_test=5).environment().stop_on_success is True


@pytest.mark.parametrize("bad", ["false", 0, None])
def test_stop_on_success_must_be_a_bool(bad):
    with pytest.raises(ValueError, match=r"task\.stop_on_success"):
        MathReviseTask(num_train=20, num_test=5, stop_on_success=bad)
    with pytest.raises(ValueError, match=r"task\.stop_on_success"):
        RevisionEnvironment(math_verdict, stop_on_success=bad)


class Scripted:
    """A rollout engine that replies from a script: ``script[call][j]`` is the text of the j-th completion of
    engine call ``call`` (call 0 samples the n episodes of one prompt, later calls one turn per active one)."""

    def __init__(self, tokenizer, script: list[list[str]]) -> None:
        self.tokenizer, self.script, self.calls = tokenizer, script, 0

    def completion(self, text: str) -> Completion:
        ids = [*self.tokenizer(text, add_special_tokens=False)["input_ids"], self.tokenizer.eos_token_id]
        return Completion(ids, [0.0] * len(ids), text)

    def generate(self, prompts, sampling, seeds=None):
        texts, self.calls = self.script[self.calls], self.calls + 1
        if sampling.n > 1:
            return [[self.completion(x) for x in texts]]
        return [[self.completion(x)] for x in texts]


def play(stop_on_success: bool, script: list[list[str]]):
    tok = build_tokenizer(["What is 2 + 3?", "5 7 6", CORRECT, "is too high. Try again."] * 10, 300)
    codec, engine = ChatCodec(tok), Scripted(tok, script)
    env = RevisionEnvironment(math_verdict, max_turns=3, stop_on_success=stop_on_success)
    episodes = run_episodes(engine, codec, env, [ROW], [0], SamplingParams(n=3, max_new_tokens=4), max_turns=3)
    return episodes, codec, engine


# KEPT answers 5, 5, 5; LOST 5, 7, 7 (a regression after success); LATE 6, 6, 5.
SCRIPT = [["5", "5", "6"], ["5", "7", "6"], ["5", "7", "5"]]


def test_continue_mode_episodes_run_k_turns_and_the_final_turn_decides():
    episodes, codec, engine = play(False, SCRIPT)
    assert engine.calls == 3 and [ep.replies for ep in episodes] == [["5", "5", "5"], ["5", "7", "7"],
                                                                     ["6", "6", "5"]]
    assert [ep.turn_scores for ep in episodes] == [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]
    # The neutral verdict is in the kept episode's tokens, at response mask 0.
    said = codec.feedback_ids([{"role": "user", "content": CORRECT}])
    kept = episodes[0]
    at = next(i for i in range(len(kept.token_ids)) if kept.token_ids[i:i + len(said)] == said)
    assert set(kept.response_mask[at:at + len(said)]) == {0}
    reward = FinalTurnReward()
    parts = [reward(ep.row, ep.replies, turn_scores=ep.turn_scores) for ep in episodes]
    # final-turn score: KEPT 1, LOST 0 (its turn-1 success does not count), LATE 1; best is 1 for all three.
    assert [p.score for p in parts] == [1.0, 0.0, 1.0] and [p.parts["best"] for p in parts] == [1.0] * 3
    batch = to_batch(episodes, parts, codec.pad_id)
    assert batch.turn_mask.all() and batch.scores.tolist() == [1.0, 0.0, 1.0]


def test_stop_mode_episodes_end_at_the_first_success():
    episodes, _, engine = play(True, [*SCRIPT[:1], ["6"], ["5"]])  # only LATE is still playing after turn 1
    assert engine.calls == 3 and [ep.turn_scores for ep in episodes] == [[1.0], [1.0], [0.0, 0.0, 1.0]]
    batch = to_batch(episodes, [FinalTurnReward()(ep.row, ep.replies, turn_scores=ep.turn_scores)
                                for ep in episodes], 0)
    assert batch.turn_mask.tolist() == [[True, False, False], [True, False, False], [True, True, True]]
    assert torch.equal(batch.scores, batch.reward_parts["best"])  # stopping at success: final == best


def test_continue_mode_demonstrations_keep_the_right_answer():
    task = MathReviseTask(num_train=300, num_test=30, max_turns=3, seed=1, stop_on_success=False)
    demos = list(task.demonstrations(200, seed=0))
    env = task.environment()
    revised = 0
    for demo in demos:
        _prompt, *turns = demo["messages"]
        # Every demonstration plays the whole protocol: 3 assistant turns with the verifier's message between.
        assert [m["role"] for m in turns] == ["assistant", "user"] * 2 + ["assistant"]
        replies, said = [m["content"] for m in turns[::2]], [m["content"] for m in turns[1::2]]
        row = {"answer": replies[-1]}
        scores = [env.step(row, k, r).score for k, r in enumerate(replies)]
        first = scores.index(1.0)
        assert first <= 1 and all(s == 1.0 for s in scores[first:])  # right, then kept to the end
        assert set(replies[first:]) == {replies[-1]}
        # each message is exactly what the environment answers that turn's reply
        assert said == [env.step(row, k, r).messages[0]["content"] for k, r in enumerate(replies[:-1])]
        assert said[first:] == [CORRECT] * (2 - first)
        revised += first == 1
    assert 0.25 < revised / len(demos) < 0.55  # revise_frac 0.4
    assert any(CORRECT in text for text in task.corpus(50))  # the tokenizer is trained on the new message
    # Stop mode: the demonstrations are as before (one right answer, or a revision), with no CORRECT.
    stopped = list(MathReviseTask(num_train=300, num_test=30, max_turns=3, seed=1).demonstrations(200, seed=0))
    assert {len(d["messages"]) for d in stopped} == {2, 4}
    assert not any(CORRECT in m["content"] for d in stopped for m in d["messages"])
    single = MathReviseTask(num_train=300, num_test=30, max_turns=1, seed=1, stop_on_success=False)
    assert {len(d["messages"]) for d in single.demonstrations(20, seed=0)} == {2}  # K = 1: nothing to keep


def test_the_embedded_cache_key_follows_the_protocol():
    def path(**kw):
        return EmbeddedPolicy(MathReviseTask(num_train=20, num_test=5, **kw), cache_dir="/tmp/unused").path

    # The demonstrations (and so the tokenizer corpus and the SFT data) differ: a different cache directory.
    assert path(stop_on_success=False) != path(stop_on_success=True)
    assert path(stop_on_success=False) == path(stop_on_success=False)


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
