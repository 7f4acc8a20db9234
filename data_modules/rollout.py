"""RolloutDataModule: prompts from an HF dataset in, scored RolloutBatches out."""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from lit_credit.backends import CountsSince, Retry, count
from lit_credit.rewards.base import Reward
from lit_credit.rollout.chat import ChatCodec
from lit_credit.rollout.engine import HFEngine, RolloutEngine
from lit_credit.rollout.loop import Episode, run_episodes, to_batch
from lit_credit.tasks.base import Task
from lit_credit.types import RolloutBatch, SamplingParams


def _rows(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return batch


class PromptStream(IterableDataset):
    """An endless stream of prompt batches that a resumed run can re-enter at any batch.

    Batch k holds rows ``order_e[i * b:(i + 1) * b]`` of ``dataset``, where ``e, i = divmod(k, len // b)``
    (a partial last batch is dropped) and ``order_e`` is the (e+1)-th ``torch.randperm`` drawn from a
    generator seeded with ``seed``. The stream starts at batch ``start``, so it is a pure function of
    ``(seed, k)``, whatever was prefetched or lost in a crash.
    """

    def __init__(self, dataset: Any, batch_size: int, seed: int, start: int = 0) -> None:
        if len(dataset) < batch_size:
            raise ValueError(f"data.prompts_per_step={batch_size} but the train split has {len(dataset)} rows; "
                             "fix: lower data.prompts_per_step or use a larger train split")
        self.dataset, self.batch_size, self.seed, self.start = dataset, batch_size, seed, start

    def __iter__(self) -> Iterator[list[dict[str, Any]]]:
        per_epoch, b = len(self.dataset) // self.batch_size, self.batch_size
        epoch, i = divmod(self.start, per_epoch)
        generator = torch.Generator().manual_seed(self.seed)
        for _ in range(epoch):
            torch.randperm(len(self.dataset), generator=generator)
        while True:
            order = torch.randperm(len(self.dataset), generator=generator).tolist()
            for j in range(i, per_epoch):
                yield [self.dataset[k] for k in order[j * b:(j + 1) * b]]
            i = 0


class RolloutDataModule(L.LightningDataModule):
    """Serves prompt rows; ``generate_experience`` turns them into scored rollouts with the current weights.

    The dataloaders yield only prompt rows (plain dicts). Generation happens inside the training step,
    never in the dataloader, because Lightning prefetches the next batch (that would be one step
    off-policy). Group ids are minted here, one per prompt per call, from a running counter.

    Resumable: the train loader is a :class:`PromptStream`; ``state_dict`` (saved in every Lightning
    checkpoint) holds the number of training batches consumed and the group counter, so a resumed run
    draws the prompts the uninterrupted run would have drawn. Engine calls go through ``engine_retry``
    (:class:`~lit_credit.backends.Retry`); a reward that raises scores 0 and non-finite reward values become
    0, each counted (``backend/reward/{errors,nonfinite}``).
    """

    def __init__(self, task: Task, reward: Reward, engine: RolloutEngine | None = None,
                 sampling: SamplingParams | None = None, prompts_per_step: int = 8, max_turns: int | None = None,
                 val_prompts: int = 64, val_sampling: SamplingParams | None = None,
                 max_feedback_tokens: int | None = None, seed: int = 0, engine_retry: Retry | None = None) -> None:
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
        self.engine_retry = engine_retry
        self.backend_counts = CountsSince()  # backend/* failures since the last training step
        self.train_batches = self.next_group = 0
        self._bound: Any = None
        self.codec: ChatCodec | None = None

    def setup(self, stage: str | None = None) -> None:
        self.train_set = self.task.dataset("train")
        test = self.task.dataset("test")
        self.val_set = test.select(range(min(self.val_prompts, len(test))))

    def train_dataloader(self) -> DataLoader:
        stream = PromptStream(self.train_set, self.prompts_per_step, self.seed, start=self.train_batches)
        # Own generators: creating a loader iterator must not draw from the global RNG (exact resume).
        return DataLoader(stream, batch_size=None, collate_fn=_rows, generator=torch.Generator().manual_seed(0))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=max(self.val_prompts, 1), collate_fn=_rows,
                          generator=torch.Generator().manual_seed(0))

    def state_dict(self) -> dict[str, int]:
        return {"train_batches": self.train_batches, "next_group": self.next_group}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.train_batches, self.next_group = state["train_batches"], state["next_group"]

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

        ``sampling=None`` is a training draw (the train sampling; it advances the resumable position).
        The wall time of the call is kept in ``last_generation_s``.
        """
        if self.codec is None:
            raise RuntimeError("RolloutDataModule.generate_experience before bind(model, tokenizer)")
        if sampling is None:
            sampling, self.train_batches = self.sampling, self.train_batches + 1
        start = time.perf_counter()
        groups = list(range(self.next_group, self.next_group + len(rows)))
        self.next_group += len(rows)
        episodes = run_episodes(self.engine, self.codec, self.env, rows, groups, sampling, self.max_turns,
                                self.engine_retry)
        batch = finite_scores(to_batch(episodes, [self.score(e) for e in episodes], self.codec.pad_id))
        self.last_generation_s = time.perf_counter() - start
        return batch

    def score(self, episode: Episode) -> dict[str, Any]:
        """The reward's parts for one episode; a reward that raises scores 0 (``backend/reward/errors``)."""
        try:
            return self.reward(episode.row, episode.replies, tool_responses=episode.tool_responses,
                               turn_scores=episode.turn_scores)
        except Exception:  # a reward bug on odd input is a zero score, counted, never a crash
            count("backend/reward/errors")
            return {"score": 0.0}


def finite_scores(batch: RolloutBatch) -> RolloutBatch:
    """Replace NaN/inf in ``scores``, ``reward_parts`` and ``turn_scores`` by 0, counting the values replaced
    (``backend/reward/nonfinite``), so the credit estimators only ever see finite rewards."""
    def clean(x: torch.Tensor) -> torch.Tensor:
        bad = ~torch.isfinite(x)
        if not bad.any():
            return x
        count("backend/reward/nonfinite", int(bad.sum()))
        return x.masked_fill(bad, 0.0)

    batch.scores = clean(batch.scores)
    batch.reward_parts = {k: clean(v) if v.is_floating_point() else v for k, v in batch.reward_parts.items()}
    if batch.turn_scores is not None:
        batch.turn_scores = clean(batch.turn_scores)
    return batch
