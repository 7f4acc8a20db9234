"""RolloutDataModule: prompts from an HF dataset in, scored RolloutBatches out."""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import fields
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from lit_credit.backends import CountsSince, Retry, count
from lit_credit.models.chat import ChatCodec
from lit_credit.rewards.base import Reward
from lit_credit.rollout.engine import HFEngine, RolloutEngine
from lit_credit.rollout.loop import Episode, run_episodes, to_batch
from lit_credit.tasks.base import Task
from lit_credit.types import RolloutBatch, SamplingParams


def _rows(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return batch


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
    (:meth:`RolloutDataModule.generate_experience`) removes the oldest pending index.
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

    def __iter__(self) -> Iterator[list[dict[str, Any]]]:
        pending = self.position["pending"]
        replay = list(pending)
        pending.clear()
        while True:
            k = replay.pop(0) if replay else self._take()
            pending.append(k)
            yield self.batch(k)


class RolloutDataModule(L.LightningDataModule):
    """Serves prompt rows; ``generate_experience`` turns them into scored rollouts with the current weights.

    The dataloaders yield only prompt rows (plain dicts). Generation happens inside the training step,
    never in the dataloader, because Lightning prefetches the next batch (that would be one step
    off-policy). Group ids are minted here, one per prompt per call, from a running counter.

    Resumable: the train loader is a :class:`PromptStream`; ``state_dict`` (saved in every Lightning
    checkpoint) holds its position (``next_batch``, ``pending``) and the group counter, so a resumed run
    draws the prompts the uninterrupted run would have drawn. :meth:`refill_experience` draws further batches
    of the same stream inside a training step (DAPO's dynamic sampling); the dataloader never serves them, so
    no prompt is drawn twice within an epoch. Engine calls go through ``engine_retry``
    (:class:`~lit_credit.backends.Retry`); a reward that raises scores 0 and non-finite reward values become
    0, each counted (``backend/reward/{errors,nonfinite}``). An engine in sleep mode sleeps through the policy
    update: the module calls :meth:`release` once the step's generation is done and :meth:`sync_weights` (which
    wakes it, then pushes the weights) after the update.
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
        self.next_group = 0
        self.position: dict[str, Any] = {"next_batch": 0, "pending": []}  # PromptStream's, shared and saved
        self._bound: Any = None
        self._released = False  # the engine was put to sleep by release() and not woken since
        self.codec: ChatCodec | None = None

    def setup(self, stage: str | None = None) -> None:
        self.train_set = self.task.dataset("train")
        test = self.task.dataset("test")
        self.val_set = test.select(range(min(self.val_prompts, len(test))))
        self.stream = PromptStream(self.train_set, self.prompts_per_step, self.seed, self.position)

    def train_dataloader(self) -> DataLoader:
        # Own generators: creating a loader iterator must not draw from the global RNG (exact resume).
        return DataLoader(self.stream, batch_size=None, collate_fn=_rows, generator=torch.Generator().manual_seed(0))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=max(self.val_prompts, 1), collate_fn=_rows,
                          generator=torch.Generator().manual_seed(0))

    def state_dict(self) -> dict[str, Any]:
        return {"next_batch": self.position["next_batch"], "pending": list(self.position["pending"]),
                "next_group": self.next_group}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # In place: the stream shares ``position``. A checkpoint of the older format counted train_batches only.
        self.position["next_batch"] = state.get("next_batch", state.get("train_batches", 0))
        self.position["pending"][:] = state.get("pending", [])
        self.next_group = state["next_group"]

    def bind(self, model: torch.nn.Module, tokenizer: Any) -> None:
        """Give the engine the policy (once) and weights after every optimiser step."""
        if self._bound is not model:
            self.engine.bind(model, tokenizer)
            self.codec, self._bound = ChatCodec(tokenizer, self.max_feedback_tokens), model

    @property
    def sleep_mode(self) -> bool:
        """Whether the engine frees its memory between generation phases: its ``enable_sleep_mode`` (vLLM's
        ``rollout.enable_sleep_mode``); False for an engine without one (HFEngine shares the trainer's policy)."""
        return bool(getattr(self.engine, "enable_sleep_mode", False))

    def release(self) -> None:
        """The step's generation is done: put an engine in sleep mode to sleep (vLLM offloads its weights and
        drops its KV cache), so the policy update has the memory. A no-op when sleep mode is off.

        One training step's engine calls, in order: ``generate`` (rollouts, refills, counterfactuals, roles),
        ``sleep`` (here), the policy update, then :meth:`sync_weights`: ``wake``, ``update_weights``; and the
        next step's ``generate``. Only an engine this method put to sleep is woken."""
        if self.sleep_mode and not self._released:
            self.engine.sleep()
            self._released = True

    def _wake(self) -> None:
        if self._released:
            self.engine.wake()
            self._released = False

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Push ``model``'s weights to the engine, waking it first if :meth:`release` put it to sleep (vLLM reloads
        weights in place only into an awake engine; asleep it would wake, reload and sleep again)."""
        self._wake()
        self.engine.update_weights(model)

    @torch.no_grad()
    def generate_experience(self, rows: list[dict[str, Any]], sampling: SamplingParams | None = None) -> RolloutBatch:
        """Sample ``sampling.n`` rollouts per row, run the environment, score them: a RolloutBatch on CPU.

        ``sampling=None`` is the training step's draw of the dataloader's batch (the train sampling; that
        batch leaves the stream's ``pending`` list). The wall time of the call is kept in ``last_generation_s``.
        """
        if sampling is None:
            del self.position["pending"][:1]
        return self._experience(rows, sampling or self.sampling)

    @torch.no_grad()
    def refill_experience(self) -> RolloutBatch:
        """The rollouts of the stream's next fresh prompt batch (train sampling, new group ids, on CPU): DAPO's
        dynamic-sampling refill; the step stacks its draws with :func:`cat_batches`. The dataloader never
        serves that prompt batch; ``last_generation_s`` is the new draw's wall time."""
        return self._experience(self.stream.draw(), self.sampling)

    def _experience(self, rows: list[dict[str, Any]], sampling: SamplingParams) -> RolloutBatch:
        if self.codec is None:
            raise RuntimeError("RolloutDataModule.generate_experience before bind(model, tokenizer)")
        start = time.perf_counter()
        self._wake()  # released and not synced since (no update in between): generation needs the engine awake
        groups = list(range(self.next_group, self.next_group + len(rows)))
        self.next_group += len(rows)
        episodes = run_episodes(self.engine, self.codec, self.env, rows, groups, sampling, self.max_turns,
                                self.engine_retry)
        temperature = 1.0 if sampling.greedy else sampling.temperature
        batch = finite_scores(to_batch(episodes, [self.score(e) for e in episodes], self.codec.pad_id, temperature))
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


def cat_batches(batches: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """Rollout batches stacked into one, in order (a training step's draws under dynamic sampling).

    Every tensor field is right-padded to the largest size of each dimension after the first: ``[B, T]``
    fields to the longest row (``input_ids`` with ``pad_id``, ``turn_ids`` with -1, masks and log-probs with 0),
    ``[B, K]`` per-turn fields to the most turns (0 / False). A reward part or ``turn_scores`` that a batch
    lacks is 0 there. Lists (``metadata``) are concatenated; any other field (``temperature``) must agree.
    """
    if len(batches) == 1:
        return batches[0]
    fills = {"input_ids": pad_id, "turn_ids": -1}

    def stack(values: list[torch.Tensor | None], fill: float) -> torch.Tensor | None:
        like = next((v for v in values if v is not None), None)
        if like is None:
            return None
        values = [v if v is not None else like.new_full((len(b), *([1] * (like.dim() - 1))), fill)
                  for v, b in zip(values, batches, strict=True)]
        shape = [max(v.shape[d] for v in values) for d in range(1, like.dim())]
        out = like.new_full((sum(len(v) for v in values), *shape), fill)
        start = 0
        for v in values:  # a handful of draws: one slice copy each
            out[(slice(start, start + len(v)), *(slice(0, size) for size in v.shape[1:]))] = v
            start += len(v)
        return out

    out: dict[str, Any] = {}
    for f in fields(RolloutBatch):
        values = [getattr(b, f.name) for b in batches]
        if f.name == "turn_scores" and any(v is not None for v in values):  # none: 0 on each turn it reached
            values = [v if v is not None or b.turn_mask is None else torch.zeros(b.turn_mask.shape,
                                                                                 device=b.scores.device)
                      for v, b in zip(values, batches, strict=True)]
        if isinstance(values[0], dict):
            keys = dict.fromkeys(k for v in values for k in v)
            out[f.name] = {k: stack([v.get(k) for v in values], 0) for k in keys}
        elif isinstance(values[0], list):
            out[f.name] = [x for v in values for x in v]
        elif isinstance(values[0], torch.Tensor) or values[0] is None:
            out[f.name] = stack(values, fills.get(f.name, 0))
        elif any(v != values[0] for v in values):
            raise ValueError(f"cat_batches: the batches' {f.name} differ: {values}")
        else:
            out[f.name] = values[0]
    return RolloutBatch(**out)
