"""Multi-turn refinement against a verifier (TCPO's setting, methods.md §2), shared by math_revise and
code_revise: each turn the policy answers, the verifier scores the answer in [0, 1] and, unless the answer
succeeded or the turn budget is spent, feeds back a message the policy sees at response mask 0."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lit_credit.tasks.base import Environment, Feedback


@dataclass(frozen=True)
class Verdict:
    """A verifier's judgement of one answer: ``score`` in [0, 1] and the ``feedback`` text shown next turn."""

    score: float
    feedback: str


Verifier = Callable[[dict[str, Any], str], Verdict]


class RevisionEnvironment(Environment):
    """Scores every turn with ``verifier(row, reply)``; the episode ends at ``score >= success`` or after
    ``max_turns`` turns. Otherwise the verdict's feedback is injected as a user message.

    ``Feedback.score`` is the turn score (the rollout loop collects them into ``turn_scores``);
    ``Feedback.info["verdict"]`` keeps the verdict. A verifier that raises scores 0 with feedback
    ``"verifier error: <type>"`` (counted in ``errors``): a bad answer never crashes a rollout.
    """

    def __init__(self, verifier: Verifier, max_turns: int = 3, success: float = 1.0) -> None:
        if max_turns < 1:
            raise ValueError(f"task.max_turns={max_turns}: must be >= 1")
        self.verifier, self.max_turns, self.success = verifier, max_turns, success
        self.errors = 0

    def verdict(self, row: dict[str, Any], reply: str) -> Verdict:
        try:
            return self.verifier(row, reply)
        except Exception as err:  # counted, scored 0
            self.errors += 1
            return Verdict(0.0, f"verifier error: {type(err).__name__}")

    def step(self, row: dict[str, Any], turn: int, reply: str) -> Feedback:
        verdict = self.verdict(row, reply)
        done = verdict.score >= self.success or turn + 1 >= self.max_turns
        messages = [] if done else [{"role": "user", "content": verdict.feedback}]
        return Feedback(done=done, messages=messages, score=float(verdict.score), info={"verdict": verdict})
