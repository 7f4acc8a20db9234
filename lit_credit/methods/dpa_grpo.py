"""DPA-GRPO (docs/methods.md §3): a generator and a verifier, two LoRA adapters on one base, trained together
on a task's multi-role game (the form task's: :class:`~lit_credit.tasks.form_game.FormGame`)."""
from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from lit_credit.analysis.metrics import batch_metrics, pass_at_k_metrics
from lit_credit.distributed import gather_objects
from lit_credit.interfaces import CreditEstimator, Game, Messages
from lit_credit.losses import PolicyLoss, masked_mean
from lit_credit.methods.base import PolicyModule
from lit_credit.models.policy import PolicySource, is_peft
from lit_credit.rollout.roles import role_batch
from lit_credit.types import Completion, CreditTrace, GameRecord, RolloutBatch, SamplingParams

ADAPTERS = ("generator", "verifier")  # the method's two LoRA adapters: the policy source's, and a copy of its config
PROPOSER = "proposer"  # the role of the proposals (the step's rollouts), which every game's roles include


class DPAGRPOModule(PolicyModule):
    """DPA-GRPO: the training step plays the task's game, then updates both roles' adapters. The game (``game=``;
    the form task's, ``game=form``: its rules, role rewards and cases, keys ``game.*``, is
    :class:`~lit_credit.tasks.form_game.FormGame`) is text-level; this module holds the adapters, the actor that
    plays the roles with them, the per-role credit and losses, and the optimisers.

    Roles and adapters: a game (:class:`~lit_credit.interfaces.Game`) names its ``roles``, ``proposer`` among them
    (the proposals), and says in ``role_adapters`` which of the method's two adapters plays each (``generator`` or
    ``verifier``; the form game: the generator plays proposer, reviser and approver, the verifier the verifier; set
    in the game's config, ``game.role_adapters``). ``roles="separate"``: the generator is the LoRA adapter the
    policy source made, the verifier a second adapter of the same config on the same base; ``roles="shared"``: one
    adapter plays every role (role prompts only). The reference policy is the base with adapters disabled.

    One round: the proposals (the experience layer's rollouts, ``data.sampling.n`` per prompt, under the
    proposer's adapter), then ``game.play(proposals, self.actor, sampling, training)``: the actor (:meth:`actor`)
    activates the role's adapter, pushes it to an engine with its own copy of the weights when it changed, and
    samples through the experience layer (:meth:`~lit_credit.rollout.Experience.sample_messages`: the engine's
    retries and failure counts, as the main rollouts). The game's role actions become RolloutBatches
    (:func:`~lit_credit.rollout.roles.role_batch`); the engine is released (an engine in sleep mode sleeps); each
    adapter is updated; the next generation pushes the new weights.

    Credit, per role: ``role_credit[role]`` where given (``method.role_credit``; official: the proposals' group,
    ``proposer``, is a population-std GRPO group), else ``credit`` (``credit=``; DPA's pair credit
    :class:`~lit_credit.credit.DPACredit`, ``A = (r - mean) / (std_pop + 1e-8)`` within each decision's rows: a
    pair, or the form game's group revisions); plus a row's ``adv_bonus`` (``batch.extras``, the form game's
    REVISE bonus on the advantage) on its action tokens.

    Loss per set of action sequences (``loss=dpa``: :class:`~lit_credit.losses.PolicyLoss` with
    :class:`~lit_credit.losses.ReinforceSurrogate`, ``seq-mean-token-sum``, ``kl_coef = beta``):
    ``mean_i [w_i (-A_i log pi(a_i) + beta KL_i)]`` with sequence-summed log-probs, ``w_i`` the row's ``weight``
    (``batch.extras``: the approver's rarity weight; 1 elsewhere), ``KL_i`` the per-token estimator summed over
    the action (``k1``: the official ``log pi(a_i) - log pi_ref(a_i)``; the config's ``k3``, see
    conf/loss/dpa.yaml). ``loss_reduction=sum`` (official) multiplies a set's loss by its number of groups
    (decisions): the official update sums the pair means over decisions. Generator loss = the sets of the
    generator's roles (form: approver + reviser) + ``proposal_weight`` x proposals (official 0: the DPA game trains
    no proposal group), verifier loss = ``verifier_weight`` x the sets of the verifier's roles (form: the verifier
    pairs). ``separate``: two optimisers, each stepped under ``toggle_optimizer`` with its adapter active (under
    Adam a constant loss weight on a role's own optimiser changes nothing but the gradient clipping); ``shared``:
    one optimiser, one step on the sum. Lightning's ``global_step`` counts optimiser steps: 2 per round with
    ``separate``, 1 with ``shared``. Several processes (``shared``): every rank runs the passes of every set some
    rank holds, a weight-0 one where its own share left the set empty (:meth:`loss_sets`), so the collectives of
    DDP / FSDP2 line up.

    Metrics (``<stage>/``): the game record's (form: ``final/*``, ``dpa/*``,
    :meth:`~lit_credit.tasks.form_game.FormGameRecord.metrics`; its ``headline`` on the progress bar), ``reward/*``
    (the proposals); train only: ``loss/generator``, ``loss/verifier``, ``loss/kl/<set>``,
    ``train/grad_norm/<adapters>``, ``train/proposal_logprob``.
    """

    def __init__(self, policy: PolicySource, credit: CreditEstimator, loss: PolicyLoss, game: Game | None = None,
                 optimizer: OptimizerCallable = torch.optim.AdamW, lr_scheduler: LRSchedulerCallable | None = None,
                 *, role_credit: Mapping[str, CreditEstimator] | None = None, roles: str = "separate",
                 verifier_weight: float = 0.5, proposal_weight: float = 0.0, loss_reduction: str = "sum",
                 max_grad_norm: float = 1.0, logprob_token_budget: int | None = 16384) -> None:
        super().__init__(policy, loss.kl_coef > 0, optimizer, lr_scheduler, max_grad_norm, logprob_token_budget)
        if roles not in ("separate", "shared"):
            raise ValueError(f"method.roles={roles!r}: use 'separate' (two LoRA adapters) or 'shared' (one)")
        if loss_reduction not in ("sum", "mean"):
            raise ValueError(f"method.loss_reduction={loss_reduction!r}: use one of sum, mean")
        if not is_peft(self.policy):
            raise ValueError("DPA-GRPO trains LoRA adapters: set model/lora=r8 (or give model.lora a peft.LoraConfig)")
        self.credit, self.loss, self.game = credit, loss, game
        self.role_credit = dict(role_credit or {})
        self.role_adapters = check_roles(game, self.role_credit) if game is not None else {}
        self.generator_adapter = PolicySource.ADAPTER
        self.verifier_adapter = "verifier" if roles == "separate" else self.generator_adapter
        if roles == "separate":
            self.policy.add_adapter(self.verifier_adapter, copy.deepcopy(self.policy.peft_config[self.generator_adapter]))
        self.roles, self.verifier_weight, self.proposal_weight = roles, verifier_weight, proposal_weight
        self.loss_reduction = loss_reduction
        self.credit_trace: list[CreditTrace] = []  # the last step's credited batches (callbacks.CreditRecords)
        self._engine_adapter: str | None = None  # the adapter the engine's weights hold (None: unknown / stale)

    def random_sources(self) -> dict[str, Any]:
        """The module and the game (its exploration ``random.Random``), saved in every checkpoint."""
        return {"module": self, "game": self.game}

    # ------------------------------------------------------------------------------------------------ roles
    def adapter_params(self, adapter: str) -> list[torch.nn.Parameter]:
        return [p for n, p in self.policy.named_parameters() if "lora_" in n and f".{adapter}." in n + "."]

    def estimator(self, role: str) -> CreditEstimator:
        """``role``'s credit estimator: ``role_credit[role]``, else ``credit``."""
        return self.role_credit.get(role, self.credit)

    def use_role(self, role: str) -> None:
        """Activate the adapter that plays ``role`` (the game's ``role_adapters``)."""
        self.use_adapter(self.role_adapters[role])

    def use_adapter(self, adapter: str) -> None:
        """Activate the ``generator`` or ``verifier`` adapter (with ``roles=shared`` both are the one adapter;
        PEFT makes the active one the trainable one)."""
        name = self.generator_adapter if adapter == "generator" else self.verifier_adapter
        if self.policy.active_adapter != name:
            self.policy.set_adapter(name)

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
        super().setup(stage)
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
    def play(self, rows: list[dict[str, Any]], training: bool) -> tuple[RolloutBatch, GameRecord]:
        """The proposals of ``rows`` under the proposer's adapter (training: the step's draw at the train sampling;
        else greedy validation) and the game on them: (proposals, the game's record)."""
        experience = self.experience
        self.engine_role(PROPOSER)
        if training:
            proposals, sampling = experience.draw(rows), experience.sampling
        else:
            proposals, sampling = experience.draw_validation(rows), experience.val_sampling
        return proposals, self.game.play(proposals, self.actor, sampling, training)

    def role_batches(self, record: GameRecord) -> dict[str, tuple[RolloutBatch, str]]:
        """The record's role actions as RolloutBatches (:func:`~lit_credit.rollout.roles.role_batch`), by set name
        in the game's order (form: ``verifier``, ``approver``, ``revisions``; empty sets left out): (batch, the
        role whose adapter is trained on it)."""
        codec = self.experience.codec
        return {name: (role_batch(acts, codec), acts.role) for name, acts in record.actions.items() if acts is not None}

    # ------------------------------------------------------------------------------------------------ loss
    def action_backward(self, batch: RolloutBatch, role: str, source: str = "", cases: torch.Tensor | None = None,
                        scale: float = 1.0) -> dict[str, float]:
        """Backpropagates ``scale`` x the DPA loss of one set of ``role``'s action sequences (credited by
        :meth:`estimator`) under the active adapter, a micro-batch at a time (:meth:`backward_by_micro_batch`); the
        loss's metrics. The credited batch is kept in ``credit_trace`` as ``source`` with each row's case."""
        batch = batch.to(self.device)
        credit = self.estimator(role)(batch)
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
        proposals, record = self.play(rows, training=True)
        sets = self.loss_sets(self.role_batches(record), proposals, order=list(record.actions))
        logs = {**batch_metrics(proposals, "train"), **record.metrics("train"),
                **self.experience.backend_counts.take(), "perf/game_s": time.perf_counter() - start}
        self.experience.release()  # the game's generation done: an engine in sleep mode sleeps until the next push
        logs |= self.update_roles(sets, record.cases)
        self._engine_adapter = None  # new weights: the next generation pushes them to an engine with a copy
        self.use_role(PROPOSER)
        logs |= {"perf/step_s": time.perf_counter() - start,
                 "train/proposal_logprob": masked_mean(proposals.behaviour_logprobs, proposals.response_mask).item()}
        self.log_dict(logs, batch_size=len(rows))
        if record.headline is not None:
            self.log("final", logs[f"train/{record.headline}"], prog_bar=True, logger=False, batch_size=len(rows))

    def loss_sets(self, batches: dict[str, tuple[RolloutBatch, str]], proposals: RolloutBatch,
                  order: Sequence[str] | None = None) -> dict[str, list[tuple[str, RolloutBatch, str | None, float]]]:
        """Per adapter (``verifier``, ``generator``), the sets of the roles it plays in the game's order (``order``:
        the record's set names; default ``batches``' order), then the proposals on the proposer's: ``(name, batch,
        role, loss weight)`` (the verifier's sets weigh ``verifier_weight``, the proposals ``proposal_weight``, the
        others 1).

        Several processes: the sets are every rank's (the names and roles gathered); a set another rank holds and
        this one does not (its role's rows all left out here) is a padding entry, ``(name, one row of the
        proposals, None, weight)``, that :meth:`role_backward` runs as a weight-0 pass (:meth:`padding_backward`):
        every rank then runs the same forwards and backwards, whose collectives (DDP's gradient all-reduce,
        FSDP2's gathers and reduce-scatters, the micro-batch counts) only line up when every rank reaches them,
        as the GRPO family pads its minibatches."""
        held: dict[str, str] = {}
        for part in gather_objects({name: role for name, (_, role) in batches.items()}):  # rank order
            for name, role in part.items():
                held.setdefault(name, role)
        names = [n for n in dict.fromkeys([*(order or ()), *held]) if n in held]  # the same on every rank
        pad = proposals.select(torch.zeros(1, dtype=torch.long, device=proposals.input_ids.device))
        sets: dict[str, list] = {"verifier": [], "generator": []}
        for name in names:
            adapter = self.role_adapters[held[name]]
            entry = (name, *batches[name]) if name in batches else (name, pad, None)
            sets[adapter].append((*entry, self.verifier_weight if adapter == "verifier" else 1.0))
        sets[self.role_adapters[PROPOSER]].append(("proposals", proposals, PROPOSER, self.proposal_weight))
        return sets

    def role_backward(self, sets: list[tuple[str, RolloutBatch, str | None, float]], cases: torch.Tensor,
                      logs: dict[str, float]) -> float:
        """Backpropagates one adapter's loss under it, the weighted sum of its sets' DPA losses
        (:meth:`action_backward`; ``loss_reduction=sum``: each times its number of decisions, as the official
        update sums pair means), and a padding entry's weight-0 pass (role None, :meth:`loss_sets`); that loss's
        value."""
        total = 0.0
        for name, batch, role, weight in sets:
            if not weight:  # a weight of the config: the same on every rank
                continue
            if role is None:
                self.padding_backward(batch)
                continue
            # rows of the role batches are grouped by decision; proposal i is decision i
            rows = cases if name == "proposals" else cases[batch.group_ids.cpu()]
            if self.loss_reduction == "sum":
                weight = weight * batch.group_ids.unique().numel()
            metrics = self.action_backward(batch, role, name, rows, weight)
            total += weight * metrics["loss/total"]
            logs[f"loss/kl/{name}"] = metrics.get("loss/kl", 0.0)
        return total

    def padding_backward(self, batch: RolloutBatch) -> None:
        """A weight-0 pass of the DPA loss on ``batch`` (no credit, no trace): the reference forward and the
        micro-batched backward a set's :meth:`action_backward` runs, with a zero mask and scale, so this rank
        joins the collectives of a set only other ranks hold (:meth:`loss_sets`); the gradients are unchanged."""
        batch = batch.to(self.device)
        ref = self.reference_logprobs(batch)
        zeros = torch.zeros_like(batch.response_mask)
        self.backward_by_micro_batch(batch, self.loss, zeros, zeros, ref, scale=0.0, entropy=False)

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
        for opt, adapters in steps:
            self.toggle_optimizer(opt)
            opt.zero_grad()
            for adapter in adapters:
                self.use_adapter(adapter)
                logs[f"loss/{adapter}"] = self.role_backward(sets[adapter], cases, logs)
            logs[f"train/grad_norm/{'+'.join(adapters)}"] = self._clip(opt)
            opt.step()  # also without gradients, so global_step counts rounds x optimisers
            self.untoggle_optimizer(opt)
        schedulers = self.lr_schedulers()
        for sched in schedulers if isinstance(schedulers, list) else [schedulers] if schedulers else []:
            sched.step()
        return logs | {"train/lr": steps[-1][0].param_groups[0]["lr"]}

    def validation_step(self, rows: list[dict[str, Any]], batch_idx: int) -> None:
        """The game on greedy proposals (``val/``: ``reward/*`` of the proposals and the game record's metrics) and,
        with ``data.val_samples = n > 0``, n sampled proposals per prompt at T = 1 under the proposer's adapter
        (``val/sampled/``: ``reward/*``, ``zero_variance_groups``, ``pass@1..n``; the game is not played on them:
        its metrics are greedy only), isolated from the training RNG."""
        proposals, record = self.play(rows, training=False)
        logs = {**batch_metrics(proposals, "val"), **record.metrics("val")}
        logs.pop("val/zero_variance_groups")  # no update at validation
        experience = self.experience
        if experience.val_samples:
            self.engine_role(PROPOSER)
            sampled = experience.sampled_validation(rows)
            logs |= batch_metrics(sampled, "val/sampled") | pass_at_k_metrics(sampled, experience.val_success,
                                                                               "val/sampled")
        self.use_role(PROPOSER)
        self.log_dict(logs, batch_size=len(rows))
        if record.headline is not None:
            self.log("val_final", logs[f"val/{record.headline}"], prog_bar=True, logger=False, batch_size=len(rows))


