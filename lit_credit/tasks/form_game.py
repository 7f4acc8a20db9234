"""DPA-GRPO's game on a Form 1040 line (task ``form``): a :class:`~lit_credit.interfaces.Game` the module drives.

The game is text-level and holds no model: an :class:`~lit_credit.interfaces.Actor` samples each role's replies
(the module's actor switches that role's LoRA adapter in), the game parses them, scores them with the form
oracle (gold at training time, as any outcome reward), assigns the role rewards and the DPA cases, and returns
a :class:`FormGameRecord` (a :class:`~lit_credit.types.GameRecord`) with each role's action sequences to train on
(:class:`~lit_credit.types.RoleActions`). The rollout layer tokenises them into RolloutBatches
(:func:`lit_credit.rollout.roles.role_batch`). A scripted actor plays it without a Trainer
(tests/tasks/test_form_game.py).

The game, per line decision, as the official code (stevenyu97/Generator_Verifier_Multi_Agent, ``dpa_grpo/``)
plays it; every choice is a key of :class:`FormGame` (``game.<key>``), the official one the default:

1. proposal ``x``: the step's scored rollouts (``data.sampling.n`` per line at the sampling temperature, the
   form oracle's ``strict`` / ``lenient`` / ``parsable`` parts). The official game samples one proposal per line;
   here every proposal of the group plays its own game (the same game, n times per line).
2. verifier NS / SAC at the sampling temperature; a reply that is not a decision counts as
   ``unparsable_verdict`` (official: SAC, with an empty challenge).
3. on SAC, ``revisions`` (K) revisions at ``revision_temperature``; the one shown is chosen by
   ``shown_revision`` (:func:`~lit_credit.rewards.dpa.shown_revision`; official ``gold_first``: the first that
   matches gold, else the first parsable, **the oracle choosing the approver's input at training time**;
   validation draws one revision, so no choice there).
4. approver KEEP / REVISE (unparsable: KEEP); then, in training only, a decision that is not REVISE is forced to
   REVISE with probability ``explore_revise`` (official 0.4), one draw of the game's own ``random.Random(seed)``
   per such decision. Forced decisions count as REVISE everywhere (final value, case, REVISE share).
5. final value: z on REVISE with a parsable z, else x.

Role rewards (:mod:`lit_credit.rewards.dpa`):

* verifier pair (SAC, NS): ``r(SAC) = 1[x wrong], r(NS) = 1[x right]``, for every parsable x;
* approver pair (KEEP, REVISE) from the approver table (``alpha``, ``cave``, ``miss``, ``unparsable``) on every
  challenged decision (``train_approver_without_revision=false``: not where the shown revision is unparsable),
  plus the REVISE bonus ``b = revise_balance * max(revise_target - REVISE share, 0)`` on the REVISE reward
  (``revise_bonus_on=reward``, official) or as a per-row ``adv_bonus`` (``advantage``), the share over the
  step's challenged decisions counting forced REVISEs (``revise_share=all``, official) or only the approver's
  own (``unforced``, :func:`~lit_credit.rewards.dpa.revise_share`); per-row loss ``weight``
  ``(mean case count / case count)^rarity_power`` over the challenged decisions by official case id;
* the reviser, ``revision_update=paired`` (official): the pair (keep text = x, revise text = the shown z) under
  the reviser's prompt, :func:`~lit_credit.rewards.dpa.reviser_pair_rewards`; ``group``: the K revisions as a
  GRPO group, ``S_z`` or ``unparsable`` each, groups whose rewards are all equal skipped.
  ``skip_unparsable_revisions`` (official true): paired, no pair where z is unparsable; group, unparsable
  revisions left out of the group.

Log-prob temperatures: the canonical verifier / approver actions and the reviser's pair are scored, not sampled,
at T = 1 (as the official code scores every sequence); group revisions at ``revision_temperature``, the
temperature they were sampled at.
"""
from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

import torch
from torch import Tensor

from lit_credit.interfaces import Actor
from lit_credit.rewards.dpa import (
    APPROVER_ACTIONS,
    SHOWN_REVISION_RULES,
    VERIFIER_ACTIONS,
    DPASettings,
    case_labels,
    case_shares,
    rarity_weights,
    revise_share,
    reviser_pair_rewards,
    revision_rewards,
    shown_revision,
    verifier_pair_rewards,
)
from lit_credit.rewards.form_line import line_correct, parse_value
from lit_credit.tasks.form import ROLES, action_text, parse_decision, role_prompt
from lit_credit.types import Action, Completion, GameRecord, RoleActions, RolloutBatch, SamplingParams

