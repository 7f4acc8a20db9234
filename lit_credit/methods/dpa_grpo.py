"""DPA-GRPO (docs/methods.md §3): a generator and a verifier, two LoRA adapters on one base, trained
together."""
from __future__ import annotations

import copy
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch

from lit_credit.credit.grpo import GRPOCredit
from lit_credit.losses import masked_mean
from lit_credit.methods.grpo import GRPOModule
from lit_credit.models.policy import PolicySource, is_peft
from lit_credit.rewards.dpa import (
    APPROVER_ACTIONS,
    CASES,
    SHOWN_REVISION_RULES,
    VERIFIER_ACTIONS,
    approver_pair_rewards,
    case_labels,
    case_shares,
    rarity_weights,
    revise_bonus,
    reviser_pair_rewards,
    revision_rewards,
    shown_revision,
    verifier_pair_rewards,
)
from lit_credit.rewards.form_line import line_correct, parse_value
from lit_credit.rollout.loop import Episode, to_batch
from lit_credit.tasks.form import action_text, parse_decision, role_prompt
from lit_credit.types import Completion, CreditTrace, RolloutBatch, SamplingParams


@dataclass
class Game:
    """One step of the DPA game over N line decisions (one per proposal), and the action sequences it scores.

    ``verifier`` / ``approver``: pairs of canonical actions (rows 2n, 2n+1 = decision n's two actions, group
    id n) with their role rewards as ``scores``; ``revisions``: the reviser's batch, pairs (keep text, revise
    text) when ``revisions_paired`` (``revision_update=paired``), else the K sampled revisions of each
    challenged decision whose rewards are not all equal (group = decision). Flags are [N] bool tensors.
    """

    x_correct: torch.Tensor
    challenged: torch.Tensor
    revised: torch.Tensor
    z_correct: torch.Tensor
    has_revision: torch.Tensor
    final_strict: torch.Tensor
    final_lenient: torch.Tensor
    cases: torch.Tensor
    verifier: RolloutBatch | None
    approver: RolloutBatch | None
    revisions: RolloutBatch | None
    counts: dict[str, float]
    revisions_paired: bool = False


def action_batch(prompts: Sequence[list[int]], actions: Sequence[list[int]], groups: Sequence[int],
                 rewards: Sequence[float], pad_id: int, logprobs: Sequence[list[float]] | None = None,
                 temperature: float = 1.0) -> RolloutBatch:
    """Sequences ``prompt + action`` with response mask 1 on the action tokens, one group id and score each;
    their log-probs are taken at ``temperature`` (what they were sampled at; 1 for scored actions)."""
    episodes = []
    for i, (prompt, action, group) in enumerate(zip(prompts, actions, groups)):
        ep = Episode(row={}, group=group, token_ids=list(prompt))
        ep.add_reply(Completion(list(action), list(logprobs[i]) if logprobs else [0.0] * len(action), ""), 0)
        episodes.append(ep)
    return to_batch(episodes, [{"score": r} for r in rewards], pad_id, temperature=temperature)


