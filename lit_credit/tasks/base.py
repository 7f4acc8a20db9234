"""What a task is: prompts (an HF dataset), an environment that answers the policy, and gold demos."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import datasets

from lit_credit.interfaces import Environment
from lit_credit.types import Feedback


class SingleTurnEnvironment(Environment):
    """The default environment: the first reply ends the episode."""

    max_turns: int = 1

    def step(self, row: dict[str, Any], turn: int, reply: str) -> Feedback:
        return Feedback(done=True)


class Task:
    """A source of prompts and the environment that plays against the policy.

    Rows of ``dataset(split)`` hold at least ``prompt`` (a list of chat messages); ``tools`` (a list of
    JSON schemas) is optional. ``demonstrations`` yields whole gold conversations for the SFT warm start.
    """

    name: str = "task"

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
