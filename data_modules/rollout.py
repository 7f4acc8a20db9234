"""RolloutDataModule: prompts from an HF dataset in, scored RolloutBatches out."""
from __future__ import annotations

import itertools
import time
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from lit_credit.rewards.base import Reward
from lit_credit.rollout.chat import ChatCodec
from lit_credit.rollout.engine import HFEngine, RolloutEngine
from lit_credit.rollout.loop import run_episodes, to_batch
from lit_credit.tasks.base import Task
from lit_credit.types import RolloutBatch, SamplingParams


def _rows(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return batch


class RolloutDataModule(L.LightningDataModule):
    """Serves prompt rows; ``generate_experience`` turns them into scored rollouts with the current weights.

    The dataloaders yield only prompt rows (plain dicts). Generation happens inside the training step,
    never in the dataloader, because Lightning prefetches the next batch (that would be one step
    off-policy). Group ids are minted here, one per prompt per call, from a running counter.
    """

    def __init__(self, task: Task, reward: Reward, engine: RolloutEngine | None = None,
                 sampling: SamplingParams | None = None, prompts_per_step: int = 8, max_turns: int | None = None,
                 val_prompts: int = 64, val_sampling: SamplingParams | None = None,
                 max_feedback_tokens: int | None = None, seed: int = 0) -> None:
        super().__init__()
        self.task, self.reward = task, reward
        self.engine = engine if engine is not None else HFEngine()
        self.sampling = sampling if sampling is not None else SamplingParams()
        if self.sampling.n < 2:
            raise ValueError(f"data.sampling.n={self.sampling.n}: GRPO needs at least 2 rollouts per prompt "
                             "(group size); set data.sampling.n=2 or more")
        if prompts_per_step < 1:
            raise ValueError(f"data.prompts_per_step={prompts_per_step}: must be >= 1")
        self.prompts_per_step, self.val_prompts, self.seed = prompts_per_step, val_prompts, seed
        self.max_feedback_tokens = max_feedback_tokens
        self.env = task.environment()
        self.max_turns = max_turns if max_turns is not None else self.env.max_turns
        self.val_sampling = val_sampling or SamplingParams(n=1, greedy=True,
                                                           max_new_tokens=self.sampling.max_new_tokens,
                                                           stop=self.sampling.stop)
        self._next_group = itertools.count()
        self._bound: Any = None
        self.codec: ChatCodec | None = None

    def setup(self, stage: str | None = None) -> None:
        self.train_set = self.task.dataset("train")
        test = self.task.dataset("test")
        self.val_set = test.select(range(min(self.val_prompts, len(test))))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.prompts_per_step, shuffle=True, drop_last=True,
                          collate_fn=_rows, generator=torch.Generator().manual_seed(self.seed))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=max(self.val_prompts, 1), collate_fn=_rows)

    def bind(self, model: torch.nn.Module, tokenizer: Any) -> None:
        """Give the engine the policy (once) and weights after every optimiser step."""
        if self._bound is not model:
            self.engine.bind(model, tokenizer)
            self.codec, self._bound = ChatCodec(tokenizer, self.max_feedback_tokens), model

    def sync_weights(self, model: torch.nn.Module) -> None:
        self.engine.update_weights(model)

    @torch.no_grad()
    def generate_experience(self, rows: list[dict[str, Any]], sampling: SamplingParams | None = None) -> RolloutBatch:
        """Sample ``sampling.n`` rollouts per row, run the environment, score them: a RolloutBatch on CPU.

        The wall time of the call is kept in ``last_generation_s``.
        """
        if self.codec is None:
            raise RuntimeError("RolloutDataModule.generate_experience before bind(model, tokenizer)")
        sampling = sampling or self.sampling
        start = time.perf_counter()
        groups = [next(self._next_group) for _ in rows]
        episodes = run_episodes(self.engine, self.codec, self.env, rows, groups, sampling, self.max_turns)
        rewards = [self.reward(e.row, e.replies, tool_responses=e.tool_responses, turn_scores=e.turn_scores) for e in episodes]
        self.last_generation_s = time.perf_counter() - start
        return to_batch(episodes, rewards, self.codec.pad_id)
