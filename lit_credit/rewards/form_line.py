"""The form oracle: strict and lenient correctness of one Form 1040 line (docs/methods.md §3)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lit_credit.tasks.form import parse_value

LENIENT_DOLLARS = 5


def line_correct(value: float | None, gold: float) -> tuple[bool, bool]:
    """``(strict, lenient)``: ``value == gold`` exactly, and ``|value - gold| <= 5``; both False when None."""
    if value is None:
        return False, False
    return value == gold, abs(value - gold) <= LENIENT_DOLLARS


class FormLineReward:
    """``score = S = 1[x == gold]`` (strict, exact dollars) for the reply's amount ``x`` (:func:`parse_value`).

    Parts: ``strict`` (= score), ``lenient`` (``|x - gold| <= $5``), ``parsable`` (an amount was found).
    A row without a numeric ``gold`` is a data error: ``ValueError`` naming ``row['gold']``.
    """

    def __call__(self, row: dict[str, Any], replies: list[str],
                 tool_responses: Sequence[str] | None = None,
                 turn_scores: Sequence[float | None] | None = None) -> dict[str, float]:
        try:
            gold = float(row["gold"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"row['gold'] = {row.get('gold')!r} is not a number; fix: every form row "
                             "carries its line's gold dollar amount (task=form builds it)") from None
        value = parse_value(replies[-1]) if replies else None
        strict, lenient = line_correct(value, gold)
        return {"score": float(strict), "strict": float(strict), "lenient": float(lenient),
                "parsable": float(value is not None)}
