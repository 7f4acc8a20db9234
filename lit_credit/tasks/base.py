"""What a task is: prompts (an HF dataset), an environment whose episodes answer the policy, and gold demos."""
from __future__ import annotations

import importlib
from collections.abc import Callable, Collection, Hashable, Iterable
from typing import Any

import datasets

from lit_credit.interfaces import Environment, Episode, ToolPrompt, TurnEnvironment, TurnEpisode
from lit_credit.tasks.tool_catalog import TOOL_PROMPT
from lit_credit.types import Feedback

__all__ = ["DEFAULT_FIX", "Environment", "Episode", "Feedback", "SingleTurnEnvironment", "Task", "TurnEnvironment",
           "TurnEpisode", "disjoint_train", "heldout_split"]

DEFAULT_FIX = "raise task.max_operand or lower task.num_train / task.num_test"


class SingleTurnEnvironment(TurnEnvironment):
    """The default environment: the first reply ends the episode."""

    max_turns: int = 1

    def step(self, row: dict[str, Any], turn: int, reply: str) -> Feedback:
        return Feedback(done=True)


class Task:
    """A source of prompts and the environment that plays against the policy (each rollout one of its episodes:
    :class:`~lit_credit.interfaces.Environment`).

    Rows of ``dataset(split)`` hold at least ``prompt`` (a list of chat messages); ``tools`` (a list of
    JSON schemas) is optional. ``demonstrations`` yields whole gold conversations for the SFT warm start (a task
    is the warm start's :class:`~lit_credit.interfaces.Demonstrations`). ``tool_prompt`` is how prompts offer
    their tools (:class:`~lit_credit.interfaces.ToolPrompt`): the data module hands it to the chat codec and the
    warm start to the embedded chat template. Every task shares the project's
    (:data:`~lit_credit.tasks.tool_catalog.TOOL_PROMPT`), a task without tools too, so every embedded tokenizer
    has the same chat template.
    """

    name: str = "task"
    tool_prompt: ToolPrompt = TOOL_PROMPT

    def dataset(self, split: str) -> datasets.Dataset:
        raise NotImplementedError

    def environment(self) -> Environment:
        return SingleTurnEnvironment()

    def demonstrations(self, num: int, seed: int) -> Iterable[dict[str, Any]]:
        """Gold conversations: dicts with ``messages`` (prompt + gold assistant turns) and optional ``tools``."""
        raise NotImplementedError

    def corpus(self, num: int = 2000) -> Iterable[str]:
        """Text the embedded tokenizer is trained on (defaults to the rendered demonstrations)."""
        for demo in self.demonstrations(num, seed=12345):
            yield "\n".join(m["content"] for m in demo["messages"])


def _default_budget(num_train: int | None, num_test: int) -> int:
    return 10_000 + 10 * ((num_train or 0) + num_test)


def disjoint_train(draws: Iterable[dict[str, Any]], key: Callable[[dict[str, Any]], Hashable],
                   held_out: Collection[Hashable], num_train: int | None, *, fix: str = DEFAULT_FIX,
                   where: str = "", distinct: Callable[[dict[str, Any]], Hashable] | None = None,
                   max_misses: float | None = None, num_test: int = 0) -> list[dict[str, Any]]:
    """The training half of :func:`heldout_split`: the first ``num_train`` rows of ``draws`` (in draw order)
    whose content key ``key(row)`` is not in ``held_out``, distinct by ``distinct(row)`` (default: ``row["id"]``);
    ``num_train=None`` takes every such row until the (then finite) draws end. A row that is skipped (held-out
    content or a repeat) is a miss; more than ``max_misses`` of them in all (None: 10,000 + 10 x
    the counts; ``math.inf``: never, for draws known to reach every key) raise a ``ValueError`` that starts with
    ``where`` (default: ``task.num_train=..., task.num_test=...``) and ends with ``fix``, as does an end of the
    draws before ``num_train`` rows."""
    distinct = distinct or (lambda row: row["id"])
    budget = _default_budget(num_train, num_test) if max_misses is None else max_misses
    head = where or f"task.num_train={num_train}, task.num_test={num_test}"
    train: dict[Hashable, dict[str, Any]] = {}
    misses = 0
    if num_train == 0:
        return []
    for row in draws:
        d = distinct(row)
        if d in train or key(row) in held_out:
            misses += 1
            if misses > budget:
                raise ValueError(f"{head}: only {len(train)} training problems with content other than the "
                                 f"{len(held_out)} held-out ones could be drawn; {fix}")
            continue
        train[d] = row
        if len(train) == num_train:
            break
    else:
        if num_train is not None:
            raise ValueError(f"{head}: the draws ended after {len(train)} training problems with content other "
                             f"than the {len(held_out)} held-out ones; {fix}")
    return list(train.values())


def heldout_split(draws: Iterable[dict[str, Any]], key: Callable[[dict[str, Any]], Hashable],
                  num_train: int | None, num_test: int, *, fix: str = DEFAULT_FIX, where: str = "",
                  distinct: Callable[[dict[str, Any]], Hashable] | None = None, max_misses: float | None = None,
                  train_draws: Iterable[dict[str, Any]] | None = None) -> dict[str, list[dict[str, Any]]]:
    """``{"test": [...], "train": [...]}`` from ``draws`` (rows with an ``id``), disjoint in *content*, the one
    split every task uses. ``key(row)`` is the row's content key: what the problem is (what a policy must
    compute or call), with the surface words a template varies (names, items, phrasings) removed.

    The test split is the first ``num_test`` distinct content keys of the draw, one row each (the first drawn),
    so it does not depend on ``num_train``; the training split is then :func:`disjoint_train` over the rest of
    the draw (or over ``train_draws``): rows distinct by ``distinct`` (default ``id``; two surface variants of
    one training content may both train) that never carry a held-out key. Deterministic in the order of the
    draws. Running dry (more than ``max_misses`` skipped draws in total, see :func:`disjoint_train`, or the end
    of finite draws) raises a ``ValueError`` naming ``task.num_train`` / ``task.num_test`` (or ``where``) and
    ``fix``."""
    budget = _default_budget(num_train, num_test) if max_misses is None else max_misses
    head = where or f"task.num_train={num_train}, task.num_test={num_test}"
    it = iter(draws)
    test_keys: set[Hashable] = set()
    test: list[dict[str, Any]] = []
    misses = 0
    if num_test > 0:
        for row in it:
            k = key(row)
            if k in test_keys:
                misses += 1
                if misses > budget:
                    raise ValueError(f"{head}: only {len(test)} distinct held-out content keys could be drawn; "
                                     f"{fix}")
                continue
            test_keys.add(k)
            test.append(row)
            if len(test) == num_test:
                break
        else:
            raise ValueError(f"{head}: the draws ended after {len(test)} distinct held-out content keys; {fix}")
    train = disjoint_train(it if train_draws is None else train_draws, key, test_keys, num_train, fix=fix,
                           where=where, distinct=distinct, max_misses=budget - misses, num_test=num_test)
    return {"test": test, "train": train}


def optional_package(module: str, task: str, requirement: str) -> Any:
    """``module`` imported, or an ImportError naming ``task=...`` and how to install ``requirement`` (the field's
    environments come with ``make install``, the ``agents`` extra)."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(f"task={task} needs {requirement}: make install (the agents extra), or pip install "
                          f"{requirement}") from err