# Which of DPA-GRPO's two LoRA adapters plays each role (game.role_adapters): the generator proposes, revises and
# approves; the verifier challenges.
ROLE_ADAPTERS = {"proposer": "generator", "verifier": "verifier", "reviser": "generator", "approver": "generator"}


def decision_action(line: str, decision: str) -> Action:
    """The canonical action of a verifier / approver decision (:func:`~lit_credit.tasks.form.action_text`): NS,
    KEEP, REVISE end the reply; SAC goes on with the challenge, so its action is the decision line alone."""
    return Action(action_text(line, decision), ends_turn=decision != "SAC")


@dataclass
class FormGameRecord(GameRecord):
    """One round of the game over N line decisions (one per proposal): the record every game returns (each role's
    action sequences, ``actions``: ``verifier``, ``approver``, ``revisions``, None where a role has none this
    round; the [N] long DPA ``cases``, into :data:`~lit_credit.rewards.dpa.CASES`), then [N] bool flags and the
    round's counts. The progress bar shows ``final/strict``."""

    headline = "final/strict"
    x_correct: Tensor
    challenged: Tensor
    revised: Tensor
    z_correct: Tensor
    has_revision: Tensor
    final_strict: Tensor
    final_lenient: Tensor
    counts: dict[str, float]

    def metrics(self, stage: str) -> dict[str, float]:
        """Under ``<stage>/``: ``final/strict``, ``final/lenient`` (line accuracy of the submitted values),
        ``dpa/sac_rate``, ``dpa/revise_rate`` (over the challenged), ``dpa/verifier_acc`` (SAC exactly when x is
        wrong), the counts (``dpa/unparsable/*``, ``dpa/truncated/verifier``, ``dpa/revision_groups``,
        ``dpa/forced_revise_rate``, ``dpa/unforced_revise_rate``, ``dpa/revise_share`` (the one the bonus read),
        ``dpa/revise_bonus`` (training only: no update at validation), ``dpa/revision_correct``,
        ``dpa/shown_correct``) and
        ``dpa/case/<c>`` for the taxonomy 1 2 3 4 5a 5b 6a 6b."""
        n = max(len(self.x_correct), 1)
        sac = self.challenged.sum().item()
        logs = {
            f"{stage}/final/strict": self.final_strict.float().mean().item(),
            f"{stage}/final/lenient": self.final_lenient.float().mean().item(),
            f"{stage}/dpa/sac_rate": sac / n,
            f"{stage}/dpa/revise_rate": self.revised[self.challenged].float().mean().item() if sac else 0.0,
            f"{stage}/dpa/verifier_acc": (self.challenged == ~self.x_correct).float().mean().item(),
            **{f"{stage}/dpa/{k}": v for k, v in self.counts.items()},
        }
        return logs | {f"{stage}/dpa/case/{c}": v for c, v in case_shares(self.cases).items()}


