"""The shared GRPO base: every method is this module with another credit estimator and loss."""
from __future__ import annotations

import copy
import time
import warnings
from typing import Any

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from data_modules.rollout import cat_batches
from lit_credit.checkpoint import capture_rng, restore_rng
from lit_credit.credit.registry import CreditEstimator
from lit_credit.credit.slca import credit_leakage
from lit_credit.losses import PolicyLoss, masked_mean
from lit_credit.models.logprobs import token_logprobs
from lit_credit.models.policy import PolicySource, is_peft
from lit_credit.types import CreditTrace, RolloutBatch

# Checkpoints hold the state after step N's update, consistent with global_step = N: that is what we want.
warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization")
# The frozen reference is in eval mode on purpose (and HF policies load in eval mode: no dropout in RL).
warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode")


def group_rank(group_ids: torch.Tensor) -> torch.Tensor:
    """[B] long: the rank of each rollout's group id among the batch's distinct ids, ascending (ids are minted
    in draw order, so this is the draw order). One stable sort and a cumsum: no host sync, no data-dependent
    shape."""
    ids, order = group_ids.sort(stable=True)
    new = torch.ones_like(ids, dtype=torch.bool)
    new[1:] = ids[1:] != ids[:-1]
    rank = torch.empty_like(order)
    rank[order] = new.long().cumsum(0) - 1
    return rank


def nonzero_variance_groups(batch: RolloutBatch) -> torch.Tensor:
    """[B] bool on the batch's device: rollouts whose group's scores are not all equal (DAPO's dynamic sampling
    keeps these): ``keep_i = max_{j in g(i)} r_j > min_{j in g(i)} r_j``, two segment reductions over the
    group ranks (:func:`group_rank`; also runs on the ``meta`` device)."""
    rank, scores = group_rank(batch.group_ids), batch.scores
    high = scores.new_full(scores.shape, -torch.inf).scatter_reduce(0, rank, scores, "amax")
    low = scores.new_full(scores.shape, torch.inf).scatter_reduce(0, rank, scores, "amin")
    return (high > low)[rank]


def first_informative_groups(batch: RolloutBatch, keep: torch.Tensor, limit: int) -> tuple[torch.Tensor, int]:
    """The first ``limit`` groups in draw order (by group id) among the groups ``keep`` ([B] bool, constant
    within a group) marks: ([B] bool, how many groups that is, at most ``limit``)."""
    rank = group_rank(batch.group_ids)
    kept = torch.zeros_like(rank).scatter_reduce(0, rank, keep.long(), "amax")  # [B]: group of rank r is kept
    before = kept.cumsum(0)  # kept groups of rank <= r
    return keep & (before[rank] <= limit), min(int(before[-1]), limit)