class DPAGRPOModule(GRPOModule):
    """DPA-GRPO on a line-by-line form (task ``form``): the training step plays the game, then updates both roles.

    Roles (``roles="separate"``): the generator (proposer, reviser, approver) is the LoRA adapter the policy
    source made, the verifier a second adapter of the same config on the same base; ``roles="shared"``: one
    adapter plays every role (role prompts only). The reference policy is the base with adapters disabled.

    The game, per line decision, as the official code (stevenyu97/Generator_Verifier_Multi_Agent,
    ``dpa_grpo/``) plays it; every choice is a key, the official one the default:

    1. proposal ``x``: the DataModule's rollouts, ``data.sampling.n`` per line at the sampling temperature,
       scored by the form oracle. The official game samples one proposal per line and plays it; here every
       proposal of the group plays its own game (the same game, n times per line). The official DPA run
       trains no proposal group: ``proposal_weight`` 0 (a key beyond the paper: > 0 adds the proposals' GRPO
       group to the generator loss).
    2. verifier NS / SAC at the sampling temperature; a reply that is not a decision counts as
       ``unparsable_verdict`` (official: SAC, with an empty challenge; the official verifier challenges
       whenever its verdict is not "correct").
    3. on SAC, ``revisions`` (K) revisions at ``revision_temperature``; the one shown is chosen by
       ``shown_revision`` (:func:`~lit_credit.rewards.dpa.shown_revision`; official ``gold_first``: the first
       that matches gold, else the first parsable, **the oracle choosing the approver's input at training
       time**; validation draws one revision, so no choice there).
    4. approver KEEP / REVISE (unparsable: KEEP); then, in training only, a decision that is not REVISE is
       forced to REVISE with probability ``explore_revise`` (official 0.4). Forced decisions count as REVISE
       everywhere (final value, case, REVISE share), as officially; ``dpa/forced_revise_rate`` logs them.
    5. final value: z on REVISE with a parsable z, else x.

    Rewards (all from the oracle, i.e. gold at training time, as in any outcome-rewarded RL) and credit:

    * verifier pair ``r(SAC) = 1[x wrong], r(NS) = 1[x right]``, skipped for an unparsable x;
    * approver pair from the approver table (``alpha``, ``cave``, ``miss``, ``unparsable``) on every challenged
      decision (``train_approver_without_revision=false``: not where the shown revision is unparsable, as a
      later official commit does), plus the REVISE bonus ``revise_balance * max(revise_target - REVISE
      share, 0)`` (:func:`~lit_credit.rewards.dpa.revise_bonus`) on the REVISE reward (``revise_bonus_on=
      reward``, official: inert under pair normalisation with the paper's table) or advantage;
    * the reviser, ``revision_update=paired`` (official): the pair (keep text = x, revise text = the shown z)
      under the reviser's prompt, :func:`~lit_credit.rewards.dpa.reviser_pair_rewards`; ``group`` (a later
      official commit): the K revisions as a GRPO group, ``S_z`` or ``unparsable`` each, population std,
      all-equal groups skipped. ``skip_unparsable_revisions`` (official true): paired, no pair where z is
      unparsable; group, unparsable revisions left out of the group.
    * pair advantages ``A = (r - mean) / (std_pop + 1e-8)`` (``credit``, :class:`~lit_credit.credit.DPACredit`).

    Loss per set of action sequences (``loss``: :class:`~lit_credit.losses.PolicyLoss` with
    :class:`~lit_credit.losses.ReinforceSurrogate`, ``seq-mean-token-sum``, ``kl_coef = beta``):
    ``mean_i [-A_i log pi(a_i) + beta KL_i]`` with sequence-summed log-probs, ``KL_i`` the per-token estimator
    summed over the action (``k1``: the official ``log pi(a_i) - log pi_ref(a_i)``; the config's default ``k3``,
    see conf/method/dpa_grpo.yaml). ``loss_reduction=sum`` (official) multiplies a part's loss by its number
    of groups (decisions): the official update sums the pair means over decisions. Rarity weight
    ``(mean case count / case count)^rarity_power`` on the approver pairs only, counted over the challenged
    decisions by the official case id (5a/5b one case, 6a/6b one; the cases read gold). Generator loss =
    approver + reviser + ``proposal_weight`` x proposals, verifier loss = ``verifier_weight`` x verifier
    pairs. ``separate``: two optimisers, each stepped under ``toggle_optimizer`` with its role's adapter active
    (under Adam a constant loss weight on a role's own optimiser changes nothing but the gradient clipping);
    ``shared``: one optimiser, one step on the sum. Lightning's ``global_step`` counts optimiser steps: 2 per
    round with ``separate``, 1 with ``shared``.

    Log-prob temperatures (every batch is scored at ``batch.temperature``): the canonical verifier / approver
    actions and the reviser's (keep, revise) pair are scored, not sampled, at T = 1, as the official code
    scores every sequence (a plain forward); group revisions at ``revision_temperature`` and proposals at
    ``data.sampling.temperature``, the temperatures they were sampled at.

    Metrics (``<stage>/``): ``final/strict``, ``final/lenient`` (line accuracy of the submitted values),
    ``reward/*`` (the proposals), ``dpa/case/<c>`` for the taxonomy 1 2 3 4 5a 5b 6a 6b, ``dpa/sac_rate``,
    ``dpa/revise_rate``, ``dpa/forced_revise_rate``, ``dpa/verifier_acc`` (SAC exactly when x is wrong),
    ``dpa/revision_correct`` (all K), ``dpa/shown_correct`` (the shown one, per challenge),
    ``dpa/unparsable/{verifier,approver,revision}``, ``dpa/truncated/verifier`` (replies cut at
    ``role_max_new_tokens``); train only: ``dpa/revise_bonus``, ``loss/generator``, ``loss/verifier``.
    """

    ROLE_ADAPTER: ClassVar[dict[str, str]] = {"proposer": "generator", "reviser": "generator", "approver": "generator",
                                              "generator": "generator", "verifier": "verifier"}

    def __init__(self, policy: PolicySource, credit, loss, optimizer=torch.optim.AdamW, lr_scheduler=None, *,
                 roles: str = "separate", revisions: int = 5, revision_temperature: float = 0.7,
                 role_max_new_tokens: int = 64, verifier_weight: float = 0.5, proposal_weight: float = 0.0,
                 alpha: float = 0.5, cave: float = 0.2, miss: float = 0.3, unparsable: float = -0.25,
                 shown_revision: str = "gold_first", unparsable_verdict: str = "SAC",
                 revision_update: str = "paired", skip_unparsable_revisions: bool = True,
                 train_approver_without_revision: bool = True, revise_bonus_on: str = "reward",
                 loss_reduction: str = "sum",
                 revise_balance: float = 1.5, revise_target: float = 0.3, rarity_power: float = 1.0,
                 explore_revise: float = 0.4, max_grad_norm: float = 1.0, seed: int = 0) -> None:
        super().__init__(policy, credit, loss, optimizer, lr_scheduler, max_grad_norm=max_grad_norm)
        if roles not in ("separate", "shared"):
            raise ValueError(f"method.roles={roles!r}: use 'separate' (two LoRA adapters) or 'shared' (one)")
        if not is_peft(self.policy):
            raise ValueError("DPA-GRPO trains LoRA adapters: set model/lora=r8 (or give model.lora a peft.LoraConfig)")
        if revisions < 1:
            raise ValueError(f"method.revisions={revisions}: must be >= 1")
        if not 0 <= explore_revise <= 1:
            raise ValueError(f"method.explore_revise={explore_revise}: must be in [0, 1]")
        choices = {"shown_revision": (shown_revision, SHOWN_REVISION_RULES),
                   "unparsable_verdict": (unparsable_verdict, VERIFIER_ACTIONS),
                   "revision_update": (revision_update, ("paired", "group")),
                   "revise_bonus_on": (revise_bonus_on, ("reward", "advantage")),
                   "loss_reduction": (loss_reduction, ("sum", "mean"))}
        for key, (value, valid) in choices.items():
            if value not in valid:
                raise ValueError(f"method.{key}={value!r}: use one of {', '.join(valid)}")
        self.generator_adapter = PolicySource.ADAPTER
        self.verifier_adapter = "verifier" if roles == "separate" else self.generator_adapter
        if roles == "separate":
            self.policy.add_adapter(self.verifier_adapter, copy.deepcopy(self.policy.peft_config[self.generator_adapter]))
        self.roles, self.revisions, self.revision_temperature = roles, revisions, revision_temperature
        self.role_max_new_tokens, self.verifier_weight, self.proposal_weight = role_max_new_tokens, verifier_weight, proposal_weight
        self.table = {"alpha": alpha, "cave": cave, "miss": miss, "unparsable": unparsable}
        self.shown_revision, self.unparsable_verdict = shown_revision, unparsable_verdict
        self.revision_update, self.skip_unparsable_revisions = revision_update, skip_unparsable_revisions
        self.train_approver_without_revision, self.revise_bonus_on = train_approver_without_revision, revise_bonus_on
        self.loss_reduction = loss_reduction
        self.revise_balance, self.revise_target = revise_balance, revise_target
        self.rarity_power, self.explore_revise = rarity_power, explore_revise
        self.group_credit = GRPOCredit(unbiased=False, eps=1e-8)  # the official revision group: population std
        self._explore = random.Random(seed)
        self._engine_adapter: str | None = None  # the adapter the engine's weights hold (None: unknown / stale)

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
            self.rollouts.sync_weights(self.policy)
            self._engine_adapter = self.policy.active_adapter

    def setup(self, stage: str) -> None:
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

    # ------------------------------------------------------------------------------------------------ game
    def _generate(self, role: str, messages: list[list[dict[str, str]]], sampling: SamplingParams):
        """Sample ``role``'s replies; an engine with its own weights (vLLM) gets the role's adapter first."""
        self.engine_role(role)
        codec = self.rollouts.codec
        prompts = [codec.prompt_ids(m) for m in messages]
        return prompts, (self.rollouts.engine.generate(prompts, sampling) if prompts else [])

    def action_ids(self, line: str, decision: str) -> list[int]:
        """The tokens of a canonical action as the role emits them: the decision line and end of turn (NS, KEEP,
        REVISE end the reply), or the decision line and its newline (SAC goes on with the challenge line)."""
        codec = self.rollouts.codec
        text = action_text(line, decision)
        return codec._encode(text + "\n") if decision == "SAC" else codec.reply_ids(text)

    def _pairs(self, prompts, rows, choices, rewards: torch.Tensor, keep: torch.Tensor) -> RolloutBatch | None:
        index = keep.nonzero().squeeze(-1).tolist()
        if not index:
            return None
        actions = [self.action_ids(rows[i]["line"], c) for i in index for c in choices]
        return action_batch([prompts[i] for i in index for _ in choices], actions, [i for i in index for _ in choices],
                            rewards[index].flatten().tolist(), self.rollouts.codec.pad_id)

    def play(self, proposals: RolloutBatch, sampling: SamplingParams, revisions: int, explore: float) -> Game:
        """The rest of the game for every proposal of ``proposals`` (see the class docstring)."""
        rows = [m["row"] for m in proposals.metadata]
        x_text = [m["replies"][-1].strip().split("\n")[0] for m in proposals.metadata]
        x_correct = proposals.reward_parts["strict"].bool().cpu()
        x_lenient = proposals.reward_parts["lenient"].bool().cpu()
        x_parsable = proposals.reward_parts["parsable"].bool().cpu()
        n = len(rows)
        role_sampling = replace(sampling, n=1, max_new_tokens=self.role_max_new_tokens, stop=())

        # Verifier: NS or SAC with a challenge; a reply that is not a decision counts as `unparsable_verdict`.
        v_prompts, v_out = self._generate("verifier", [role_prompt(r, "verifier", x) for r, x in zip(rows, x_text)],
                                          role_sampling)
        verdicts = [parse_decision(c[0].text, VERIFIER_ACTIONS) for c in v_out]
        challenged = torch.tensor([(d or self.unparsable_verdict) == "SAC" for d, _ in verdicts], dtype=torch.bool)
        sac = challenged.nonzero().squeeze(-1).tolist()

        # Revisions (K per challenged decision), one shown (`shown_revision`; gold_first reads the oracle).
        r_prompts, r_out = self._generate(
            "reviser", [role_prompt(rows[i], "reviser", x_text[i], verdicts[i][1]) for i in sac],
            replace(sampling, n=revisions, temperature=self.revision_temperature, stop=()))
        values = [[parse_value(c.text) for c in alts] for alts in r_out]
        parsable = torch.tensor([[v is not None for v in vs] for vs in values], dtype=torch.bool).reshape(-1, revisions)
        right = [[line_correct(v, rows[i]["gold"]) for v in vs] for i, vs in zip(sac, values)]
        correct = torch.tensor([[s for s, _ in r] for r in right], dtype=torch.bool).reshape(-1, revisions)
        lenient = torch.tensor([[le for _, le in r] for r in right], dtype=torch.bool).reshape(-1, revisions)
        shown = shown_revision(correct, parsable, self.shown_revision)
        picked = torch.arange(len(sac))
        has_revision, z_correct, z_lenient = (torch.zeros(n, dtype=torch.bool) for _ in range(3))
        has_revision[sac], z_correct[sac], z_lenient[sac] = (t[picked, shown] for t in (parsable, correct, lenient))
        z_text = [""] * n
        for j, i in enumerate(sac):
            z_text[i] = r_out[j][int(shown[j])].text.strip().split("\n")[0] if has_revision[i] else ""

        # Approver: KEEP or REVISE; a decision that is not REVISE is forced to REVISE with probability `explore`.
        a_prompts_sac, a_out = self._generate(
            "approver", [role_prompt(rows[i], "approver", x_text[i], verdicts[i][1], z_text[i]) for i in sac],
            role_sampling)
        approvals = [parse_decision(c[0].text, APPROVER_ACTIONS)[0] for c in a_out]
        forced = [a != "REVISE" and explore > 0 and self._explore.random() < explore for a in approvals]
        revised = torch.zeros(n, dtype=torch.bool)
        revised[sac] = torch.tensor([a == "REVISE" or f for a, f in zip(approvals, forced)], dtype=torch.bool)
        final_strict = torch.where(revised & has_revision, z_correct, x_correct)
        final_lenient = torch.where(revised & has_revision, z_lenient, x_lenient)
        cases = case_labels(x_correct, challenged, revised, z_correct, has_revision=has_revision)

        # Role batches. Verifier pairs: every parsable x.
        verifier = self._pairs(v_prompts, rows, VERIFIER_ACTIONS, verifier_pair_rewards(x_correct), x_parsable)
        # Approver pairs with the REVISE bonus (on the reward, officially, or on the advantage) and the rarity
        # weight over the challenged decisions, by official case id.
        revise_share = revised[challenged].float().mean().item() if sac else 0.0
        bonus = revise_bonus(revise_share, balance=self.revise_balance, target=self.revise_target)
        a_rewards = approver_pair_rewards(x_correct, z_correct, has_revision, **self.table)
        if self.revise_bonus_on == "reward":
            a_rewards[:, 1] += bonus
        a_keep = challenged & (has_revision | self.train_approver_without_revision)
        approver = self._pairs(dict(zip(sac, a_prompts_sac)), rows, APPROVER_ACTIONS, a_rewards, a_keep)
        weights = torch.ones(n)
        weights[challenged] = rarity_weights(cases[challenged], self.rarity_power, merge_subcases=True)
        if approver is not None:
            approver.reward_parts["weight"] = weights[approver.group_ids]
            if self.revise_bonus_on == "advantage":
                approver.reward_parts["adv_bonus"] = torch.tensor([0.0, bonus]).repeat(len(approver) // 2)
        revision_batch = self._reviser_batch(sac, r_prompts, r_out, x_text, x_correct, z_correct, has_revision,
                                             correct, parsable, shown)
        counts = {
            "unparsable/verifier": sum(d is None for d, _ in verdicts) / max(n, 1),
            "unparsable/approver": sum(a is None for a in approvals) / max(len(sac), 1),
            "unparsable/revision": (1 - parsable.float().mean().item()) if sac else 0.0,
            "truncated/verifier": sum(c[0].finish_reason == "length" for c in v_out) / max(n, 1),
            "revision_groups": float(len(revision_batch.group_ids.unique()) if revision_batch is not None else 0),
            "forced_revise_rate": sum(forced) / max(len(sac), 1),
            "revise_bonus": bonus,
        }
        if sac:
            counts["revision_correct"] = correct.float().mean().item()
            counts["shown_correct"] = z_correct[challenged].float().mean().item()
        return Game(x_correct, challenged, revised, z_correct, has_revision, final_strict, final_lenient, cases,
                    verifier, approver, revision_batch, counts, revisions_paired=self.revision_update == "paired")

    def _reviser_batch(self, sac: list[int], prompts, outs, x_text, x_correct, z_correct, has_revision, correct,
                       parsable, shown) -> RolloutBatch | None:
        """The reviser's batch: (keep text, revise text) pairs (``paired``) or the K revisions (``group``)."""
        codec = self.rollouts.codec
        if self.revision_update == "paired":
            # keep text: x as the reviser would reply it; revise text: the shown revision as sampled. Scored at T 1.
            rewards = reviser_pair_rewards(x_correct, z_correct, has_revision, alpha=self.table["alpha"],
                                           unparsable=self.table["unparsable"])
            keep = [j for j, i in enumerate(sac) if has_revision[i] or not self.skip_unparsable_revisions]
            if not keep:
                return None
            actions = [a for j in keep for a in (codec.reply_ids(x_text[sac[j]]), outs[j][int(shown[j])].token_ids)]
            return action_batch([prompts[j] for j in keep for _ in range(2)], actions,
                                [sac[j] for j in keep for _ in range(2)],
                                rewards[[sac[j] for j in keep]].flatten().tolist(), codec.pad_id)
        # group: every revision S_z or `unparsable` (left out when skip_unparsable_revisions); groups with fewer
        # than 2 revisions or all rewards equal skipped. Scored at the temperature they were sampled at.
        rewards = revision_rewards(correct, parsable, unparsable=self.table["unparsable"])
        member = parsable if self.skip_unparsable_revisions else torch.ones_like(parsable)
        high = torch.where(member, rewards, -torch.inf).amax(1)
        low = torch.where(member, rewards, torch.inf).amin(1)
        groups = ((member.sum(1) >= 2) & (high > low)).nonzero().squeeze(-1).tolist()
        rows = [(g, k) for g in groups for k in range(member.shape[1]) if member[g, k]]
        if not rows:
            return None
        return action_batch([prompts[g] for g, _ in rows], [outs[g][k].token_ids for g, k in rows],
                            [sac[g] for g, _ in rows], [rewards[g, k].item() for g, k in rows], codec.pad_id,
                            logprobs=[outs[g][k].logprobs for g, k in rows], temperature=self.revision_temperature)

    def game_metrics(self, game: Game, stage: str) -> dict[str, float]:
        n = max(len(game.x_correct), 1)
        sac = game.challenged.sum().item()
        logs = {
            f"{stage}/final/strict": game.final_strict.float().mean().item(),
            f"{stage}/final/lenient": game.final_lenient.float().mean().item(),
            f"{stage}/dpa/sac_rate": sac / n,
            f"{stage}/dpa/revise_rate": game.revised[game.challenged].float().mean().item() if sac else 0.0,
            f"{stage}/dpa/verifier_acc": (game.challenged == ~game.x_correct).float().mean().item(),
            **{f"{stage}/dpa/{k}": v for k, v in game.counts.items()},
        }
        return logs | {f"{stage}/dpa/case/{c}": v for c, v in case_shares(game.cases).items()}

    # ------------------------------------------------------------------------------------------------ loss
    def action_loss(self, batch: RolloutBatch | None, pairs: bool, source: str = "",
                    cases: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """The DPA loss of one set of action sequences under the active adapter (0 for an empty set); the
        credited batch is kept in ``credit_trace`` as ``source`` with each row's DPA case."""
        if batch is None:
            return torch.zeros((), device=self.device), {}
        batch = batch.to(self.device)
        credit = (self.credit if pairs else self.group_credit)(batch)
        self.credit_trace.append(CreditTrace(source, batch, credit.advantages, cases))
        ref = self.reference_logprobs(batch)
        logp = self._logprobs(self.policy, batch)[0]
        mask = batch.response_mask
        bonus = batch.reward_parts.get("adv_bonus", torch.zeros(len(batch), device=self.device))
        advantages = credit.advantages + bonus[:, None] * mask
        weight = batch.reward_parts.get("weight", torch.ones(len(batch), device=self.device))
        return self.loss(logp, logp.detach(), advantages, mask * weight[:, None], ref)

    def training_step(self, rows: list[dict[str, Any]], batch_idx: int) -> None:
        start = time.perf_counter()
        data = self.rollouts
        data.bind(self.policy, self.tokenizer)
        self.engine_role("proposer")
        proposals = data.generate_experience(rows)
        game = self.play(proposals, data.sampling, self.revisions, self.explore_revise)
        logs = {**self.rollout_metrics(proposals, "train"), **self.game_metrics(game, "train"),
                **data.backend_counts.take(), "perf/game_s": time.perf_counter() - start}
        data.release()  # the game's generation done: an engine in sleep mode sleeps until the next push

        self.credit_trace = []
        parts = {"verifier": [("verifier", game.verifier, True, self.verifier_weight)],
                 "generator": [("approver", game.approver, True, 1.0),
                               ("revisions", game.revisions, game.revisions_paired, 1.0),
                               ("proposals", proposals, False, self.proposal_weight)]}
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
                total = torch.zeros((), device=self.device)
                for name, batch, pairs, weight in parts[role]:
                    if weight and batch is not None:
                        # rows of the role batches are grouped by decision; proposal i is decision i
                        cases = game.cases if name == "proposals" else game.cases[batch.group_ids.cpu()]
                        loss, metrics = self.action_loss(batch, pairs, name, cases)
                        if self.loss_reduction == "sum":  # official: pair / group means summed over decisions
                            weight = weight * batch.group_ids.unique().numel()
                        total = total + weight * loss
                        logs[f"loss/kl/{name}"] = metrics.get("loss/kl", 0.0)
                if total.requires_grad:
                    self.manual_backward(total)
                logs[f"loss/{role}"] = total.item()
            logs[f"train/grad_norm/{'+'.join(roles)}"] = self._clip(opt)
            opt.step()  # also without gradients, so global_step counts rounds x optimisers
            self.untoggle_optimizer(opt)
        schedulers = self.lr_schedulers()
        for sched in schedulers if isinstance(schedulers, list) else [schedulers] if schedulers else []:
            sched.step()
        self._engine_adapter = None  # new weights: the next generation pushes them to an engine with a copy
        self.use_role("proposer")
        mask = proposals.response_mask
        logs.update({"train/lr": steps[-1][0].param_groups[0]["lr"], "perf/step_s": time.perf_counter() - start,
                     "train/proposal_logprob": masked_mean(proposals.behaviour_logprobs, mask).item()})
        self.log_dict(logs, batch_size=len(rows))
        self.log("final", logs["train/final/strict"], prog_bar=True, logger=False, batch_size=len(rows))

    def validation_step(self, rows: list[dict[str, Any]], batch_idx: int) -> None:
        data = self.rollouts
        data.bind(self.policy, self.tokenizer)
        self.engine_role("proposer")
        proposals = data.generate_experience(rows, data.val_sampling)
        game = self.play(proposals, data.val_sampling, revisions=1, explore=0.0)
        self.use_role("proposer")
        logs = {**self.rollout_metrics(proposals, "val"), **self.game_metrics(game, "val")}
        for key in ("val/zero_variance_groups", "val/dpa/revise_bonus"):  # no update at validation
            logs.pop(key)
        self.log_dict(logs, batch_size=len(rows))
        self.log("val_final", logs["val/final/strict"], prog_bar=True, logger=False, batch_size=len(rows))


__all__ = ["CASES", "DPAGRPOModule", "Game", "action_batch"]
