"""RolloutDataModule: prompts from an HF dataset in, scored RolloutBatches out."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from lit_credit.backends import Retry
from lit_credit.distributed import world
from lit_credit.interfaces import Reward, RolloutEngine
from lit_credit.rollout import Experience, HFEngine
from lit_credit.tasks.base import Task
from lit_credit.types import SamplingParams


def _rows(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return batch


class OneBatch(IterableDataset):
    """A dataset of one batch: ``rows``, whole."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def __iter__(self) -> Iterator[list[dict[str, Any]]]:
        yield self.rows


class PromptStream(IterableDataset):
    """An endless stream of prompt batches, each handed out once, that a resumed run can re-enter exactly.

    Batch k holds rows ``order_e[i * b:(i + 1) * b]`` of ``dataset``, where ``e, i = divmod(k, len // b)``
    (a partial last batch is dropped) and ``order_e`` is the (e+1)-th ``torch.randperm`` drawn from a
    generator seeded with ``seed``: a pure function of ``(seed, k)`` (:meth:`batch`).

    Two readers share one position, so no batch (and no prompt within an epoch) is handed out twice: the
    dataloader iterating the stream and :meth:`draw` (DAPO's refills inside a training step). ``position`` is
    ``{"next_batch": first index not handed out yet, "pending": indices the dataloader yielded that no
    training step has consumed yet}``; Lightning prefetches one batch, so ``pending`` holds it. A new iterator
    yields ``pending`` again first, then fresh batches: a run resumed from a checkpointed position serves what
    the uninterrupted run would have, whatever was prefetched or lost in a crash. The training step's draw
    (:meth:`~lit_credit.rollout.Experience.draw`) removes the oldest pending index (:meth:`consume`).
    """

    def __init__(self, dataset: Any, batch_size: int, seed: int, position: dict[str, Any] | None = None) -> None:
        if len(dataset) < batch_size:
            raise ValueError(f"data.prompts_per_step={batch_size} but the train split has {len(dataset)} rows; "
                             "fix: lower data.prompts_per_step or use a larger train split")
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed
        self.position = position if position is not None else {"next_batch": 0, "pending": []}
        self.per_epoch = len(dataset) // batch_size
        self._epoch: tuple[int, torch.Generator, list[int]] | None = None  # the last epoch's order, cached

    def _order(self, epoch: int) -> list[int]:
        if self._epoch is None or self._epoch[0] > epoch:  # restart the permutations from the seed
            generator = torch.Generator().manual_seed(self.seed)
            self._epoch = (0, generator, torch.randperm(len(self.dataset), generator=generator).tolist())
        while self._epoch[0] < epoch:
            e, generator, _ = self._epoch
            self._epoch = (e + 1, generator, torch.randperm(len(self.dataset), generator=generator).tolist())
        return self._epoch[2]

    def batch(self, k: int) -> list[dict[str, Any]]:
        """The rows of batch ``k`` (see the class docstring)."""
        epoch, i = divmod(k, self.per_epoch)
        order, b = self._order(epoch), self.batch_size
        return [self.dataset[j] for j in order[i * b:(i + 1) * b]]

    def _take(self) -> int:
        k = self.position["next_batch"]
        self.position["next_batch"] = k + 1
        return k

    def draw(self) -> list[dict[str, Any]]:
        """The next batch no reader has had yet (never served by the dataloader afterwards)."""
        return self.batch(self._take())

    def consume(self) -> None:
        """A training step drew the oldest batch the dataloader yielded: it leaves ``pending``."""
        del self.position["pending"][:1]

    def __iter__(self) -> Iterator[list[dict[str, Any]]]:
        pending = self.position["pending"]
        replay = list(pending)
        pending.clear()
        while True:
            k = replay.pop(0) if replay else self._take()
            pending.append(k)
            yield self.batch(k)


