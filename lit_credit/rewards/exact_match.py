"""Exact-match verifier for integer answers."""
from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from lit_credit.types import RewardResult

_INT = re.compile(r"-?\d+")


def parse_final_integer(text: str) -> int | None:
    """The last integer in ``text`` (sign included), or None when there is none, or when it is too long for
    ``int`` (over Python's 4300-digit conversion limit: a degenerate reply scores 0, it does not crash)."""
    found = _INT.findall(text)
    try:
        return int(found[-1]) if found else None
    except ValueError:
        return None


class ExactMatchReward:
    """``score = 1`` when the last integer of the final reply equals ``row['answer']``, else 0.

    Parts: ``correct`` (same as score), ``format`` (1 when the reply is exactly one integer).
    """

    def __call__(self, row: dict[str, Any], replies: list[str],
                 tool_responses: Sequence[str] | None = None,
                 turn_scores: Sequence[float | None] | None = None) -> RewardResult:
        reply = replies[-1].strip() if replies else ""
        value = parse_final_integer(reply)
        correct = float(value is not None and str(value) == str(row["answer"]).strip())
        return RewardResult(correct, {"correct": correct, "format": float(bool(_INT.fullmatch(reply)))})