@dataclass(kw_only=True)
class FormGame(DPASettings):
    """The DPA game of the form task (see the module docstring for the rules and the keys): DPA's role-reward
    settings (:class:`~lit_credit.rewards.dpa.DPASettings`, the table, the shaping, the exploration) and the form
    game's own rules below, every field a key ``game.<field>`` (conf/game/form.yaml, held to these fields by a
    test).

    ``play(proposals, actor, sampling, training)`` calls the actor once per role in the order verifier, reviser,
    approver (also with no prompt, so a module that switches adapters per call switches them every round alike),
    the roles' sampling being ``sampling`` with ``n=1``, ``max_new_tokens=role_max_new_tokens`` and no stop
    strings (the reviser's: ``n=revisions``, ``revision_temperature``). ``training=False`` (validation): one
    revision, no forced REVISE. The exploration draws come from ``self._explore`` (``random.Random(seed)``),
    which the module's checkpoints save. ``role_adapters``: which of DPA-GRPO's adapters plays each of ``roles``
    (None: :data:`ROLE_ADAPTERS`).
    """

    roles: ClassVar[tuple[str, ...]] = ROLES

    revisions: int = 5
    revision_temperature: float = 0.7
    role_max_new_tokens: int = 64
    shown_revision: str = "gold_first"
    unparsable_verdict: str = "SAC"
    revision_update: str = "paired"
    skip_unparsable_revisions: bool = True
    train_approver_without_revision: bool = True
    seed: int = 0
    role_adapters: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.revisions < 1:
            raise ValueError(f"game.revisions={self.revisions}: must be >= 1")
        self.check_choices({"shown_revision": SHOWN_REVISION_RULES, "unparsable_verdict": VERIFIER_ACTIONS,
                            "revision_update": ("paired", "group")})
        self.role_adapters = dict(self.role_adapters if self.role_adapters is not None else ROLE_ADAPTERS)
        self._explore = random.Random(self.seed)

    def play(self, proposals: RolloutBatch, actor: Actor, sampling: SamplingParams,
             training: bool = True) -> GameRecord:
        """The rest of the game for every proposal of ``proposals`` (a scored batch of the form task: its
        metadata ``row`` / ``replies`` and the oracle's ``strict``, ``lenient``, ``parsable`` parts), as a
        :class:`FormGameRecord` (annotated as the protocol's :class:`~lit_credit.types.GameRecord`, which the
        LightningCLI's protocol check requires to match exactly)."""
        missing = {"strict", "lenient", "parsable"} - proposals.reward_parts.keys()
        if missing:
            raise ValueError(f"the form game reads the form oracle's reward parts, and the proposals lack "
                             f"{sorted(missing)}: use task=form with reward=form_line (experiment=dpa_form)")
        revisions = self.revisions if training else 1
        explore = self.explore_revise if training else 0.0
        rows = [m["row"] for m in proposals.metadata]
        x_text = [m["replies"][-1].strip().split("\n")[0] for m in proposals.metadata]
        x_correct = proposals.reward_parts["strict"].bool().cpu()
        x_lenient = proposals.reward_parts["lenient"].bool().cpu()
        x_parsable = proposals.reward_parts["parsable"].bool().cpu()
        n = len(rows)
        role_sampling = replace(sampling, n=1, max_new_tokens=self.role_max_new_tokens, stop=())

        # Verifier: NS or SAC with a challenge; a reply that is not a decision counts as `unparsable_verdict`.
        v_prompts, v_out = actor("verifier", [role_prompt(r, "verifier", x) for r, x in zip(rows, x_text)],
                                 role_sampling)
        verdicts = [parse_decision(c[0].text, VERIFIER_ACTIONS) for c in v_out]
        challenged = torch.tensor([(d or self.unparsable_verdict) == "SAC" for d, _ in verdicts], dtype=torch.bool)
        sac = challenged.nonzero().squeeze(-1).tolist()

        # Revisions (K per challenged decision), one shown (`shown_revision`; gold_first reads the oracle).
        r_prompts, r_out = actor(
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
        a_prompts, a_out = actor(
            "approver", [role_prompt(rows[i], "approver", x_text[i], verdicts[i][1], z_text[i]) for i in sac],
            role_sampling)
        approvals = [parse_decision(c[0].text, APPROVER_ACTIONS)[0] for c in a_out]
        forced = [a != "REVISE" and explore > 0 and self._explore.random() < explore for a in approvals]
        revised = torch.zeros(n, dtype=torch.bool)
        revised[sac] = torch.tensor([a == "REVISE" or f for a, f in zip(approvals, forced)], dtype=torch.bool)
        final_strict = torch.where(revised & has_revision, z_correct, x_correct)
        final_lenient = torch.where(revised & has_revision, z_lenient, x_lenient)
        cases = case_labels(x_correct, challenged, revised, z_correct, has_revision=has_revision)

        # Verifier pairs: every parsable x.
        verifier = self._pairs("verifier", v_prompts, rows, VERIFIER_ACTIONS, verifier_pair_rewards(x_correct),
                               x_parsable)
        # Approver pairs with the REVISE bonus (on the reward, officially, or on the advantage) and the rarity
        # weight over the challenged decisions, by official case id.
        own = [a == "REVISE" for a in approvals]
        share = revise_share(own, forced, self.revise_share)
        bonus = self.bonus(share)
        a_rewards = self.approver_rewards(x_correct, z_correct, has_revision)
        if self.revise_bonus_on == "reward":
            a_rewards[:, 1] += bonus
        a_keep = challenged & (has_revision | self.train_approver_without_revision)
        approver = self._pairs("approver", dict(zip(sac, a_prompts)), rows, APPROVER_ACTIONS, a_rewards, a_keep)
        weights = torch.ones(n)
        weights[challenged] = rarity_weights(cases[challenged], self.rarity_power, merge_subcases=True)
        if approver is not None:
            approver.weight = weights[torch.tensor(approver.groups, dtype=torch.long)]
            if self.revise_bonus_on == "advantage":
                approver.adv_bonus = torch.tensor([0.0, bonus]).repeat(len(approver) // 2)
        revisions_set = self._reviser_actions(sac, r_prompts, r_out, x_text, x_correct, z_correct, has_revision,
                                              correct, parsable, shown)
        counts = {
            "unparsable/verifier": sum(d is None for d, _ in verdicts) / max(n, 1),
            "unparsable/approver": sum(a is None for a in approvals) / max(len(sac), 1),
            "unparsable/revision": (1 - parsable.float().mean().item()) if sac else 0.0,
            "truncated/verifier": sum(c[0].finish_reason == "length" for c in v_out) / max(n, 1),
            "revision_groups": float(len(set(revisions_set.groups)) if revisions_set is not None else 0),
            "forced_revise_rate": sum(forced) / max(len(sac), 1),
            "unforced_revise_rate": sum(own) / max(len(sac), 1),
            "revise_share": share,
        }
        if training:  # the bonus shapes an update; validation has none
            counts["revise_bonus"] = bonus
        if sac:
            counts["revision_correct"] = correct.float().mean().item()
            counts["shown_correct"] = z_correct[challenged].float().mean().item()
        return FormGameRecord(
            actions={"verifier": verifier, "approver": approver, "revisions": revisions_set}, cases=cases,
            x_correct=x_correct, challenged=challenged, revised=revised, z_correct=z_correct,
            has_revision=has_revision, final_strict=final_strict, final_lenient=final_lenient, counts=counts)

    @staticmethod
    def _pairs(role: str, prompts: Sequence[list[int]] | dict[int, list[int]], rows, choices: tuple[str, ...],
               rewards: Tensor, keep: Tensor) -> RoleActions | None:
        """Both canonical actions (``choices``) of each decision ``keep`` marks, under its prompt (``prompts[i]``
        of decision i): rows 2n, 2n+1, group = the decision, rewards ``rewards[i]`` ([N, 2])."""
        index = keep.nonzero().squeeze(-1).tolist()
        if not index:
            return None
        return RoleActions(role, [prompts[i] for i in index for _ in choices],
                           [decision_action(rows[i]["line"], c) for i in index for c in choices],
                           [i for i in index for _ in choices], rewards[index].flatten(), paired=True)

    def _reviser_actions(self, sac: list[int], prompts: list[list[int]], outs: list[list[Completion]],
                         x_text: list[str], x_correct: Tensor, z_correct: Tensor, has_revision: Tensor,
                         correct: Tensor, parsable: Tensor, shown: Tensor) -> RoleActions | None:
        """The reviser's action sequences: (keep text, revise text) pairs (``paired``) or the K revisions
        (``group``)."""
        if self.revision_update == "paired":
            # keep text: x as the reviser would reply it; revise text: the shown revision as sampled. Scored at T 1.
            rewards = reviser_pair_rewards(x_correct, z_correct, has_revision, alpha=self.alpha,
                                           unparsable=self.unparsable)
            keep = [j for j, i in enumerate(sac) if has_revision[i] or not self.skip_unparsable_revisions]
            if not keep:
                return None
            actions = [a for j in keep for a in (Action(x_text[sac[j]]), outs[j][int(shown[j])])]
            return RoleActions("reviser", [prompts[j] for j in keep for _ in range(2)], actions,
                               [sac[j] for j in keep for _ in range(2)], rewards[[sac[j] for j in keep]].flatten(),
                               paired=True)
        # group: every revision S_z or `unparsable` (left out when skip_unparsable_revisions); groups with fewer
        # than 2 revisions or all rewards equal skipped. Scored at the temperature they were sampled at.
        rewards = revision_rewards(correct, parsable, unparsable=self.unparsable)
        member = parsable if self.skip_unparsable_revisions else torch.ones_like(parsable)
        high = torch.where(member, rewards, -torch.inf).amax(1)
        low = torch.where(member, rewards, torch.inf).amin(1)
        groups = ((member.sum(1) >= 2) & (high > low)).nonzero().squeeze(-1).tolist()
        rows = [(g, k) for g in groups for k in range(member.shape[1]) if member[g, k]]
        if not rows:
            return None
        return RoleActions("reviser", [prompts[g] for g, _ in rows], [outs[g][k] for g, k in rows],
                           [sac[g] for g, _ in rows], torch.tensor([rewards[g, k].item() for g, k in rows]),
                           paired=False, temperature=self.revision_temperature, sampled=True)


__all__ = ["ROLE_ADAPTERS", "FormGame", "FormGameRecord", "decision_action"]