class GRPOModule(L.LightningModule):
    """GRPO-family policy optimisation with manual optimisation.

    One training step: rollouts with the current weights (from the DataModule; with ``dynamic_sampling``,
    refilled as below; and ``augment_experience``) -> engine released (``rollouts.release()``: an engine in
    sleep mode sleeps) -> old and reference log-probs -> ``credit(batch)`` token advantages -> ``ppo_epochs``
    x ``num_minibatches`` updates of ``loss`` with gradient clipping (each epoch a fresh random split of the
    batch's rollouts) -> LR schedule -> weight sync to the engine (``rollouts.sync_weights``: wake, push) ->
    logs. GRPO, Dr.GRPO, DAPO and GSPO are configs of this module (credit + loss + ``dynamic_sampling``);
    SLCA-GRPO, TCPO and MT-GRPO swap the credit estimator.

    PPO ratio: the old log-probs are the policy's before the step's first update, taken once. With one update
    per step (``ppo_epochs = num_minibatches = 1``) they equal the trainer's log-probs, so the ratio is exactly
    1 and no clip (DAPO's clip-higher, GSPO's sequence ratio) ever acts; the method configs therefore use 4
    minibatches (verl's default split, ``ppo_mini_batch_size = train_batch_size / 4``). ``trainer.global_step``
    counts training steps (one rollout batch each, whatever its number of updates): ``trainer.max_steps``,
    checkpoints and the LR schedule are per rollout batch, as verl's ``global_steps``.

    Dynamic sampling (DAPO): a group whose rewards are all equal has zero advantage and is dropped. While the
    step holds fewer than ``prompts_per_step`` groups with a reward spread and fewer than ``max_sampling_draws``
    prompt batches were drawn, the DataModule draws the stream's next batch
    (:meth:`~data_modules.RolloutDataModule.refill_experience`); the first ``prompts_per_step`` such groups in
    draw order are kept, extras dropped. At the cap the step trains on the informative groups found, and on
    the first draw with all advantages 0 when there is none, without moving the weights (no gradient reaches
    the optimiser, so AdamW's momentum does not move them either): the run always advances (DAPO's trainer
    raises instead). One process only (the number of draws is rank-local). Logged: ``train/sampling_draws``, ``train/kept_frac``
    (kept groups / drawn groups) and ``train/informative_groups``; the ``train/reward/*`` rollout metrics
    are over every draw.
    """

    def __init__(self, policy: PolicySource, credit: CreditEstimator, loss: PolicyLoss,
                 optimizer: OptimizerCallable = torch.optim.AdamW, lr_scheduler: LRSchedulerCallable | None = None,
                 ppo_epochs: int = 1, num_minibatches: int = 1, max_grad_norm: float = 1.0,
                 dynamic_sampling: bool = False, max_sampling_draws: int = 10, max_logprob_gap: float | None = None,
                 logprob_token_budget: int | None = 16384) -> None:
        super().__init__()
        if ppo_epochs < 1 or num_minibatches < 1:
            raise ValueError(f"method.ppo_epochs={ppo_epochs}, method.num_minibatches={num_minibatches}: both >= 1")
        if max_sampling_draws < 1:
            raise ValueError(f"method.max_sampling_draws={max_sampling_draws}: must be >= 1 (1: no refill)")
        self.save_hyperparameters(ignore=["policy"])
        self.automatic_optimization = False
        self.source, self.credit, self.loss = policy, credit, loss
        self.optimizer_factory, self.scheduler_factory = optimizer, lr_scheduler
        self.ppo_epochs, self.num_minibatches, self.max_grad_norm = ppo_epochs, num_minibatches, max_grad_norm
        self.dynamic_sampling, self.max_sampling_draws = dynamic_sampling, max_sampling_draws
        self.max_logprob_gap = max_logprob_gap
        self.logprob_token_budget = logprob_token_budget  # padding-free micro-batches (models.token_logprobs)
        self.credit_trace: list[CreditTrace] = []  # the last step's credited batches (callbacks.CreditRecords)
        self._resume_rng: dict[str, Any] | None = None
        self.policy, self.tokenizer = policy.load()
        self.uses_reference = loss.kl_coef > 0
        self.reference = None  # a LoRA policy's reference is itself with adapters disabled
        if self.uses_reference and not is_peft(self.policy):
            self.reference = copy.deepcopy(self.policy).eval().requires_grad_(False)

    def configure_model(self) -> None:
        """FSDP2 under ``ModelParallelStrategy``: ``fully_shard`` each decoder layer, then the policy root.

        A no-op without a device mesh (single device, DDP) and when the policy is already sharded. Lightning
        calls it before ``configure_optimizers``, so the optimiser sees the sharded (DTensor) parameters. The
        frozen reference stays whole on every rank.
        """
        mesh = self.device_mesh
        if mesh is None:
            return
        from torch.distributed.fsdp import FSDPModule, fully_shard

        if isinstance(self.policy, FSDPModule):
            return
        names = mesh.mesh_dim_names or ()
        dp_mesh = mesh["data_parallel"] if "data_parallel" in names and mesh.ndim > 1 else mesh
        blocks = set(getattr(self.policy, "_no_split_modules", None) or ())
        for module in self.policy.modules():
            if type(module).__name__ in blocks:
                fully_shard(module, mesh=dp_mesh)
        fully_shard(self.policy, mesh=dp_mesh)

    def configure_optimizers(self):
        opt = self.optimizer_factory([p for p in self.policy.parameters() if p.requires_grad])
        if self.scheduler_factory is None:
            return opt
        return {"optimizer": opt, "lr_scheduler": {"scheduler": self.scheduler_factory(opt), "interval": "step"}}

    @property
    def rollouts(self):
        return self.trainer.datamodule

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["rng_states"] = capture_rng(self, self.trainer.datamodule)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._resume_rng = checkpoint.get("rng_states")

    def setup(self, stage: str) -> None:
        if self.dynamic_sampling and self.trainer.world_size > 1:
            raise ValueError("method.dynamic_sampling=true runs on one process (each rank would draw a different "
                             "number of refills and keep a different number of rollouts, and the collectives of "
                             "DDP / FSDP would hang); set method.dynamic_sampling=false or use one device")

    def on_train_start(self) -> None:
        """Dropout off for RL (the LoRA dropout PEFT leaves in training mode too), so the old, reference and
        trainer log-probs and the engine's, which samples in eval mode, are of one distribution and the PPO ratio
        of the first update is exactly 1. Resuming: put back the checkpoint's random states once everything
        that might draw on setup ran."""
        self.policy.eval()
        if self._resume_rng is not None:
            restore_rng(self._resume_rng, self, self.trainer.datamodule)
            self._resume_rng = None

    def _logprobs(
        self, model: torch.nn.Module, batch: RolloutBatch, entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[B, T] log-probs under ``model`` at the batch's sampling temperature and, with ``entropy``, the
        entropy (else None)."""
        return token_logprobs(model, batch.input_ids, batch.attention_mask, self.logprob_token_budget,
                              entropy=entropy, temperature=batch.temperature)

    @torch.no_grad()
    def reference_logprobs(self, batch: RolloutBatch) -> torch.Tensor | None:
        """[B, T] log-probs under the frozen reference (the base with adapters disabled for a LoRA policy), or
        None when the loss has no KL term."""
        if not self.uses_reference:
            return None
        if self.reference is not None:
            return self._logprobs(self.reference, batch)[0]
        with self.policy.disable_adapter():
            return self._logprobs(self.policy, batch)[0]

    def dynamic_sample(self, batch: RolloutBatch, prompts: int) -> tuple[RolloutBatch, RolloutBatch, bool, float,
                                                                        dict[str, float]]:
        """DAPO's dynamic sampling with refills (see the class docstring) from the step's first draw ``batch``:
        (every rollout drawn, the rollouts to train on, whether they hold an informative group, the draws'
        generation seconds, metrics)."""
        first, draws, generation_s = batch, [batch], self.rollouts.last_generation_s
        spread = nonzero_variance_groups(batch)  # per group, so per draw: the draws never share a group
        found = len(torch.unique(batch.group_ids[spread]))
        while found < prompts and len(draws) < self.max_sampling_draws:
            fresh = self.rollouts.refill_experience().to(batch.input_ids.device)
            draws.append(fresh)
            generation_s += self.rollouts.last_generation_s
            fresh_spread = nonzero_variance_groups(fresh)
            spread = torch.cat([spread, fresh_spread])
            found += len(torch.unique(fresh.group_ids[fresh_spread]))
        batch = cat_batches(draws, self.rollouts.codec.pad_id)  # once, however many draws
        keep, found = first_informative_groups(batch, spread, prompts)
        groups = len(torch.unique(batch.group_ids))
        metrics = {"train/sampling_draws": float(len(draws)), "train/informative_groups": float(found),
                   "train/kept_frac": found / groups}
        return batch, batch.select(keep) if found else first, found > 0, generation_s, metrics

    def training_step(self, rows: list[dict[str, Any]], batch_idx: int) -> None:
        start = time.perf_counter()
        self.rollouts.bind(self.policy, self.tokenizer)
        batch = self.rollouts.generate_experience(rows).to(self.device)
        generation_s, informative, sampling = self.rollouts.last_generation_s, True, {}
        drawn = batch
        if self.dynamic_sampling:
            drawn, batch, informative, generation_s, sampling = self.dynamic_sample(batch, len(rows))
        logs = {**self.rollout_metrics(drawn, "train"), **sampling, **self.rollouts.backend_counts.take(),
                "perf/generation_s": generation_s,
                "perf/rollout_tokens_per_s": drawn.response_mask.sum().item() / max(generation_s, 1e-9)}

        extra_start = time.perf_counter()
        extra = self.augment_experience(batch)
        extra_s = time.perf_counter() - extra_start
        logs.update(extra)
        self.rollouts.release()  # generation done: an engine in sleep mode frees its memory for the update

        single_update = self.ppo_epochs * self.num_minibatches == 1
        with torch.no_grad():
            old_logp = None if single_update else self._logprobs(self.policy, batch)[0]
            ref_logp = self.reference_logprobs(batch)
        credit = self.credit(batch)
        advantages, mask = credit.advantages, batch.response_mask
        if not informative:  # dynamic sampling found no group with a reward spread: no policy-gradient signal
            advantages = torch.zeros_like(advantages)
        self.credit_trace = [CreditTrace("policy", batch, advantages)]
        leakage = credit_leakage(batch, advantages)
        if leakage == leakage:  # not NaN: a tool task with a summary score
            logs["credit/leakage"] = leakage
        diagnostics = self.credit_diagnostics(batch, advantages)
        if diagnostics and self.logger is not None:  # sparse: straight to the logger, so never repeated stale
            self.logger.log_metrics(diagnostics, step=self.global_step)

        opt, sched = self.optimizers(), self.lr_schedulers()
        gap, entropy, updates = [], [], []
        for epoch in range(self.ppo_epochs):
            order = torch.randperm(len(batch), device=self.device)
            chunks = order.chunk(self.num_minibatches)
            for i, idx in enumerate(chunks):
                mb = batch.select(idx)
                logp, ent = self._logprobs(self.policy, mb, entropy=True)
                # One update: the policy has not moved since the rollouts, so old = logp (ratio exactly 1).
                old = logp.detach() if single_update else old_logp[idx]
                loss, metrics = self.loss(logp, old, advantages[idx], mask[idx],
                                          ref_logp[idx] if ref_logp is not None else None)
                opt.zero_grad()
                self.manual_backward(loss)
                if not informative:  # no group with a reward spread: no update (AdamW skips grad-less weights)
                    opt.zero_grad(set_to_none=True)
                metrics["train/grad_norm"] = self._clip(opt)
                self._step(opt, last=epoch == self.ppo_epochs - 1 and i == len(chunks) - 1)
                updates.append(metrics)
                if epoch == 0:
                    gap.append(masked_mean((old - mb.behaviour_logprobs).abs(), mask[idx]))
                    entropy.append(masked_mean(ent.detach(), mask[idx]))
        if sched is not None:
            sched.step()
        self.rollouts.sync_weights(self.policy)

        logprob_gap = torch.stack(gap).mean().item()
        if self.max_logprob_gap is not None and logprob_gap > self.max_logprob_gap:
            raise RuntimeError(f"engine/trainer log-prob gap {logprob_gap:.3g} > method.max_logprob_gap="
                               f"{self.max_logprob_gap}: the engine is sampling from stale weights (weight sync "
                               "did not take)")
        elapsed = time.perf_counter() - start
        tokens = batch.attention_mask.sum().item()
        reduce = {"loss/ratio_min": min, "loss/ratio_max": max}  # the others: mean over the step's updates
        logs.update({k: reduce.get(k, lambda v: sum(v) / len(v))([m[k] for m in updates]) for k in updates[0]})
        logs["train/updates"] = float(len(updates))
        logs.update(credit.metrics)
        logs.update({
            "train/engine_logprob_gap": logprob_gap,
            "train/entropy": torch.stack(entropy).mean().item(),
            "train/lr": opt.param_groups[0]["lr"],
            "perf/step_s": elapsed,
            "perf/tokens_per_s": tokens / elapsed,
            "perf/train_tokens_per_s": tokens * self.ppo_epochs / max(elapsed - generation_s - extra_s, 1e-9),
        })
        if extra:
            logs["perf/extra_experience_frac"] = extra_s / elapsed
        self.log_dict(logs, batch_size=len(rows), prog_bar=False)
        self.log("reward", logs["train/reward/mean"], prog_bar=True, logger=False, batch_size=len(rows))

    def augment_experience(self, batch: RolloutBatch) -> dict[str, float]:
        """Extra experience a credit estimator needs, added to ``batch`` in place before credit (e.g. TCPO's
        counterfactual alternatives); returns metrics. When it returns any, the step also logs
        ``perf/extra_experience_frac``, its share of the step time. None for plain GRPO."""
        return {}

    def credit_diagnostics(self, batch: RolloutBatch, advantages: torch.Tensor) -> dict[str, float]:
        """A method's occasional diagnostics, computed before the update and logged at this step only (none for
        plain GRPO). Lightning's ``self.log`` would repeat a key's last value at every later step."""
        return {}

    def _step(self, opt, last: bool) -> None:
        """One optimiser update. Lightning counts the step's last one (``global_step``: one per training step);
        the others go to the strategy directly, which applies the same precision plugin, uncounted."""
        if last:
            opt.step()
        else:
            self.trainer.strategy.optimizer_step(opt.optimizer, closure=lambda: None)

    def _clip(self, opt) -> float:
        params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
        return float(torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm))

    def rollout_metrics(self, batch: RolloutBatch, stage: str) -> dict[str, float]:
        """Per-batch reward and length statistics under ``<stage>/``; methods add their own (a hook)."""
        scores = batch.scores
        lengths = batch.response_mask.sum(-1)
        return {
            f"{stage}/reward/mean": scores.mean().item(),
            f"{stage}/reward/std": scores.std().item() if len(scores) > 1 else 0.0,
            **{f"{stage}/reward/{k}": v.float().mean().item() for k, v in batch.reward_parts.items() if v.dim() == 1},
            f"{stage}/zero_variance_groups": 1.0 - nonzero_variance_groups(batch).float().mean().item(),
            f"{stage}/response_length": lengths.mean().item(),
            f"{stage}/truncated": sum(m["finish"][-1] == "length" for m in batch.metadata) / len(batch),
        }

    def validation_step(self, rows: list[dict[str, Any]], batch_idx: int) -> None:
        self.rollouts.bind(self.policy, self.tokenizer)
        batch = self.rollouts.generate_experience(rows, self.rollouts.val_sampling)
        logs = self.rollout_metrics(batch, "val")
        logs.pop("val/zero_variance_groups")
        self.log_dict(logs, batch_size=len(rows), prog_bar=False)
        self.log("val_reward", logs["val/reward/mean"], prog_bar=True, logger=False, batch_size=len(rows))
