"""Single-turn arithmetic with an exact-match verifier: the smallest task that proves the RL loop."""
from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator
from typing import Any

import datasets

from lit_credit.tasks.base import Task, heldout_split

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
COMMUTATIVE = frozenset("+*")  # a op b and b op a are one problem for these


def content_key(row: dict[str, Any]) -> tuple[int, str, int]:
    """A row's content key ``(a, op, b)`` read from its prompt ``What is a op b?``, with the operands in
    ascending order for a commutative ``op`` (:data:`COMMUTATIVE`): ``3 + 4`` and ``4 + 3`` are one problem,
    ``7 - 2`` and ``2 - 7`` two."""
    a, op, b = row["prompt"][-1]["content"].removeprefix("What is ").removesuffix("?").split()
    return problem_key(int(a), op, int(b))


def problem_key(a: int, op: str, b: int) -> tuple[int, str, int]:
    """:func:`content_key` of the problem ``a op b``."""
    return (min(a, b), op, max(a, b)) if op in COMMUTATIVE else (a, op, b)


def num_problems(max_operand: int, ops: str) -> int:
    """The distinct problems (content keys) with operands in [0, max_operand]: n = max_operand + 1 ordered
    pairs n^2 per non-commutative op, unordered pairs with repetition n(n+1)/2 per commutative one."""
    n = max_operand + 1
    return sum(math.comb(n + 1, 2) if op in COMMUTATIVE else n * n for op in set(ops))


class ArithTask(Task):
    """``What is a op b?`` with a, b uniform in [0, max_operand]; the gold answer is the integer result.

    A problem is its content key (:func:`content_key`: ``a + b`` and ``b + a`` are one problem), so the space
    is :func:`num_problems` (``max_operand=99, ops="+-"``: 5050 + 10000 = 15050). Test is the first
    ``num_test`` distinct problems of the seeded draw, train the next ``num_train`` (each in the order first
    drawn; ``num_train=None`` takes every problem not held out), so no training prompt is a held-out problem
    in either operand order (:func:`~lit_credit.tasks.base.heldout_split`); nor is any demonstration. Each row:
    ``prompt`` (chat messages), ``answer`` (str), ``id`` (str). Deterministic for a fixed ``seed``.
    """

    name = "arith"

    def __init__(self, num_train: int | None = None, num_test: int = 128, max_operand: int = 99, ops: str = "+-",
                 seed: int = 0) -> None:
        bad = set(ops) - set(_OPS)
        if not ops or bad:
            raise ValueError(f"task.ops={ops!r}: use a non-empty string of {''.join(_OPS)}")
        if max_operand < 1:
            raise ValueError(f"task.max_operand={max_operand}: must be >= 1")
        space = num_problems(max_operand, ops)
        num_train = space - num_test if num_train is None else num_train
        if num_test < 1 or num_train < 1 or num_train + num_test > space:
            raise ValueError(f"task.num_train + task.num_test = {num_train + num_test} must fit the {space} distinct "
                             f"problems (a + b and b + a count once) with both >= 1; raise task.max_operand or "
                             f"lower the counts")
        self.num_train, self.num_test = num_train, num_test
        self.max_operand, self.ops, self.seed = max_operand, ops, seed
        self._splits: dict[str, datasets.Dataset] = {}

    def _problems(self, seed: int) -> Iterable[tuple[int, str, int]]:
        rng = random.Random(seed)
        while True:
            yield rng.randint(0, self.max_operand), rng.choice(self.ops), rng.randint(0, self.max_operand)

    def _rows(self, seed: int) -> Iterator[dict[str, Any]]:
        for problem in self._problems(seed):
            yield self.row(*problem)

    @staticmethod
    def row(a: int, op: str, b: int) -> dict[str, Any]:
        return {"prompt": [{"role": "user", "content": f"What is {a} {op} {b}?"}],
                "answer": str(_OPS[op](a, b)), "id": f"{a}{op}{b}"}

    def dataset(self, split: str) -> datasets.Dataset:
        if split not in ("train", "test"):
            raise ValueError(f"split={split!r}: use 'train' or 'test'")
        if not self._splits:
            # Every key has a positive chance and the counts fit the key space (checked above), so the draw
            # ends; no miss budget (collecting all 15050 keys takes a few hundred thousand draws).
            splits = heldout_split(self._rows(self.seed), content_key, self.num_train, self.num_test,
                                   distinct=content_key, max_misses=math.inf)
            self._splits = {k: datasets.Dataset.from_list(v) for k, v in splits.items()}
        return self._splits[split]

    def demonstrations(self, num: int, seed: int) -> Iterable[dict[str, Any]]:
        held_out = {content_key(row) for row in self.dataset("test")}
        made = 0
        for row in self._rows(seed):
            if content_key(row) in held_out:
                continue
            yield {"messages": [*row["prompt"], {"role": "assistant", "content": row["answer"]}]}
            made += 1
            if made == num:
                return
