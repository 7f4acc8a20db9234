"""Outcome reward of a multi-turn refinement episode, from the environment's per-turn verifier scores."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lit_credit.types import RewardResult


class FinalTurnReward:
    """``score`` = the verifier score of the last turn (the outcome the episode ended with).

    With ``task.stop_on_success=true`` the last turn is the first success or turn ``max_turns``, so
    ``score == best``; with ``false`` every episode runs ``max_turns`` turns and a success that is later
    lost scores the lost turn's value (``score < best``): keeping a right answer is part of the outcome.

    Parts: ``best`` (max over turns), ``first`` (the first turn's score), ``turns`` (turns taken). Unscored
    turns (None) count as 0. The environment must score turns (``math_revise``, ``code_revise``).
    """

    def __call__(self, row: dict[str, Any], replies: list[str], tool_responses: Sequence[str] | None = None,
                 turn_scores: Sequence[float | None] | None = None) -> RewardResult:
        if not turn_scores:
            raise ValueError("reward=final_turn needs per-turn verifier scores: use it with a task whose "
                             "environment scores every turn (task=math_revise or task=code_revise)")
        scores = [float(s or 0.0) for s in turn_scores]
        return RewardResult(scores[-1], {"best": max(scores), "first": scores[0],
                                         "turns": float(len(scores))})