class RolloutDataModule(L.LightningDataModule):
    """The Lightning side of the experience layer: serves prompt rows and holds :attr:`experience` (a
    :class:`~lit_credit.rollout.Experience`), which turns them into scored rollouts with the current weights.

    The dataloaders yield only prompt rows (plain dicts). Generation happens inside the training step, never in
    the dataloader, because Lightning prefetches the next batch (that would be one step off-policy); the module
    draws through ``experience`` (its ``draw``, ``refill``, ``draw_validation``, ``sampled_validation``: group
    ids, per-group seeds, each rank's share, the engine's retries and failure counts, sleep / wake, the chat
    codec that writes prompts' tools with the task's ``tool_prompt``, scoring; a reward that raises scores 0 and
    non-finite reward values become 0, each counted in ``backend/reward/{errors,nonfinite}``). What it samples
    with is set there: ``datamodule.experience.engine``, ``.reward``, ``.env``, ``.sampling``.

    Resumable: the train loader is a :class:`PromptStream`; ``state_dict`` (saved in every Lightning
    checkpoint) holds its position (``next_batch``, ``pending``) and the experience layer's group counter, so a
    resumed run draws the prompts and group ids the uninterrupted run would have drawn. The experience layer's
    refills (DAPO's dynamic sampling) draw further batches of the same stream inside a training step; the
    dataloader never serves them, so no prompt is drawn twice within an epoch.

    Several processes (data parallel): every rank iterates the same stream and is handed the step's whole
    prompt batch; ``setup`` gives the experience layer this process's rank (each rank generates its contiguous
    share of whole groups; ``prompts_per_step`` must divide by the world size); the stream's position and the
    group counter are the same on every rank. Validation rows are split the same way (as evenly as can be).

    Validation: the test split's first ``val_prompts`` rows (a fixed held-out set), greedy (``val_sampling``),
    and with ``val_samples > 0`` also ``val_samples`` samples per prompt at temperature 1, top-p 1, isolated from
    the training RNG; ``val_success`` is the normalised score at which a sampled rollout counts as solved for
    ``pass@k`` (the experience layer's settings).
    """

    def __init__(self, task: Task, reward: Reward, engine: RolloutEngine | None = None,
                 sampling: SamplingParams | None = None, prompts_per_step: int = 8, max_turns: int | None = None,
                 val_prompts: int = 64, val_sampling: SamplingParams | None = None,
                 max_feedback_tokens: int | None = None, seed: int = 0, engine_retry: Retry | None = None,
                 val_samples: int = 0, val_success: float = 1.0) -> None:
        super().__init__()
        sampling = sampling if sampling is not None else SamplingParams()
        if sampling.n < 2:
            raise ValueError(f"data.sampling.n={sampling.n}: GRPO needs at least 2 rollouts per prompt "
                             "(group size); set data.sampling.n=2 or more")
        if prompts_per_step < 1:
            raise ValueError(f"data.prompts_per_step={prompts_per_step}: must be >= 1")
        if max_turns is not None and max_turns < 1:
            raise ValueError(f"data.max_turns={max_turns}: must be >= 1 or null (the environment's own limit)")
        if val_samples < 0:
            raise ValueError(f"data.val_samples={val_samples}: must be >= 0 (0: no sampled validation; the "
                             "comparison protocol uses 8 samples per held-out prompt)")
        self.task, self.prompts_per_step, self.val_prompts, self.seed = task, prompts_per_step, val_prompts, seed
        env = task.environment()
        self.experience = Experience(engine if engine is not None else HFEngine(), env, reward, sampling,
                                     max_turns if max_turns is not None else env.max_turns, engine_retry,
                                     max_feedback_tokens, task.tool_prompt, seed=seed, val_sampling=val_sampling,
                                     val_samples=val_samples, val_success=val_success)
        self.position: dict[str, Any] = {"next_batch": 0, "pending": []}  # PromptStream's, shared and saved

    def setup(self, stage: str | None = None) -> None:
        rank, world_size = world()
        if self.prompts_per_step % world_size:
            raise ValueError(f"data.prompts_per_step={self.prompts_per_step} does not divide over {world_size} "
                             "processes (each rank draws whole prompt groups, an equal share); fix: a multiple of "
                             f"{world_size}, e.g. data.prompts_per_step="
                             f"{max(world_size, self.prompts_per_step // world_size * world_size)}")
        self.train_set = self.task.dataset("train")
        test = self.task.dataset("test")
        self.val_set = test.select(range(min(self.val_prompts, len(test))))
        self.stream = PromptStream(self.train_set, self.prompts_per_step, self.seed, self.position)
        self.experience.attach(self.stream, rank, world_size)

    def teardown(self, stage: str | None = None) -> None:
        """The end of ``fit``: close the rollout engine (vLLM: its engine, process groups and memory), so that the
        next job of a local ``-m`` sweep starts on a clean process; an engine that was bound rebinds at its next
        use. Other stages keep it (``validate_first`` validates before the fit)."""
        close = getattr(self.experience.engine, "close", None)
        if stage == "fit" and close is not None:
            close()

    def train_dataloader(self) -> DataLoader:
        # Own generators: creating a loader iterator must not draw from the global RNG (exact resume).
        return DataLoader(self.stream, batch_size=None, collate_fn=_rows, generator=torch.Generator().manual_seed(0))

    def val_dataloader(self) -> DataLoader:
        # One batch of every held-out row on every rank (the experience layer splits it): an iterable dataset,
        # so Lightning adds no DistributedSampler that would split it a second time.
        return DataLoader(OneBatch([self.val_set[i] for i in range(len(self.val_set))]), batch_size=None,
                          collate_fn=_rows)

    def state_dict(self) -> dict[str, Any]:
        return {"next_batch": self.position["next_batch"], "pending": list(self.position["pending"]),
                "next_group": self.experience.next_group}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # In place: the stream shares ``position``. A checkpoint of the older format counted train_batches only.
        self.position["next_batch"] = state.get("next_batch", state.get("train_batches", 0))
        self.position["pending"][:] = state.get("pending", [])
        self.experience.next_group = state["next_group"]