def check_roles(game: Game, role_credit: Mapping[str, CreditEstimator]) -> dict[str, str]:
    """The game's ``role_adapters`` (role -> ``generator`` or ``verifier``), checked against its ``roles`` and
    ``role_credit``'s keys: every role has an adapter, ``proposer`` is a role, no key names a role the game does not
    have; a ``ValueError`` naming the field otherwise."""
    name = type(game).__name__
    roles = tuple(getattr(game, "roles", ()))
    adapters = dict(getattr(game, "role_adapters", None) or {})
    if PROPOSER not in roles:
        raise ValueError(f"game {name}: its roles {roles} lack {PROPOSER!r}, the role of the proposals (the step's "
                         "rollouts) that DPA-GRPO draws first")
    for role in roles:
        if role not in adapters:
            raise ValueError(f"game.role_adapters has no adapter for the role {role!r} of {name} (roles: {roles}); "
                             f"fix: game.role_adapters.{role}=generator or verifier")
    for role, adapter in adapters.items():
        if role not in roles:
            raise ValueError(f"game.role_adapters.{role}: {name} has no role {role!r} (roles: {roles})")
        if adapter not in ADAPTERS:
            raise ValueError(f"game.role_adapters.{role}={adapter!r}: use one of {', '.join(ADAPTERS)}")
    for role in role_credit:
        if role not in roles:
            raise ValueError(f"method.role_credit.{role}: {name} has no role {role!r} (roles: {roles}); a role "
                             "without an entry is credited by credit=")
    return adapters
