"""Single-turn arithmetic with an exact-match verifier: the smallest task that proves the RL loop."""
from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

import datasets

from lit_credit.tasks.base import Task

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


class ArithTask(Task):
    """``What is a op b?`` with a, b uniform in [0, max_operand]; the gold answer is the integer result.

    Train and test problems are disjoint; ``num_train=None`` takes every problem not held out. Each row: ``prompt`` (chat messages), ``answer`` (str),
    ``id`` (str). Deterministic for a fixed ``seed``.
    """

    name = "arith"

    def __init__(self, num_train: int | None = None, num_test: int = 128, max_operand: int = 99, ops: str = "+-",
                 seed: int = 0) -> None:
        bad = set(ops) - set(_OPS)
        if not ops or bad:
            raise ValueError(f"task.ops={ops!r}: use a non-empty string of {''.join(_OPS)}")
        if max_operand < 1:
            raise ValueError(f"task.max_operand={max_operand}: must be >= 1")
        space = len({(a, op, b) for a in range(max_operand + 1) for op in ops for b in range(max_operand + 1)})
        num_train = space - num_test if num_train is None else num_train
        if num_test < 1 or num_train < 1 or num_train + num_test > space:
            raise ValueError(f"task.num_train + task.num_test = {num_train + num_test} must fit the {space} distinct "
                             f"problems with both >= 1; raise task.max_operand or lower the counts")
        self.num_train, self.num_test = num_train, num_test
        self.max_operand, self.ops, self.seed = max_operand, ops, seed
        self._splits: dict[str, datasets.Dataset] = {}

    def _problems(self, seed: int) -> Iterable[tuple[int, str, int]]:
        rng = random.Random(seed)
        while True:
            yield rng.randint(0, self.max_operand), rng.choice(self.ops), rng.randint(0, self.max_operand)

    @staticmethod
    def row(a: int, op: str, b: int) -> dict[str, Any]:
        return {"prompt": [{"role": "user", "content": f"What is {a} {op} {b}?"}],
                "answer": str(_OPS[op](a, b)), "id": f"{a}{op}{b}"}

    def dataset(self, split: str) -> datasets.Dataset:
        if split not in ("train", "test"):
            raise ValueError(f"split={split!r}: use 'train' or 'test'")
        if not self._splits:
            seen: dict[tuple[int, str, int], None] = {}
            for problem in self._problems(self.seed):
                seen.setdefault(problem)
                if len(seen) == self.num_test + self.num_train:
                    break
            problems = list(seen)
            self._splits = {
                "test": datasets.Dataset.from_list([self.row(*p) for p in problems[: self.num_test]]),
                "train": datasets.Dataset.from_list([self.row(*p) for p in problems[self.num_test:]]),
            }
        return self._splits[split]

    def demonstrations(self, num: int, seed: int) -> Iterable[dict[str, Any]]:
        held_out = set(self.dataset("test")["id"])
        made = 0
        for problem in self._problems(seed):
            row = self.row(*problem)
            if row["id"] in held_out:
                continue
            yield {"messages": [*row["prompt"], {"role": "assistant", "content": row["answer"]}]}
            made += 1
            if made == num:
                return
