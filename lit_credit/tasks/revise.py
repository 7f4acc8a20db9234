"""Multi-turn refinement against a verifier (TCPO's setting), shared by math_revise and code_revise: each turn
the policy answers, the verifier scores the answer in [0, 1] and, unless the episode ends, feeds back a
message the policy sees at response mask 0.

Two episode protocols (``task.stop_on_success``):

- ``true``: the episode ends at the first success (``score >= success``) or after ``max_turns`` turns. No
  turn can then follow a success, so no turn is ever *maintained* or *regressed*.
- ``false`` (continue after success): every episode runs ``max_turns`` turns. After a successful turn the
  verifier's own success message (e.g. ``"Your answer is correct."``) is shown, which tells the policy its
  answer is right and nothing more, and the episode goes on; the final turn's score is the outcome
  (``reward=final_turn``), so a kept success can be told apart from a regression after success.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lit_credit.backends import NotRetried
from lit_credit.tasks.base import Feedback, TurnEnvironment


@dataclass(frozen=True)
class Verdict:
    """A verifier's judgement of one answer: ``score`` in [0, 1] and the ``feedback`` text shown next turn."""

    score: float
    feedback: str


Verifier = Callable[[dict[str, Any], str], Verdict]


def check_stop_on_success(value: object) -> bool:
    """``task.stop_on_success`` itself, when it is a bool; a clear error otherwise."""
    if not isinstance(value, bool):
        raise ValueError(f"task.stop_on_success={value!r}: use true (end at the first success) or false "
                         "(continue to task.max_turns turns; the final turn's score decides)")
    return value


class RevisionEnvironment(TurnEnvironment):
    """Scores every turn with ``verifier(row, reply)``; the episode ends after ``max_turns`` turns, and also
    at the first ``score >= success`` when ``stop_on_success``. Otherwise the verdict's feedback (on a success:
    the verifier's neutral success message) is injected as a user message.

    ``Feedback.score`` is the turn score (the rollout loop collects them into ``turn_scores``);
    ``Feedback.info["verdict"]`` keeps the verdict. A verifier that raises scores 0 with feedback
    ``"verifier error: <type>"`` (counted in ``errors``): a bad answer never crashes a rollout.
    """

    def __init__(self, verifier: Verifier, max_turns: int = 3, success: float = 1.0,
                 stop_on_success: bool = True) -> None:
        if max_turns < 1:
            raise ValueError(f"task.max_turns={max_turns}: must be >= 1")
        self.verifier, self.max_turns, self.success = verifier, max_turns, success
        self.stop_on_success = check_stop_on_success(stop_on_success)
        self.errors = 0

    def verdict(self, row: dict[str, Any], reply: str) -> Verdict:
        try:
            return self.verifier(row, reply)
        except NotRetried:
            raise
        except Exception as err:  # counted, scored 0
            self.errors += 1
            return Verdict(0.0, f"verifier error: {type(err).__name__}")

    def step(self, row: dict[str, Any], turn: int, reply: str) -> Feedback:
        verdict = self.verdict(row, reply)
        solved = verdict.score >= self.success
        done = (solved and self.stop_on_success) or turn + 1 >= self.max_turns
        messages = [] if done else [{"role": "user", "content": verdict.feedback}]
        return Feedback(done=done, messages=messages, score=float(verdict.score), info={"verdict": verdict})
