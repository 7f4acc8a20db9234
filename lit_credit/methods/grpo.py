"""The GRPO module: GRPO, Dr.GRPO, DAPO, GSPO, SLCA-GRPO, TCPO, MT-GRPO, ToolPO and SLCA x TCPO are its configs."""
from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch.distributed.fsdp import FSDPModule

from lit_credit.analysis.metrics import batch_metrics, gradient_cosine, pass_at_k_metrics, segment_grad_cosine
from lit_credit.credit.groups import kept_share, nonzero_variance_groups
from lit_credit.credit.slca import credit_leakage, segment_masks
from lit_credit.distributed import all_reduce_sum, gather_batch, gather_objects, world
from lit_credit.interfaces import Augmenter, CreditEstimator, MetricSet
from lit_credit.losses import PolicyLoss, aggregation_denominator, masked_mean
from lit_credit.methods.base import PolicyModule
from lit_credit.models.policy import PolicySource
from lit_credit.rollout.seeds import mix_seed
from lit_credit.types import CreditTrace, RolloutBatch, cat_batches

MINIBATCH_STREAM = 2  # the seed stream of the minibatch splits (0, 1: the experience layer's rollout streams)


def sum_counts_nanmean(key: str) -> Any:
    """The reduction over ranks of an augmenter's metric: a count (``..._turns``) summed, else the mean of the
    values that are not NaN (NaN when every rank's is)."""
    if key.endswith("_turns"):
        return sum
    return lambda values: (sum(v for v in values if v == v) / max(sum(v == v for v in values), 1)
                           if any(v == v for v in values) else float("nan"))


def extreme_by_suffix(key: str) -> Any:
    """The exact reduction over ranks of a metric named ``...max`` (max) or ``...min`` (min); None otherwise."""
    return max if key.endswith("max") else min if key.endswith("min") else None


