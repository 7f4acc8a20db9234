"""The greedy pairing of gold calls with predicted calls that HierR's key/value components use (and BFCL's rules
under HierR, :mod:`lit_credit.rewards.bfcl_checker`)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
C = TypeVar("C")


def greedy_pair_means(targets: Sequence[T], candidates: Sequence[C],
                      score: Callable[[T, C], tuple[float, float] | None]) -> tuple[float, float]:
    """Mean ``(key, value)`` over ``targets`` (non-empty): each target, in order, takes the unused candidate whose
    ``score(target, candidate)`` (None: not a candidate for it) has the largest ``key + value``, only when that sum
    is above 0 (the first on a tie), and uses it up; a target left unpaired scores (0, 0)."""
    used: set[int] = set()
    key = value = 0.0
    for target in targets:
        best_k = best_v = 0.0
        best_j: int | None = None
        for j, candidate in enumerate(candidates):
            scored = None if j in used else score(target, candidate)
            if scored is not None and scored[0] + scored[1] > best_k + best_v:
                (best_k, best_v), best_j = scored, j
        if best_j is not None:
            used.add(best_j)
        key, value = key + best_k, value + best_v
    return key / len(targets), value / len(targets)
