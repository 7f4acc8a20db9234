"""DPA-GRPO (docs/methods.md §3): a generator and a verifier, two LoRA adapters on one base, trained together
on the form task's game (:class:`~lit_credit.tasks.form_game.FormGame`)."""
from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from lit_credit.analysis.metrics import batch_metrics, pass_at_k_metrics
from lit_credit.credit.grpo import GRPOCredit
from lit_credit.interfaces import CreditEstimator, Game, Messages
from lit_credit.losses import PolicyLoss, masked_mean
from lit_credit.methods.base import PolicyModule
from lit_credit.models.policy import PolicySource, is_peft
from lit_credit.rollout.roles import role_batch
from lit_credit.types import Completion, CreditTrace, GameRecord, RolloutBatch, SamplingParams


class DPAGRPOModule(PolicyModule):
    """DPA-GRPO on a line-by-line form (task ``form``): the training step plays the task's game, then updates
    both roles. The game (``game=form``: its rules, role rewards and cases, keys ``game.*``) is
    :class:`~lit_credit.tasks.form_game.FormGame`; this module holds the adapters, the actor that plays the roles
    with them, the per-role losses and the optimisers.

    Roles (``roles="separate"``): the generator (proposer, reviser, approver) is the LoRA adapter the policy
    source made, the verifier a second adapter of the same config on the same base; ``roles="shared"``: one
    adapter plays every role (role prompts only). The reference policy is the base with adapters disabled.

    One round: the proposals (the DataModule's rollouts, ``data.sampling.n`` per line, under the proposer's
    adapter), then ``game.play(proposals, self.actor, sampling, training)``: the actor (:meth:`actor`) activates
    the role's adapter, pushes it to an engine with its own copy of the weights when it changed, and samples
    through the experience layer (:meth:`~lit_credit.rollout.Experience.sample_messages`: the engine's retries
    and failure counts, as the main rollouts). The game's role actions become RolloutBatches
    (:func:`~lit_credit.rollout.roles.role_batch`); the engine is released (an engine in sleep mode sleeps);
    each role is updated; the next generation pushes the new weights.

    Credit: pair advantages ``A = (r - mean) / (std_pop + 1e-8)`` on pairs (``credit``,
    :class:`~lit_credit.credit.DPACredit`), a population-std GRPO group for group revisions and the proposals;
    plus a row's ``adv_bonus`` (``batch.extras``, the game's REVISE bonus on the advantage) on its action tokens.

    Loss per set of action sequences (``loss=dpa``: :class:`~lit_credit.losses.PolicyLoss` with
    :class:`~lit_credit.losses.ReinforceSurrogate`, ``seq-mean-token-sum``, ``kl_coef = beta``):
    ``mean_i [w_i (-A_i log pi(a_i) + beta KL_i)]`` with sequence-summed log-probs, ``w_i`` the row's ``weight``
    (``batch.extras``: the approver's rarity weight; 1 elsewhere), ``KL_i`` the per-token estimator summed over
    the action (``k1``: the official ``log pi(a_i) - log pi_ref(a_i)``; the config's ``k3``, see
    conf/loss/dpa.yaml). ``loss_reduction=sum`` (official) multiplies a set's loss by its number of groups
    (decisions): the official update sums the pair means over decisions. Generator loss = approver + reviser +
    ``proposal_weight`` x proposals (official 0: the DPA game trains no proposal group), verifier loss =
    ``verifier_weight`` x verifier pairs. ``separate``: two optimisers, each stepped under ``toggle_optimizer``
    with its role's adapter active (under Adam a constant loss weight on a role's own optimiser changes nothing
    but the gradient clipping); ``shared``: one optimiser, one step on the sum. Lightning's ``global_step`` counts
    optimiser steps: 2 per round with ``separate``, 1 with ``shared``.

    Metrics (``<stage>/``): the game record's (``final/*``, ``dpa/*``,
    :meth:`~lit_credit.tasks.form_game.FormGameRecord.metrics`), ``reward/*`` (the proposals); train only:
    ``loss/generator``, ``loss/verifier``, ``loss/kl/<set>``, ``train/grad_norm/<roles>``,
    ``train/proposal_logprob``.
    """

    ROLE_ADAPTER: ClassVar[dict[str, str]] = {"proposer": "generator", "reviser": "generator", "approver": "generator",
                                              "generator": "generator", "verifier": "verifier"}

    def __init__(self, policy: PolicySource, credit: CreditEstimator, loss: PolicyLoss, game: Game | None = None,
                 optimizer: OptimizerCallable = torch.optim.AdamW, lr_scheduler: LRSchedulerCallable | None = None,
                 *, roles: str = "separate", verifier_weight: float = 0.5, proposal_weight: float = 0.0,
                 loss_reduction: str = "sum", max_grad_norm: float = 1.0,
                 logprob_token_budget: int | None = 16384) -> None:
        super().__init__(policy, loss.kl_coef > 0, optimizer, lr_scheduler, max_grad_norm, logprob_token_budget)
        if roles not in ("separate", "shared"):
            raise ValueError(f"method.roles={roles!r}: use 'separate' (two LoRA adapters) or 'shared' (one)")
        if loss_reduction not in ("sum", "mean"):
            raise ValueError(f"method.loss_reduction={loss_reduction!r}: use one of sum, mean")
        if not is_peft(self.policy):
            raise ValueError("DPA-GRPO trains LoRA adapters: set model/lora=r8 (or give model.lora a peft.LoraConfig)")
        self.credit, self.loss, self.game = credit, loss, game
        self.generator_adapter = PolicySource.ADAPTER
        self.verifier_adapter = "verifier" if roles == "separate" else self.generator_adapter
        if roles == "separate":
            self.policy.add_adapter(self.verifier_adapter, copy.deepcopy(self.policy.peft_config[self.generator_adapter]))
        self.roles, self.verifier_weight, self.proposal_weight = roles, verifier_weight, proposal_weight
        self.loss_reduction = loss_reduction
        self.group_credit = GRPOCredit(unbiased=False, eps=1e-8)  # the official revision group: population std
        self.credit_trace: list[CreditTrace] = []  # the last step's credited batches (callbacks.CreditRecords)
        self._engine_adapter: str | None = None  # the adapter the engine's weights hold (None: unknown / stale)

    def random_sources(self) -> dict[str, Any]:
        """The module and the game (its exploration ``random.Random``), saved in every checkpoint."""
        return {"module": self, "game": self.game}

    # ------------------------------------------------------------------------------------------------ roles
    def adapter_params(self, adapter: str) -> list[torch.nn.Parameter]:
        return [p for n, p in self.policy.named_parameters() if "lora_" in n and f".{adapter}." in n + "."]

    def use_role(self, role: str) -> None:
        """Activate ``role``'s adapter (PEFT makes it the trainable one)."""
        adapter = self.generator_adapter if self.ROLE_ADAPTER[role] == "generator" else self.verifier_adapter
        if self.policy.active_adapter != adapter:
            self.policy.set_adapter(adapter)

    def engine_role(self, role: str) -> None:
        """Activate ``role``'s adapter and make the engine sample from it (an engine with its own copy of the
        weights, vLLM, gets them pushed only when the role's adapter or the weights changed)."""
        self.use_role(role)
        if self._engine_adapter != self.policy.active_adapter:
            self.experience.sync_weights(self.policy)
            self._engine_adapter = self.policy.active_adapter

    def actor(self, role: str, messages: Sequence[Messages], sampling: SamplingParams
              ) -> tuple[list[list[int]], list[list[Completion]]]:
        """The game's :class:`~lit_credit.interfaces.Actor`: ``role``'s replies to ``messages`` under its adapter,
        through the experience layer (retries, failure counts; no prompt: no engine call)."""
        self.engine_role(role)
        return self.experience.sample_messages(messages, sampling)

    def setup(self, stage: str) -> None:
        if self.game is None:
            raise ValueError("method=dpa_grpo plays the task's game and none is configured: select it with "
                             "game=form (experiment=dpa_form does)")
        if self.roles == "separate" and self.trainer.world_size > 1:
            raise ValueError("method.roles=separate runs on one process (DDP registers only the active adapter's "
                             "parameters); use method.roles=shared for DDP / FSDP, or trainer=cpu / one GPU")

    def configure_optimizers(self):
        """One optimiser per adapter: generator and verifier (``separate``), or one (``shared``)."""
        if self.policy.peft_config[self.generator_adapter].modules_to_save:
            raise ValueError("model.lora.modules_to_save is not supported by DPA-GRPO: only lora_* weights are "
                             "trained per role; set it to null")
        adapters = dict.fromkeys([self.generator_adapter, self.verifier_adapter])
        opts = [self.optimizer_factory(self.adapter_params(a)) for a in adapters]
        if self.scheduler_factory is None:
            return opts
        return opts, [{"scheduler": self.scheduler_factory(o), "interval": "step"} for o in opts]

    # ------------------------------------------------------------------------------------------------ a round
    def play(self, rows: list[dict[str, Any]], sampling: SamplingParams | None, training: bool
             ) -> tuple[RolloutBatch, GameRecord]:
        """The proposals of ``rows`` under the proposer's adapter (``sampling``; None: the training draw) and the
        game on them: (proposals, the game's record)."""
        data = self.rollouts
        data.bind(self.policy, self.tokenizer)
        self.engine_role("proposer")
        proposals = data.generate_experience(rows, sampling)
        return proposals, self.game.play(proposals, self.actor, sampling or data.sampling, training)

    def role_batches(self, record: GameRecord) -> dict[str, tuple[RolloutBatch, bool, str]]:
        """The record's role actions as RolloutBatches (:func:`~lit_credit.rollout.roles.role_batch`), by set name
        in the game's order (``verifier``, ``approver``, ``revisions``; empty sets left out): (batch, paired,
        the adapter trained on it)."""
        codec = self.experience.codec
        return {name: (role_batch(acts, codec), acts.paired, self.ROLE_ADAPTER[acts.role])
                for name, acts in record.actions.items() if acts is not None}

    # ------------------------------------------------------------------------------------------------ loss
    def action_backward(self, batch: RolloutBatch, pairs: bool, source: str = "", cases: torch.Tensor | None = None,
                        scale: float = 1.0) -> dict[str, float]:
        """Backpropagates ``scale`` x the DPA loss of one set of action sequences under the active adapter, a
        micro-batch at a time (:meth:`backward_by_micro_batch`); the loss's metrics. The credited batch is kept
        in ``credit_trace`` as ``source`` with each row's DPA case."""
        batch = batch.to(self.device)
        credit = (self.credit if pairs else self.group_credit)(batch)
        self.credit_trace.append(CreditTrace(source, batch, credit.advantages, cases))
        ref = self.reference_logprobs(batch)
        mask = batch.response_mask
        bonus = batch.extras.get("adv_bonus", torch.zeros(len(batch), device=self.device))
        advantages = credit.advantages + bonus[:, None] * mask
        weight = batch.extras.get("weight", torch.ones(len(batch), device=self.device))
        return self.backward_by_micro_batch(batch, self.loss, advantages, mask * weight[:, None], ref, scale=scale,
                                            entropy=False)[2]

    def training_step(self, rows: list[dict[str, Any]], batch_idx: int) -> None:
        start = time.perf_counter()
        proposals, record = self.play(rows, None, training=True)
        sets = self.loss_sets(self.role_batches(record), proposals)
        logs = {**batch_metrics(proposals, "train"), **record.metrics("train"),
                **self.rollouts.backend_counts.take(), "perf/game_s": time.perf_counter() - start}
        self.experience.release()  # the game's generation done: an engine in sleep mode sleeps until the next push
        logs |= self.update_roles(sets, record.cases)
        self._engine_adapter = None  # new weights: the next generation pushes them to an engine with a copy
        self.use_role("proposer")
        logs |= {"perf/step_s": time.perf_counter() - start,
                 "train/proposal_logprob": masked_mean(proposals.behaviour_logprobs, proposals.response_mask).item()}
        self.log_dict(logs, batch_size=len(rows))
        self.log("final", logs["train/final/strict"], prog_bar=True, logger=False, batch_size=len(rows))

    def loss_sets(self, batches: dict[str, tuple[RolloutBatch, bool, str]], proposals: RolloutBatch
                  ) -> dict[str, list[tuple[str, RolloutBatch, bool, float]]]:
        """Per adapter, its sets in the game's order, then the proposals: ``(name, batch, paired, loss weight)``
        (the verifier's sets weigh ``verifier_weight``, the proposals ``proposal_weight``)."""
        sets: dict[str, list] = {"verifier": [], "generator": []}
        for name, (batch, paired, adapter) in batches.items():
            sets[adapter].append((name, batch, paired, self.verifier_weight if adapter == "verifier" else 1.0))
        sets["generator"].append(("proposals", proposals, False, self.proposal_weight))
        return sets

    def role_backward(self, sets: list[tuple[str, RolloutBatch, bool, float]], cases: torch.Tensor,
                      logs: dict[str, float]) -> float:
        """Backpropagates one role's loss under its active adapter, the weighted sum of its sets' DPA losses
        (:meth:`action_backward`; ``loss_reduction=sum``: each times its number of decisions, as the official
        update sums pair means); that loss's value."""
        total = 0.0
        for name, batch, pairs, weight in sets:
            if weight:
                # rows of the role batches are grouped by decision; proposal i is decision i
                rows = cases if name == "proposals" else cases[batch.group_ids.cpu()]
                if self.loss_reduction == "sum":
                    weight = weight * batch.group_ids.unique().numel()
                metrics = self.action_backward(batch, pairs, name, rows, weight)
                total += weight * metrics["loss/total"]
                logs[f"loss/kl/{name}"] = metrics.get("loss/kl", 0.0)
        return total

    def update_roles(self, sets: dict[str, list], cases: torch.Tensor) -> dict[str, float]:
        """One optimiser step per adapter (``separate``: verifier then generator, each under
        ``toggle_optimizer`` with its role's adapter active; ``shared``: one step on the summed loss), then the LR
        schedules; the losses, KL terms, gradient norms and learning rate."""
        self.credit_trace, logs = [], {}
        optimizers = self.optimizers()
        if self.roles == "separate":  # configure_optimizers' order: generator, verifier
            steps = [(optimizers[1], ["verifier"]), (optimizers[0], ["generator"])]
        else:  # one adapter: one step on the summed loss
            steps = [(optimizers, ["verifier", "generator"])]
        for opt, roles in steps:
            self.toggle_optimizer(opt)
            opt.zero_grad()
            for role in roles:
                self.use_role(role)
                logs[f"loss/{role}"] = self.role_backward(sets[role], cases, logs)
            logs[f"train/grad_norm/{'+'.join(roles)}"] = self._clip(opt)
            opt.step()  # also without gradients, so global_step counts rounds x optimisers
            self.untoggle_optimizer(opt)
        schedulers = self.lr_schedulers()
        for sched in schedulers if isinstance(schedulers, list) else [schedulers] if schedulers else []:
            sched.step()
        return logs | {"train/lr": steps[-1][0].param_groups[0]["lr"]}

    def validation_step(self, rows: list[dict[str, Any]], batch_idx: int) -> None:
        """The game on greedy proposals (``val/``: ``reward/*`` of the proposals, the game record's ``final/*``
        and ``dpa/*``) and, with ``data.val_samples = n > 0``, n sampled proposals per line at T = 1 under the
        proposer's adapter (``val/sampled/``: ``reward/*``, ``zero_variance_groups``, ``pass@1..n``; the game is
        not played on them: its metrics are greedy only), isolated from the training RNG."""
        proposals, record = self.play(rows, self.rollouts.val_sampling, training=False)
        logs = {**batch_metrics(proposals, "val"), **record.metrics("val")}
        for key in ("val/zero_variance_groups", "val/dpa/revise_bonus"):  # no update at validation
            logs.pop(key)
        if self.rollouts.val_samples:
            self.engine_role("proposer")
            sampled = self.rollouts.sampled_validation(rows)
            logs |= batch_metrics(sampled, "val/sampled") | pass_at_k_metrics(sampled, self.rollouts.val_success,
                                                                               "val/sampled")
        self.use_role("proposer")
        self.log_dict(logs, batch_size=len(rows))
        self.log("val_final", logs["val/final/strict"], prog_bar=True, logger=False, batch_size=len(rows))