class GRPOModule(PolicyModule):
    """GRPO-family policy optimisation with manual optimisation.

    One training step (:meth:`training_step`, one named phase each): :meth:`collect` the rollouts with the
    current weights (through the experience layer, ``self.experience``; with ``dynamic_sampling``, refilled as
    below) -> :meth:`augment_experience` -> ``experience.release()`` (an engine in sleep mode sleeps) ->
    :meth:`anchor_logprobs` (old and reference) -> :meth:`assign_credit` (``credit(batch)`` token advantages)
    -> :meth:`update`: ``ppo_epochs`` x ``num_minibatches`` updates of ``loss`` with gradient clipping (each
    epoch a fresh random split of the batch's rollouts, :meth:`minibatches`), LR schedule -> ``experience.sync_weights`` (wake,
    push) -> logs. Every GRPO-family method is a config of this module: the credit estimator (``credit=``),
    the loss (``loss=``), ``dynamic_sampling`` (DAPO, with ``loss=dapo``), the augmenter (``augment=``: TCPO's
    counterfactual resampling, run when the estimator ``needs`` what it ``provides``) and the metric sets
    (``metrics=tool``, ``turn``); ``grad_cosine_every`` logs SLCA's segment gradient cosine
    (:func:`~lit_credit.analysis.metrics.segment_grad_cosine`, ``slca/grad_cosine``) every that many steps
    (0: never).

    PPO ratio: the old log-probs are the policy's before the step's first update, taken once. With one update
    per step (``ppo_epochs = num_minibatches = 1``) they equal the trainer's log-probs, so the ratio is exactly
    1 and no clip (DAPO's clip-higher, GSPO's sequence ratio) ever acts; conf/method/grpo.yaml therefore uses 4
    minibatches (verl's default split, ``ppo_mini_batch_size = train_batch_size / 4``). ``trainer.global_step``
    counts training steps (one rollout batch each, whatever its number of updates): ``trainer.max_steps``,
    checkpoints and the LR schedule are per rollout batch, as verl's ``global_steps``.

    Dynamic sampling (DAPO): a group whose rewards are all equal has zero advantage and is dropped. While the
    step holds fewer than ``prompts_per_step`` groups with a reward spread and fewer than ``max_sampling_draws``
    prompt batches were drawn, the experience layer draws the stream's next batch
    (:meth:`~lit_credit.rollout.Experience.refill`); the first ``prompts_per_step`` such groups in
    draw order are kept, extras dropped. At the cap the step trains on the informative groups found, and on
    the first draw with all advantages 0 when there is none, without moving the weights (no gradient reaches
    the optimiser, so AdamW's momentum does not move them either): the run always advances (DAPO's trainer
    raises instead). With several processes every decision is the whole step's: each draw's informative groups
    are counted over the ranks (one all-reduce), so every rank draws as often; the kept groups are chosen from
    every rank's draws and dealt out again in contiguous runs of whole groups
    (:func:`~lit_credit.credit.groups.kept_share`), so the kept batch, its minibatch split and its gradient are
    the one-process run's. A rank left without a group (fewer kept groups than ranks) runs weight-0 passes.

    Several processes (DDP, FSDP2): each rank trains on its share of the step's prompt groups (the
    experience layer's), whole groups, so group statistics are exact; each minibatch's loss normaliser is the whole
    minibatch's (:meth:`minibatch_loss`); the logged rollout metrics and the credit records are computed from
    every rank's rollouts (:func:`~lit_credit.distributed.gather_batch`), the loss metrics reduced over the
    ranks (:meth:`over_ranks`). Logged: ``train/sampling_draws``, ``train/kept_frac``
    (kept groups / drawn groups) and ``train/informative_groups``; the ``train/reward/*`` rollout metrics
    are over every draw.
    """

    def __init__(self, policy: PolicySource, credit: CreditEstimator, loss: PolicyLoss,
                 optimizer: OptimizerCallable = torch.optim.AdamW, lr_scheduler: LRSchedulerCallable | None = None,
                 ppo_epochs: int = 1, num_minibatches: int = 1, max_grad_norm: float = 1.0,
                 dynamic_sampling: bool = False, max_sampling_draws: int = 10, max_logprob_gap: float | None = None,
                 logprob_token_budget: int | None = 16384, augment: Augmenter | None = None,
                 metrics: Mapping[str, MetricSet] | None = None, grad_cosine_every: int = 0,
                 logprob_temperature: float | None = None) -> None:
        if ppo_epochs < 1 or num_minibatches < 1:
            raise ValueError(f"method.ppo_epochs={ppo_epochs}, method.num_minibatches={num_minibatches}: both >= 1")
        if max_sampling_draws < 1:
            raise ValueError(f"method.max_sampling_draws={max_sampling_draws}: must be >= 1 (1: no refill)")
        missing = credit.needs - (augment.provides if augment else frozenset())
        if missing:
            raise ValueError(f"the credit estimator ({type(credit).__name__}) needs batch.extras {sorted(missing)}, "
                             "which no augmenter provides; fix: augment=counterfactual (the environment's verifier scores "
                             "the alternatives) or augment=counterfactual_tool (the reward's tool-turn score)")
        super().__init__(policy, loss.kl_coef > 0, optimizer, lr_scheduler, max_grad_norm, logprob_token_budget,
                         logprob_temperature)
        self.credit, self.loss, self.augment, self.metric_sets = credit, loss, augment, dict(metrics or {})
        self.ppo_epochs, self.num_minibatches = ppo_epochs, num_minibatches
        self.dynamic_sampling, self.max_sampling_draws = dynamic_sampling, max_sampling_draws
        self.max_logprob_gap, self.grad_cosine_every = max_logprob_gap, grad_cosine_every
        self.credit_trace: list[CreditTrace] = []  # the last step's credited batches (callbacks.CreditRecords)
        self.step_batch: RolloutBatch | None = None  # the step's rollouts of every rank (collect)
        self.step_ranks: torch.Tensor | None = None  # and each row's rank
        self.padding_only = False  # this rank holds no kept group this step (dynamic sampling, several ranks)

    def configure_optimizers(self):
        opt = self.optimizer_factory([p for p in self.policy.parameters() if p.requires_grad])
        if self.scheduler_factory is None:
            return opt
        return {"optimizer": opt, "lr_scheduler": {"scheduler": self.scheduler_factory(opt), "interval": "step"}}

    def random_sources(self) -> dict[str, Any]:
        return {"module": self, "augment": self.augment}

    # ------------------------------------------------------------------------------------------------ the step
    def training_step(self, rows: list[dict[str, Any]], batch_idx: int) -> None:
        start = time.perf_counter()
        batch, informative, logs = self.collect(rows)
        augmented, extra_s = self.timed(self.augment_experience, batch)
        self.experience.release()  # generation done: an engine in sleep mode frees its memory for the update
        old_logp, ref_logp = self.anchor_logprobs(batch)
        advantages, credit_logs = self.assign_credit(batch, informative)
        updates = self.update(batch, advantages, old_logp, ref_logp, informative)
        self.experience.sync_weights(self.policy)
        self.check_logprob_gap(updates["train/engine_logprob_gap"])
        logs |= augmented | updates | credit_logs
        logs |= self.step_timing(batch, start, logs["perf/generation_s"], extra_s if augmented else None)
        self.log_dict(logs, batch_size=len(rows), prog_bar=False)
        self.log("reward", logs["train/reward/mean"], prog_bar=True, logger=False, batch_size=len(rows))

    @staticmethod
    def timed(fn, *args):
        """``(fn(*args), its wall seconds)``."""
        start = time.perf_counter()
        return fn(*args), time.perf_counter() - start

    def collect(self, rows: list[dict[str, Any]]) -> tuple[RolloutBatch, bool, dict[str, float]]:
        """The step's rollouts with the current weights (and, with ``dynamic_sampling``, refills): (this rank's
        batch to train on, whether the step holds an informative group, rollout and sampling metrics over every
        draw of every rank)."""
        batch = self.experience.draw(rows).to(self.device)
        generation_s, informative, sampling, drawn = self.experience.last_generation_s, True, {}, batch
        if self.dynamic_sampling:
            drawn, generation_s = self.draw_until_informative(batch, len(rows))
        pad = self.experience.codec.pad_id
        whole, self.step_ranks = gather_batch(drawn, pad)  # every rank's rollouts
        self.step_batch, self.padding_only = whole, False
        if self.dynamic_sampling:
            batch, informative, sampling = self.keep_informative(whole, batch, len(rows))
            if world()[1] > 1:  # the records: what each rank trains on
                self.step_batch, self.step_ranks = gather_batch(batch.select(torch.empty(0, dtype=torch.long))
                                                                if self.padding_only else batch, pad)
        counts: dict[str, float] = {}
        for rank_counts in gather_objects(self.experience.backend_counts.take()):
            counts = {k: counts.get(k, 0.0) + rank_counts.get(k, 0.0) for k in counts | rank_counts}
        logs = {**self.rollout_metrics(whole, "train"), **sampling, **counts, "perf/generation_s": generation_s,
                "perf/rollout_tokens_per_s": whole.response_mask.sum().item() / max(generation_s, 1e-9)}
        return batch, informative, logs

    def draw_until_informative(self, batch: RolloutBatch, prompts: int) -> tuple[RolloutBatch, float]:
        """DAPO's refills (see the class docstring) after the step's first draw ``batch``: this rank's rollouts
        of every draw, and the draws' generation seconds. The informative groups are counted over the ranks, so
        every rank stops after the same draw."""
        draws, generation_s = [batch], self.experience.last_generation_s
        found = self.informative_groups(batch)
        while found < prompts and len(draws) < self.max_sampling_draws:
            draws.append(self.experience.refill().to(batch.input_ids.device))
            generation_s += self.experience.last_generation_s
            found += self.informative_groups(draws[-1])
        return cat_batches(draws, self.experience.codec.pad_id), generation_s  # once, however many draws

    def informative_groups(self, batch: RolloutBatch) -> int:
        """The groups with a reward spread in ``batch`` (one draw; the draws never share a group), summed over
        the ranks."""
        local = torch.unique(batch.group_ids[nonzero_variance_groups(batch)]).numel()
        return int(all_reduce_sum(torch.tensor(local, device=self.device)).item())

    def keep_informative(self, whole: RolloutBatch, first: RolloutBatch, prompts: int
                         ) -> tuple[RolloutBatch, bool, dict[str, float]]:
        """The first ``prompts`` informative groups of ``whole`` (every rank's draws), this rank's share of them
        (:func:`~lit_credit.credit.groups.kept_share`; ``first``, this rank's first draw, when none is
        informative), whether any is, and the sampling metrics (``train/sampling_draws``,
        ``train/informative_groups``, ``train/kept_frac``) of the whole step."""
        rank, size = world()
        rows, found, self.padding_only = kept_share(whole, nonzero_variance_groups(whole), prompts, rank, size)
        groups = torch.unique(whole.group_ids).numel()
        metrics = {"train/sampling_draws": groups / prompts, "train/informative_groups": float(found),
                   "train/kept_frac": found / groups}
        return (whole.select(rows) if found else first), found > 0, metrics

    def augment_experience(self, batch: RolloutBatch) -> dict[str, float]:
        """The augmenter's extra experience, added to ``batch.extras`` in place, when the estimator needs it;
        its metrics over the ranks ({} without): counts (``.../cf_turns``) summed, the others the mean of the
        ranks' values that are not NaN."""
        if self.augment is None or not self.credit.needs & self.augment.provides:
            return {}
        return self.over_ranks(self.augment(batch, self.experience), sum_counts_nanmean)

    @torch.no_grad()
    def anchor_logprobs(self, batch: RolloutBatch) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The old log-probs (the policy's before the step's first update; None with one update per step, where
        they equal the trainer's) and the reference log-probs (None without a KL term)."""
        old = None if self.ppo_epochs * self.num_minibatches == 1 else self._logprobs(self.policy, batch)[0]
        return old, self.reference_logprobs(batch)

    def assign_credit(self, batch: RolloutBatch, informative: bool) -> tuple[torch.Tensor, dict[str, float]]:
        """``credit(batch)``'s token advantages (all 0 when no group is informative), kept for the credit records;
        the estimator's metrics, ``credit/leakage`` on a tool task; the occasional segment gradient cosine goes
        straight to the logger (Lightning's ``self.log`` would repeat its last value at every later step)."""
        credit = self.credit(batch)
        advantages = credit.advantages if informative else torch.zeros_like(credit.advantages)
        self.credit_trace = [self.whole_trace(batch, advantages[:0] if self.padding_only else advantages)]
        logs = {} if self.padding_only else dict(credit.metrics)  # a weight-0 rank's credit is no one's
        leakage = credit_leakage(batch, advantages)
        if leakage == leakage and not self.padding_only:  # not NaN: a tool task with a summary score
            logs["credit/leakage"] = leakage
        logs = self.over_ranks(logs, extreme_by_suffix)
        if self.grad_cosine_every and self.global_step % self.grad_cosine_every == 0 and self.logger is not None:
            cosine = self.grad_cosine(batch, advantages)
            if cosine is not None:
                self.logger.log_metrics({"slca/grad_cosine": cosine}, step=self.global_step)
        return advantages, logs

    def grad_cosine(self, batch: RolloutBatch, advantages: torch.Tensor) -> float | None:
        """SLCA's segment gradient cosine (:func:`~lit_credit.analysis.metrics.segment_grad_cosine`) of this rank's
        batch. A sharded policy (FSDP2) has gradients only through FSDP2's own backward, which reduce-scatters them
        into the sharded parameters' ``p.grad``: there each segment's surrogate (the loss without KL, ratio 1) is
        back-propagated as the update does it (:meth:`backward_by_micro_batch`: the same micro-batches and padding
        passes on every rank), ``p.grad`` read (this rank's shard of the ranks' summed gradient) and cleared, and
        the cosine taken over the ranks (:func:`~lit_credit.analysis.metrics.gradient_cosine`)."""
        if not isinstance(self.policy, FSDPModule):
            params = [p for p in self.policy.parameters() if p.requires_grad]
            return segment_grad_cosine(self.loss, self._logprobs(self.policy, batch)[0], advantages,
                                       batch.response_mask, params)
        surrogate = copy.copy(self.loss)
        surrogate.kl_coef = 0.0
        grads = []
        for segment in segment_masks(batch.response_mask):
            self.backward_by_micro_batch(batch, surrogate, advantages, batch.response_mask * segment, None,
                                         entropy=False)
            params = [p for p in self.policy.parameters() if p.requires_grad]  # resharded after the backward
            grads.append(torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).to_local().flatten()
                                    for p in params]))
            for p in params:
                p.grad = None
        return gradient_cosine(*grads) if len(grads) == 2 else None

    def whole_trace(self, batch: RolloutBatch, advantages: torch.Tensor) -> CreditTrace:
        """The credit of every rank's rollouts (the step's gathered batch, each row's rank) for the records; this
        rank's own batch in one process."""
        if world()[1] == 1:
            return CreditTrace("policy", batch, advantages, ranks=torch.zeros(len(batch), dtype=torch.long))
        whole = self.step_batch
        parts = gather_objects(advantages.detach().cpu())
        padded = whole.response_mask.new_zeros(whole.response_mask.shape)
        start = 0
        for part in parts:  # one slice per rank
            padded[start:start + len(part), :part.shape[1]] = part.to(padded.device)
            start += len(part)
        return CreditTrace("policy", whole, padded, ranks=self.step_ranks)

    def minibatch_loss(self, mask: torch.Tensor) -> PolicyLoss:
        """The loss of one minibatch of this rank's rows (``mask``): with several processes its normaliser is the
        whole minibatch's over the ranks (:func:`~lit_credit.losses.aggregation_denominator`, all-reduced, over
        the world size), so the ranks' mean gradient (DDP, FSDP) is the gradient of the one-process loss of the
        same rollouts; ``loss`` itself in one process."""
        size = world()[1]
        if size == 1:
            return self.loss
        local = aggregation_denominator(mask, self.loss.aggregation, norm_length=self.loss.norm_length)
        return functools.partial(self.loss, denominator=all_reduce_sum(local) / size)

    def minibatches(self, rows: int, epoch: int) -> list[torch.Tensor]:
        """This rank's rows (``rows`` of them) of each of the ``num_minibatches`` minibatches of ``epoch``: the
        step's rollouts of every rank, in rank order, permuted with a generator seeded
        ``mix_seed(data seed, 2, global_step, epoch)`` and cut into ``num_minibatches`` chunks; each rank keeps the
        chunk's rows it holds (as local indices; a chunk may hold none of them). The split of the whole batch is
        the same on 1 or N processes."""
        counts = gather_objects(rows)
        offset, total = sum(counts[:world()[0]]), sum(counts)
        seed = mix_seed(self.experience.seed, MINIBATCH_STREAM, self.global_step, epoch)
        order = torch.randperm(total, generator=torch.Generator().manual_seed(seed)).to(self.device)
        return [chunk[(chunk >= offset) & (chunk < offset + rows)] - offset for chunk in order.chunk(self.num_minibatches)]

    def update(self, batch: RolloutBatch, advantages: torch.Tensor, old_logp: torch.Tensor | None,
               ref_logp: torch.Tensor | None, informative: bool) -> dict[str, float]:
        """``ppo_epochs`` x ``num_minibatches`` updates of the loss with gradient clipping (each epoch a fresh
        random split of the rollouts), then the LR schedule; the updates' mean metrics (ratio min / max), the
        engine / trainer log-prob gap and the entropy of the first epoch."""
        opt, sched, mask = self.optimizers(), self.lr_schedulers(), batch.response_mask
        gap, entropy, updates = [], [], []
        for epoch in range(self.ppo_epochs):
            chunks = self.minibatches(0 if self.padding_only else len(batch), epoch)
            for i, idx in enumerate(chunks):
                padding = len(idx) == 0  # none of this minibatch's rows is this rank's: a weight-0 pass of row 0
                if padding:
                    idx = torch.zeros(1, dtype=torch.long, device=self.device)
                mb = batch.select(idx)
                opt.zero_grad()
                logp, ent, metrics = self.backward_by_micro_batch(
                    mb, self.minibatch_loss(mask[idx] * (not padding)), advantages[idx], mask[idx],
                    ref_logp[idx] if ref_logp is not None else None, old_logp[idx] if old_logp is not None else None,
                    scale=0.0 if padding else 1.0)
                if not informative:  # no group with a reward spread: no update (AdamW skips grad-less weights)
                    opt.zero_grad(set_to_none=True)
                metrics["train/grad_norm"] = self._clip(opt)
                self._step(opt, last=epoch == self.ppo_epochs - 1 and i == len(chunks) - 1)
                if padding:
                    continue
                updates.append(metrics)
                if epoch == 0:
                    gap.append(masked_mean(((logp if old_logp is None else old_logp[idx]) - mb.behaviour_logprobs).abs(),
                                           mask[idx]))
                    entropy.append(masked_mean(ent, mask[idx]))
        if sched is not None:
            sched.step()
        reduce = {"loss/ratio_min": min, "loss/ratio_max": max}  # the others: mean over the step's updates
        logs = {}  # none on a rank that ran only weight-0 passes
        if updates:
            logs = {k: reduce.get(k, lambda v: sum(v) / len(v))([m[k] for m in updates]) for k in updates[0]}
            logs |= {"train/engine_logprob_gap": torch.stack(gap).mean().item(),
                     "train/entropy": torch.stack(entropy).mean().item()}
        return self.over_ranks(logs, reduce) | {"train/updates": float(len(updates)), "train/lr": opt.param_groups[0]["lr"]}

    @staticmethod
    def over_ranks(logs: dict[str, float], reduce: Mapping[str, Any] | Callable[[str], Any]) -> dict[str, float]:
        """``logs`` of every rank in one: ``reduce[key]`` (or ``reduce(key)``: min, max, or None) or the mean over
        the ranks that logged the key (a credit metric of a turn kind only some ranks saw), over the union of
        the ranks' keys. Whole-batch statistics (``credit/leakage``, ``credit/zero_variance_group_frac``) are
        means of the ranks' values, not the step's value. The losses are exact (each rank's is its share
        of the whole minibatch's, :meth:`minibatch_loss`, times the world size); the token means (KL, clip
        fractions, the engine gap, entropy, the credit's ``adv_mean`` / ``adv_std``) are means of the ranks'
        means, exact when the ranks hold as many tokens; maxima and minima are exact. One process: ``logs``."""
        ranks = gather_objects(logs)
        if len(ranks) == 1:
            return logs
        pick = reduce if callable(reduce) else reduce.get
        keys = dict.fromkeys(k for r in ranks for k in r)
        return {k: (pick(k) or (lambda v: sum(v) / len(v)))([r[k] for r in ranks if k in r]) for k in keys}


    def check_logprob_gap(self, gap: float) -> None:
        if self.max_logprob_gap is not None and gap > self.max_logprob_gap:
            raise RuntimeError(f"engine/trainer log-prob gap {gap:.3g} > method.max_logprob_gap="
                               f"{self.max_logprob_gap}: the engine is sampling from stale weights (weight sync "
                               "did not take)")

    def step_timing(self, batch: RolloutBatch, start: float, generation_s: float,
                    extra_s: float | None) -> dict[str, float]:
        """Wall-clock rates of the step; ``perf/extra_experience_frac``: the augmenter's share of the step time
        (``extra_s``, None when it added nothing)."""
        elapsed = time.perf_counter() - start
        tokens = batch.attention_mask.sum().item()
        logs = {"perf/step_s": elapsed, "perf/tokens_per_s": tokens / elapsed,
                "perf/train_tokens_per_s": tokens * self.ppo_epochs / max(elapsed - generation_s - (extra_s or 0.0),
                                                                          1e-9)}
        if extra_s is not None:
            logs["perf/extra_experience_frac"] = extra_s / elapsed
        return logs

    # ------------------------------------------------------------------------------------------------ metrics
    def rollout_metrics(self, batch: RolloutBatch, stage: str) -> dict[str, float]:
        """:func:`~lit_credit.analysis.metrics.batch_metrics` and every configured metric set's."""
        logs = batch_metrics(batch, stage)
        context = {"max_turns": self.experience.env.max_turns if self._trainer is not None else 1}
        for metric_set in self.metric_sets.values():
            logs.update(metric_set(batch, stage, context))
        return logs

    def validation_step(self, rows: list[dict[str, Any]], batch_idx: int) -> None:
        """The held-out rows greedy (``val/``: :meth:`rollout_metrics`) and, with ``data.val_samples = n > 0``,
        n samples each at T = 1 (every rank its share of the rows, the metrics over all of them; ``val/sampled/``: the same metrics, ``zero_variance_groups`` kept, plus
        ``pass@1..n`` at ``data.val_success``), isolated from the training RNG
        (:meth:`~lit_credit.rollout.Experience.sampled_validation`)."""
        pad = self.experience.codec.pad_id
        batch = gather_batch(self.experience.draw_validation(rows), pad)[0]  # every rank's share
        logs = self.rollout_metrics(batch, "val")
        logs.pop("val/zero_variance_groups")
        sampled = self.experience.sampled_validation(rows)
        if sampled is not None:
            sampled = gather_batch(sampled.to(self.device), pad)[0]
            logs |= self.rollout_metrics(sampled, "val/sampled")
            logs |= pass_at_k_metrics(sampled, self.experience.val_success, "val/sampled")
        self.log_dict(logs, batch_size=len(rows), prog_bar=False)
        self.log("val_reward", logs["val/reward/mean"], prog_bar=True, logger=False, batch_size=len(rows))
