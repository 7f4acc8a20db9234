"""The Reward protocol: one finished episode in, named reward parts out (``score`` is the total)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Reward(Protocol):
    """Scores one episode. ``replies`` are the assistant turns' texts, in order; ``tool_responses`` are
    the environment's answers the policy saw (tool outputs, in order), for rewards that judge their use;
    ``turn_scores`` are the environment's per-turn verifier scores (None where a turn was not scored).

    Returns a dict that always holds ``score``; other keys are reward parts: a float (logged, [B] in the
    batch) or a list of floats, one per turn (right-padded with 0 into [B, K] in the batch).
    Bad model output is never an exception: it scores 0 and the reason is a part (e.g. ``format``).
    """

    def __call__(self, row: dict[str, Any], replies: list[str],
                 tool_responses: Sequence[str] | None = None,
                 turn_scores: Sequence[float | None] | None = None) -> dict[str, float]: ...
