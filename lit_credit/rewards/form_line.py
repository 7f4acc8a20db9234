"""The form oracle: strict and lenient correctness of one Form 1040 line (docs/methods.md §3), and the
parsers of a dollar amount (a reply's, a TaxCalcBench value's) that the form task and the oracle share."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from lit_credit.types import RewardResult

LENIENT_DOLLARS = 5


def parse_dollars(value: object) -> float | None:
    """Parse ``1234``, ``1234.0``, ``"$1,234"``, ``"1234.00"``, ``"-$5"`` -> float; ``None`` if unparsable."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if not isinstance(value, str):
        return None
    s = value.strip().replace(",", "").replace(" ", "")
    negative = s.startswith("-")
    s = s.lstrip("-").lstrip("$")
    try:
        x = float(s)
    except ValueError:
        return None
    if not math.isfinite(x):
        return None
    return -x if negative else x


def parse_value(text: str) -> float | None:
    """A proposed or revised amount: the reply's first line as dollars (``$1,234`` allowed), else None (also
    for a non-string reply)."""
    if not isinstance(text, str):
        return None
    first = text.strip().splitlines()[0] if text.strip() else ""
    return parse_dollars(first)


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
                 turn_scores: Sequence[float | None] | None = None) -> RewardResult:
        try:
            gold = float(row["gold"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"row['gold'] = {row.get('gold')!r} is not a number; fix: every form row "
                             "carries its line's gold dollar amount (task=form builds it)") from None
        value = parse_value(replies[-1]) if replies else None
        strict, lenient = line_correct(value, gold)
        return RewardResult(float(strict), {"strict": float(strict), "lenient": float(lenient),
                                            "parsable": float(value is not None)})
