"""Closed-loop credit learning: does better credit make learning faster where credit is the bottleneck?

    .venv/bin/python -m benchmarks.credit_learning [--size tiny|full] [--seed 0]
        [--out benchmarks/results/credit_learning.json] [--plot docs/experiments/credit_learning.png]

The open-loop benchmark (:mod:`benchmarks.credit_quality`) asks whether an estimator's credit tracks
the truth on fixed batches. This one closes the loop: a policy samples rollouts, a registered credit estimator
assigns advantages, :class:`~lit_credit.losses.PolicyLoss` turns them into a gradient, AdamW steps, the policy
samples again. The policy is a **table of logits per decision point** (no language model), so hundreds of seeds
train in seconds; the seeds are a leading dimension of every tensor (one batch, one estimator call, one loss per
update for all seeds at once).

Policy. ``theta [S, P, A]`` (S seeds, P decision points, A actions; invalid actions of a point masked to
``-inf``), ``pi_s(a | p) = softmax(theta[s, p])``, initialised uniform (``theta = 0``). The log-prob of a
token is a gather from ``log_softmax(theta)``; the reference policy (KL term) is the initial table. Sampling is
by inverse CDF of uniforms drawn from a generator seeded by ``(seed, step)``: every method of a cell sees the same
contexts and the same uniforms (sampling, measurement noise, exploration), so seeds are paired across methods
(common random numbers: two policies that agree sample the same rollouts).

Rollouts are :class:`~lit_credit.types.RolloutBatch` es laid out as the rollout layer lays them out (one token
per action): a prompt token (mask 0), each policy action one token (mask 1, its turn id), environment tokens
between turns (mask 0, turn id -1), the summary as the last learnable run; one group id per (seed, prompt);
behaviour log-probs are the table's. Every estimator runs unchanged from :func:`lit_credit.credit.get` with its
registered defaults (the ``conf/credit`` values); the truth is a latent of the construction (gold tools, the
summary's true quality, the revision state, the proposal's correctness) that no estimator sees: estimators see
only *measurements* (process score, judge, verifier, oracle pairs), each with its own noise knob.

Update (GRPO families): ``minibatches`` updates per rollout batch (the project's ``method.num_minibatches``
4, ``ppo_epochs`` 1), each on a random quarter of every seed's rows; ``PolicyLoss(ClippedSurrogate(0.2),
"token-mean", kl_coef=0.001, "k3")`` (``conf/loss/grpo.yaml``) with old log-probs = the behaviour table;
per-seed gradient clipping at ``max_grad_norm`` 1 (``method.max_grad_norm``); AdamW (weight decay 0). Every seed
has the same number of rows and tokens in every minibatch, so the token mean over all seeds is
``(1/S) sum_s L_s`` and ``S * loss`` back-propagates exactly each seed's own loss (AdamW and the clipping are
per element / per seed): batching seeds changes no seed's update (tested).

Families (``Setting`` dataclasses hold the knobs):

- **tool** (SLCA-GRPO, ToolPO, SLCA x TCPO): C prompts, K tool calls then a summary. Call k picks one of M tools,
  gold ``g[c, k]`` (drawn per seed); the summary picks one of Q actions of true quality ``q_a = a / (Q - 1)``. The
  summary's true quality is ``q_a * f`` with ``f`` the share of right calls (a summary cannot report what a wrong
  call never fetched). Rollout truth ``(w_p f + w_s q_a f) / (w_p + w_s)``; policy truth, exactly from the table,
  ``J = mean_c [pbar_c (w_p + w_s E_pi[q | c])] / (w_p + w_s)``, ``pbar_c = mean_k pi(g[c, k] | c, k)`` (the
  summary point does not see the calls, so ``E[q f] = E[q] E[f]``). Measurements: each call's correctness bit
  flipped with probability ``process_noise`` (``turn_parts["tool_scores"]``; ``process`` and ToolPO's strict
  ``toolpo_correct_ratio`` their mean), the judge's score ``q_a f`` replaced by a uniform draw in [0, 1] with
  probability ``judge_noise`` (``summary``), ``solved = 1[summary >= 0.75]`` (HierR's ``solved_at``); ``score =
  w_p process + w_s summary``, ``reward_weights = {process: w_p, summary: w_s}``.
- **revision** (TCPO, MT-GRPO): C prompts, K turns, all reached (``stop_on_success=false``). The state is the
  answer's true level ``l in {0, 1, 2}`` (score ``l / 2``) and an ``enabled`` flag; the decision point is (prompt,
  turn, state), the actions improve (``l + 1``, at most 2), maintain, regress (``l - 1``, at least 0), enable (sets
  the flag), fix (``l = 2`` once enabled, else nothing). On a *hard* prompt (a share ``hard_share`` of them)
  improve stops at ``l = 1``: only enable then (later) fix reaches 2, and enable shows no gain when it is made.
  Truth ``J = mean_c E_pi[l_K / 2]`` by exact propagation of the state distribution through the K turns.
  Measurement: each turn's score replaced by a uniform draw of {0, 0.5, 1} with probability ``verifier_noise``
  (``turn_scores``); the outcome (``scores``) is the last turn's measured score (``FinalTurnReward``). TCPO's
  counterfactual alternatives (preset ``tcpo``) as ``augment=counterfactual`` makes them: the top 5 turns per
  group by surprisal (:func:`~lit_credit.credit.tcpo.select_counterfactual_turns`), 4 actions resampled from the
  policy at the same state, scored by the same noisy verifier.
- **decision** (DPA-GRPO): C form lines, n proposals each. A proposal picks one of V values; the gold value of
  each instance is drawn fresh, the line's modal value with probability ``modal`` (so no proposer is right more
  often than ``modal``). The verifier sees a feature that says whether x is right with accuracy
  ``verifier_accuracy`` and picks SAC / NS (point: line x feature); on SAC a revision z is shown, right with
  probability ``revision_right``; the approver picks KEEP / REVISE (point: line), then in training a non-REVISE
  is forced to REVISE with probability ``dpa.explore_revise`` (0.4). Submitted value: z on REVISE, else x. Truth: the
  submitted line's accuracy without exploration, exactly,
  ``J = mean_c [P_c (1 - sum_f P(f | right) s_cf r_c (1 - z)) + (1 - P_c) sum_f P(f | wrong) s_cf r_c z]`` with
  ``P_c = sum_v pi(v | c) p_c(v)``, ``s_cf = pi(SAC | c, f)``, ``r_c = pi(REVISE | c)``, ``z`` =
  ``revision_right``; for GRPO on the proposals (no game) ``J = mean_c P_c``. The settings are the form game's (``dpa``: a
  :class:`~lit_credit.rewards.dpa.DPASettings`, a method's ``options['dpa']`` over it); the pair rewards are its
  own (:func:`~lit_credit.rewards.dpa.verifier_pair_rewards`, :func:`~lit_credit.rewards.dpa.approver_pair_rewards`),
  the REVISE bonus ``revise_balance * max(revise_target - share, 0)`` with the share counted ``all`` or ``unforced``
  (:func:`~lit_credit.rewards.dpa.revise_share`, per seed and step), on the REVISE reward or advantage, the
  rarity weights by official case id (:func:`~lit_credit.rewards.dpa.rarity_weights`, per seed and step), the
  DPA loss (``conf/loss/dpa.yaml``: REINFORCE, ``seq-mean-token-sum``, ``beta`` 0.04, k3) with
  ``loss_reduction=sum`` and ``verifier_weight`` 0.5, as :class:`~lit_credit.methods.DPAGRPOModule` computes it.
  The reviser is not learned (z's correctness is the knob). GRPO on the proposals is ``experiment=grpo_form``:
  groups of 2, population std, REINFORCE with k1.

Scores per cell (a method at one knob setting), over seeds: the final truth ``J_T`` and the steps to reach the
family's threshold (the first step t with ``J_t >= threshold``, censored at the budget T: a seed that never
reaches it counts T), each as a mean and, against GRPO, the seed-paired difference with its Student-t 95 %
interval (:func:`~lit_credit.analysis.compare.paired_t`) and the smallest difference the design detects with 80 %
power (:func:`~lit_credit.analysis.compare.detectable_effect`).

Output: the markdown tables on stdout, the JSON report (with the machine) at ``--out``, the dose-response plot at
``--plot``. ``tiny`` runs in seconds (the test suite runs it), ``full`` in about half an hour on one CPU thread.
"""
from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from benchmarks.machine import ground_truth_main
from lit_credit import credit
from lit_credit.analysis.compare import detectable_effect, paired_t
from lit_credit.credit.tcpo import select_counterfactual_turns
from lit_credit.losses import ClippedSurrogate, PolicyLoss, ReinforceSurrogate
from lit_credit.rewards.dpa import CASE_IDS, DPASettings, case_labels, verifier_pair_rewards
from lit_credit.types import RolloutBatch

FAMILIES = ("tool", "revision", "decision")
PAD, REPLY, FEEDBACK, PROMPT = 0, 10, 100, 1000  # synthetic token ids (no estimator reads them)
CF_TOP_L, CF_SAMPLES = 5, 4  # augment=counterfactual's defaults


# ------------------------------------------------------------------------------------------------ policy
class TablePolicy(torch.nn.Module):
    """A table of logits per decision point for S seeds at once: ``theta [S, P, A]``, ``valid [P, A]`` the actions
    each point has, ``roles [P]`` the optimiser role of each point (its own gradient clipping, as DPA-GRPO's
    separate adapters). ``reference`` is the initial (uniform) log-prob table, the KL term's frozen policy."""

    def __init__(self, seeds: int, valid: Tensor, roles: Tensor | None = None) -> None:
        super().__init__()
        self.theta = torch.nn.Parameter(torch.zeros(seeds, *valid.shape))
        self.register_buffer("valid", valid.bool())
        self.register_buffer("roles", torch.zeros(valid.shape[0], dtype=torch.long) if roles is None else roles)
        self.register_buffer("n_valid", valid.sum(1))
        self.reference = self.log_probs().detach()

    def log_probs(self) -> Tensor:
        """``log_softmax(theta)`` over each point's valid actions (``-inf`` elsewhere). [S, P, A]."""
        return self.theta.masked_fill(~self.valid, -math.inf).log_softmax(-1)

    def probs(self) -> Tensor:
        return self.log_probs().detach().exp()

    @staticmethod
    def token_logp(table: Tensor, seed: Tensor, points: Tensor, actions: Tensor) -> Tensor:
        """``table[seed_i, points_it, actions_it]`` on tokens with a point (``points >= 0``), 0 elsewhere: one
        gather. seed [B], points / actions [B, T] long. Output [B, T]."""
        _, n_points, n_actions = table.shape
        on = points >= 0
        index = (seed[:, None] * n_points + points.clamp_min(0)) * n_actions + actions.clamp_min(0)
        return torch.where(on, table.reshape(-1)[index], 0.0)

    def sample(self, points: Tensor, u: Tensor, probs: Tensor | None = None) -> Tensor:
        """Actions at ``points [S, N]`` by inverse CDF of the uniforms ``u [S, N]``: ``a = #{a': F(a') <= u}``,
        ``F`` the cumulative ``pi(. | point)``, clamped to the point's last valid action. [S, N] long."""
        probs = self.probs() if probs is None else probs
        p = probs.gather(1, points[..., None].expand(-1, -1, probs.shape[-1]))
        cdf = p.double().cumsum(-1)
        a = (u[..., None].double() >= cdf).sum(-1)
        return torch.minimum(a, self.n_valid[points] - 1)

    def clip_(self, max_norm: float) -> None:
        """``torch.nn.utils.clip_grad_norm_`` per seed and role: ``g *= min(1, max_norm / (||g_{s, role}|| + 1e-6))``."""
        g = self.theta.grad
        sq = g.pow(2).sum(-1)
        n_roles = int(self.roles.max()) + 1
        norms = sq.new_zeros(len(sq), n_roles).index_add_(1, self.roles, sq).sqrt()
        coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
        g.mul_(coef[:, self.roles][..., None])


def grpo_loss() -> PolicyLoss:
    """``conf/loss/grpo.yaml``: PPO clip 0.2, token mean, k3 KL 0.001."""
    return PolicyLoss(ClippedSurrogate(0.2), "token-mean", kl_coef=0.001, kl_estimator="k3")


def dpa_loss() -> PolicyLoss:
    """``conf/loss/dpa.yaml``: REINFORCE, sequence-summed log-probs, mean over sequences, k3 KL 0.04."""
    return PolicyLoss(ReinforceSurrogate(), "seq-mean-token-sum", kl_coef=0.04, kl_estimator="k3")


def reinforce_loss() -> PolicyLoss:
    """``conf/loss/reinforce.yaml`` (``experiment=grpo_form``): REINFORCE, k1 KL 0.04."""
    return PolicyLoss(ReinforceSurrogate(), "seq-mean-token-sum", kl_coef=0.04, kl_estimator="k1")


@dataclass
class LossSet:
    """One credited set of action sequences: the batch, each row's seed, the decision point and action of each
    token, the advantages and the loss mask (row weights folded in), the loss, its scale (``S`` for a mean over
    seeds with equal rows, the number of decisions for DPA's ``loss_reduction=sum``) and ``rows`` per seed
    (``None``: rows vary by seed, one update)."""

    batch: RolloutBatch
    seed: Tensor
    points: Tensor
    actions: Tensor
    advantages: Tensor
    mask: Tensor
    loss: PolicyLoss
    scale: float
    rows: int | None = None


# ------------------------------------------------------------------------------------------------ methods
@dataclass(frozen=True)
class Method:
    """A method of a family: a display ``name``, the registered ``estimator`` and its keyword arguments, and the
    family's options (decision family: ``game``, False for GRPO on the proposals alone; ``proposal_weight``, the
    proposals' group in DPA's loss; ``dpa``, :class:`~lit_credit.rewards.dpa.DPASettings` fields over the
    setting's)."""

    name: str
    estimator: str
    kwargs: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)

    def make(self) -> credit.CreditEstimator:
        return credit.get(self.estimator)(**self.kwargs)


TOOL_METHODS = (Method("grpo", "grpo"), Method("rloo", "rloo"), Method("dr_grpo", "dr_grpo"),
                Method("slca", "slca"), Method("toolpo", "toolpo"), Method("toolpo_process", "toolpo_process"),
                Method("slca_tcpo", "slca_tcpo"))
REVISION_METHODS = (Method("grpo", "grpo"), Method("mt_grpo", "mt_grpo"),
                    *[Method(f"tcpo[{p}]", "tcpo", {"preset": p})
                      for p in ("trajectory", "turn", "diff", "retro", "retro_hindsight")],
                    Method("tcpo", "tcpo"))
DECISION_METHODS = (Method("grpo", "grpo", {"unbiased": False, "eps": 1e-8}, {"game": False}),
                    Method("dpa", "dpa"),
                    Method("dpa[unforced]", "dpa", {}, {"dpa": {"revise_share": "unforced"}}),
                    Method("dpa[adv]", "dpa", {}, {"dpa": {"revise_bonus_on": "advantage"}}),
                    Method("dpa[adv,unforced]", "dpa", {},
                           {"dpa": {"revise_share": "unforced", "revise_bonus_on": "advantage"}}),
                    Method("dpa+proposals", "dpa", {}, {"proposal_weight": 1.0}))
METHODS = {"tool": TOOL_METHODS, "revision": REVISION_METHODS, "decision": DECISION_METHODS}


# ------------------------------------------------------------------------------------------------ settings
@dataclass(frozen=True)
class Train:
    """The loop: ``steps`` rollout batches, AdamW ``lr``, ``minibatches`` updates per batch (GRPO families),
    ``max_grad_norm``, the truth ``threshold`` of steps-to-threshold."""

    steps: int = 150
    lr: float = 0.05
    minibatches: int = 4
    max_grad_norm: float = 1.0
    threshold: float = 0.75


@dataclass(frozen=True)
class ToolSetting:
    contexts: int = 4
    calls: int = 3
    tools: int = 4
    summaries: int = 4
    n: int = 8
    judge_noise: float = 0.5
    process_noise: float = 0.1
    w_process: float = 1.0
    w_summary: float = 1.0
    solved_at: float = 0.75


@dataclass(frozen=True)
class RevisionSetting:
    contexts: int = 4
    turns: int = 3
    n: int = 8
    verifier_noise: float = 0.2
    hard_share: float = 0.5


@dataclass(frozen=True)
class DecisionSetting:
    contexts: int = 8
    n: int = 2
    values: int = 4
    modal: float = 0.6
    verifier_accuracy: float = 0.8
    revision_right: float = 0.6
    dpa: DPASettings = field(default_factory=DPASettings)  # the form game's; read, never mutated (copies share it)
    verifier_weight: float = 0.5


def _gen(seed: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(1_000_003 * seed + 7919 * step + 17)


def _rand(gen: torch.Generator, *shape: int) -> Tensor:
    return torch.rand(shape, generator=gen, dtype=torch.float64)


# ------------------------------------------------------------------------------------------------ (a) tool
class ToolFamily:
    """Family ``tool`` (module docstring). Points ``c * (K + 1) + k`` (call k) and ``c * (K + 1) + K`` (summary);
    A = max(M, Q)."""

    name = "tool"

    def __init__(self, setting: ToolSetting, seeds: int, seed: int) -> None:
        s = self.s = setting
        self.S, self.C, self.K = seeds, s.contexts, s.calls
        self.A = max(s.tools, s.summaries)
        valid = torch.zeros(self.C, self.K + 1, self.A, dtype=torch.bool)
        valid[:, : self.K, : s.tools] = True
        valid[:, self.K, : s.summaries] = True
        self.valid = valid.reshape(-1, self.A)
        self.gold = torch.randint(s.tools, (seeds, self.C, self.K), generator=_gen(seed, -1))
        self.q = torch.linspace(0, 1, s.summaries, dtype=torch.float64)

    def policy(self) -> TablePolicy:
        return TablePolicy(self.S, self.valid)

    def truth(self, probs: Tensor) -> Tensor:
        """``J [S]`` exactly from the table (module docstring)."""
        s = self.s
        p = probs.double().view(self.S, self.C, self.K + 1, self.A)
        right = p[:, :, : self.K].gather(-1, self.gold[..., None]).squeeze(-1).mean(-1)
        eq = (p[:, :, self.K, : s.summaries] * self.q).sum(-1)
        return (right * (s.w_process + s.w_summary * eq)).mean(-1) / (s.w_process + s.w_summary)

    def rollouts(self, policy: TablePolicy, gen: torch.Generator) -> dict[str, Any]:
        """One step's rollouts of every seed: the batch and the tokens' points and actions (seed-major rows)."""
        s, S, C, K = self.s, self.S, self.C, self.K
        R = C * s.n
        ctx = torch.arange(R) // s.n
        points = (ctx[:, None] * (K + 1) + torch.arange(K + 1)).expand(S, R, K + 1)
        u, flip_u, judge_u, judge_draw = _rand(gen, S, R, K + 1), _rand(gen, S, R, K), _rand(gen, S, R), _rand(gen, S, R)
        acts = policy.sample(points.reshape(S, -1), u.reshape(S, -1)).view(S, R, K + 1)
        correct = acts[..., :K] == self.gold[:, ctx]
        frac = correct.double().mean(-1)
        true_summary = self.q[acts[..., K].clamp_max(s.summaries - 1)] * frac
        bits = (correct ^ (flip_u < s.process_noise)).double()
        process = bits.mean(-1)
        judge = torch.where(judge_u < s.judge_noise, judge_draw, true_summary)
        score = s.w_process * process + s.w_summary * judge
        T = 2 * K + 2
        pos = torch.cat([1 + 2 * torch.arange(K), torch.tensor([T - 1])])
        tok_points = torch.full((S, R, T), -1, dtype=torch.long)
        tok_actions = torch.full((S, R, T), -1, dtype=torch.long)
        tok_points[..., pos], tok_actions[..., pos] = points, acts
        turn_ids = torch.full((S, R, T), -1, dtype=torch.long)
        turn_ids[..., pos] = torch.arange(K + 1)
        input_ids = torch.full((S, R, T), PAD, dtype=torch.long)
        input_ids[..., 0] = PROMPT + ctx
        input_ids[..., pos] = REPLY + acts
        input_ids[..., 2 + 2 * torch.arange(K)] = FEEDBACK + correct.long()
        seed_row = torch.arange(S)[:, None].expand(S, R).reshape(-1)
        B = S * R
        flat = {"points": tok_points.reshape(B, T), "actions": tok_actions.reshape(B, T)}
        behaviour = policy.token_logp(policy.log_probs().detach(), seed_row, flat["points"], flat["actions"])
        f32 = torch.float32
        zero = torch.zeros(S, R, 1, dtype=torch.float64)
        batch = RolloutBatch(
            input_ids=input_ids.reshape(B, T), attention_mask=torch.ones(B, T, dtype=torch.long),
            response_mask=(flat["points"] >= 0).float(), turn_ids=turn_ids.reshape(B, T),
            group_ids=(torch.arange(S)[:, None] * C + ctx).reshape(-1), behaviour_logprobs=behaviour,
            scores=score.reshape(B).to(f32),
            reward_parts={"process": process.reshape(B).to(f32), "summary": judge.reshape(B).to(f32),
                          "score": score.reshape(B).to(f32), "solved": (judge >= s.solved_at).reshape(B).to(f32),
                          "toolpo_correct_ratio": process.reshape(B).to(f32)},
            turn_parts={"tool_scores": torch.cat([bits, zero], -1).reshape(B, K + 1).to(f32),
                        "tool_turn_mask": torch.cat([torch.ones_like(bits), zero], -1).reshape(B, K + 1).to(f32)},
            reward_weights={"process": s.w_process, "summary": s.w_summary},
            turn_scores=torch.cat([bits, judge[..., None]], -1).reshape(B, K + 1).to(f32),
            turn_mask=torch.ones(B, K + 1, dtype=torch.bool))
        truth = (s.w_process * frac + s.w_summary * true_summary) / (s.w_process + s.w_summary)
        return {"batch": batch, "seed": seed_row, **flat, "rows": R, "truth": truth.reshape(B)}

    def sets(self, policy: TablePolicy, gen: torch.Generator, method: Method, estimator) -> list[LossSet]:
        r = self.rollouts(policy, gen)
        adv = estimator(r["batch"]).advantages
        return [LossSet(r["batch"], r["seed"], r["points"], r["actions"], adv, r["batch"].response_mask,
                        grpo_loss(), float(self.S), r["rows"])]

    def knobs(self) -> dict[str, Any]:
        return asdict(self.s)


# ------------------------------------------------------------------------------------------------ (b) revision
IMPROVE, MAINTAIN, REGRESS, ENABLE, FIX = range(5)
REVISION_ACTIONS = ("improve", "maintain", "regress", "enable", "fix")
N_STATES = 6  # level (0, 1, 2) x enabled (0, 1): state = 2 * level + enabled


def revision_transitions() -> Tensor:
    """``next[hard, state, action]`` (state = 2 level + enabled): improve ``l + 1`` (at most 2; on a hard prompt
    at most 1), maintain, regress ``l - 1`` (at least 0), enable (flag on), fix (``l = 2`` once enabled)."""
    level = torch.arange(N_STATES) // 2
    enabled = torch.arange(N_STATES) % 2
    out = torch.empty(2, N_STATES, 5, dtype=torch.long)
    for hard in (0, 1):
        cap = 1 if hard else 2
        up = torch.where(level < cap, level + 1, level)
        out[hard, :, IMPROVE] = 2 * up + enabled
        out[hard, :, MAINTAIN] = 2 * level + enabled
        out[hard, :, REGRESS] = 2 * (level - 1).clamp_min(0) + enabled
        out[hard, :, ENABLE] = 2 * level + 1
        out[hard, :, FIX] = torch.where(enabled.bool(), 2 * 2 + enabled, 2 * level + enabled)
    return out


class RevisionFamily:
    """Family ``revision`` (module docstring). Points ``(c * K + k) * 6 + state``; A = 5."""

    name = "revision"
    LEVELS = torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64)

    def __init__(self, setting: RevisionSetting, seeds: int, seed: int) -> None:
        s = self.s = setting
        self.S, self.C, self.K = seeds, s.contexts, s.turns
        self.next = revision_transitions()
        self.hard = (torch.arange(self.C) < round(s.hard_share * self.C)).long()  # [C], the same for every seed
        self.valid = torch.ones(self.C * self.K * N_STATES, 5, dtype=torch.bool)

    def policy(self) -> TablePolicy:
        return TablePolicy(self.S, self.valid)

    def truth(self, probs: Tensor) -> Tensor:
        """``J [S] = mean_c E[l_K / 2]``: the state distribution ``d [S, C, 6]`` from (0, off) pushed through the K
        turns, ``d'[y] = sum_{x, a} d[x] pi(a | c, k, x) 1[next(x, a) = y]``."""
        p = probs.double().view(self.S, self.C, self.K, N_STATES, 5)
        move = torch.nn.functional.one_hot(self.next[self.hard], N_STATES).double()  # [C, 6, 5, 6]
        d = torch.zeros(self.S, self.C, N_STATES, dtype=torch.float64)
        d[..., 0] = 1
        for k in range(self.K):  # K turns, vectorised over seeds and prompts
            d = torch.einsum("scx,scxa,cxay->scy", d, p[:, :, k], move)
        return (d * self.LEVELS[torch.arange(N_STATES) // 2]).sum(-1).mean(-1)

    def rollouts(self, policy: TablePolicy, gen: torch.Generator) -> dict[str, Any]:
        s, S, C, K = self.s, self.S, self.C, self.K
        R = C * s.n
        ctx = torch.arange(R) // s.n
        u, noise_u = _rand(gen, S, R, K), _rand(gen, S, R, K)
        noise_draw = torch.randint(3, (S, R, K), generator=gen)
        cf_u, cf_noise_u = _rand(gen, S, R, K, CF_SAMPLES), _rand(gen, S, R, K, CF_SAMPLES)
        cf_draw = torch.randint(3, (S, R, K, CF_SAMPLES), generator=gen)
        probs = policy.probs()
        state = torch.zeros(S, R, dtype=torch.long)
        hard = self.hard[ctx].expand(S, R)
        points, acts, after = [], [], []
        for k in range(K):  # K turns, vectorised over seeds and rollouts
            pts = (ctx * K + k) * N_STATES + state
            a = policy.sample(pts, u[..., k], probs)
            state = self.next[hard, state, a]
            points.append(pts)
            acts.append(a)
            after.append(state)
        points, acts, after = torch.stack(points, -1), torch.stack(acts, -1), torch.stack(after, -1)
        observed = torch.where(noise_u < s.verifier_noise, self.LEVELS[noise_draw], self.LEVELS[after // 2])
        # counterfactual alternatives: CF_SAMPLES actions at each turn's point, the same noisy verifier
        cf_pts = points[..., None].expand(S, R, K, CF_SAMPLES)
        cf_a = policy.sample(cf_pts.reshape(S, -1), cf_u.reshape(S, -1), probs).view_as(cf_pts)
        before = torch.cat([torch.zeros(S, R, 1, dtype=torch.long), after[..., :-1]], -1)
        cf_state = self.next[hard[..., None, None].expand_as(cf_a), before[..., None].expand_as(cf_a), cf_a]
        cf_obs = torch.where(cf_noise_u < s.verifier_noise, self.LEVELS[cf_draw], self.LEVELS[cf_state // 2])
        T = 2 * K
        pos = 1 + 2 * torch.arange(K)
        tok_points = torch.full((S, R, T), -1, dtype=torch.long)
        tok_actions = torch.full((S, R, T), -1, dtype=torch.long)
        tok_points[..., pos], tok_actions[..., pos] = points, acts
        turn_ids = torch.full((S, R, T), -1, dtype=torch.long)
        turn_ids[..., pos] = torch.arange(K)
        input_ids = torch.full((S, R, T), PAD, dtype=torch.long)
        input_ids[..., 0] = PROMPT + ctx
        input_ids[..., pos] = REPLY + acts
        input_ids[..., pos[:-1] + 1] = FEEDBACK + (2 * observed[..., :-1]).long()
        seed_row = torch.arange(S)[:, None].expand(S, R).reshape(-1)
        B = S * R
        flat = {"points": tok_points.reshape(B, T), "actions": tok_actions.reshape(B, T)}
        behaviour = policy.token_logp(policy.log_probs().detach(), seed_row, flat["points"], flat["actions"])
        f32 = torch.float32
        batch = RolloutBatch(
            input_ids=input_ids.reshape(B, T), attention_mask=torch.ones(B, T, dtype=torch.long),
            response_mask=(flat["points"] >= 0).float(), turn_ids=turn_ids.reshape(B, T),
            group_ids=(torch.arange(S)[:, None] * C + ctx).reshape(-1), behaviour_logprobs=behaviour,
            scores=observed[..., -1].reshape(B).to(f32), reward_parts={"final": observed[..., -1].reshape(B).to(f32)},
            turn_scores=observed.reshape(B, K).to(f32), turn_mask=torch.ones(B, K, dtype=torch.bool))
        return {"batch": batch, "seed": seed_row, **flat, "rows": R, "cf_scores": cf_obs.reshape(B, K, CF_SAMPLES),
                "truth": self.LEVELS[after[..., -1] // 2].reshape(B)}

    def add_counterfactuals(self, batch: RolloutBatch, cf_scores: Tensor) -> None:
        """``batch.extras["alt_scores"]`` [B, K, M] (NaN off the selected turns) and ``["cf_mask"]`` [B, K], as
        ``augment=counterfactual`` adds them (top 5 turns per group by surprisal, 4 alternatives)."""
        cf_mask = select_counterfactual_turns(batch.turn_surprisal(), batch.turn_mask, batch.group_ids, top_l=CF_TOP_L)
        batch.extras["cf_mask"] = cf_mask
        batch.extras["alt_scores"] = torch.where(cf_mask[..., None], cf_scores.float(), math.nan)

    def sets(self, policy: TablePolicy, gen: torch.Generator, method: Method, estimator) -> list[LossSet]:
        r = self.rollouts(policy, gen)
        if getattr(estimator, "needs", frozenset()):
            self.add_counterfactuals(r["batch"], r["cf_scores"])
        adv = estimator(r["batch"]).advantages
        return [LossSet(r["batch"], r["seed"], r["points"], r["actions"], adv, r["batch"].response_mask,
                        grpo_loss(), float(self.S), r["rows"])]

    def knobs(self) -> dict[str, Any]:
        return asdict(self.s)


# ------------------------------------------------------------------------------------------------ (c) decision
SAC, NS, KEEP, REVISE = 0, 1, 0, 1


def revise_shares(own: Tensor, forced: Tensor, challenged: Tensor, rule: str) -> Tensor:
    """:func:`~lit_credit.rewards.dpa.revise_share` of each seed at once: ``#(own or forced) / n`` (``all``) or
    ``#own / n`` (``unforced``) over the seed's challenged decisions, 0 with none. own, forced, challenged [S, N]
    bool. Output [S]."""
    revised = own | forced if rule == "all" else own
    n = challenged.sum(1)
    return torch.where(n > 0, (revised & challenged).sum(1) / n.clamp_min(1), 0.0).double()


def rarity(labels: Tensor, on: Tensor, power: float) -> Tensor:
    """:func:`~lit_credit.rewards.dpa.rarity_weights` (``merge_subcases=True``) of each seed's decisions marked
    ``on``: ``w = (mean_present count / count(case id)) ** power`` within the seed. labels [S, N] (indices into
    ``CASES``), on [S, N] bool. Output [S, N] (1 off ``on``)."""
    if power == 0:
        return torch.ones(labels.shape, dtype=torch.float64)
    ids = CASE_IDS[labels]
    n_ids = int(CASE_IDS.max()) + 1
    S = len(labels)
    counts = torch.zeros(S * n_ids, dtype=torch.float64).index_add_(
        0, (torch.arange(S)[:, None] * n_ids + ids).reshape(-1), on.reshape(-1).double()).view(S, n_ids)
    present = counts > 0
    mean = (counts.sum(1) / present.sum(1).clamp_min(1))[:, None]
    w = (mean / counts.gather(1, ids).clamp_min(1)) ** power
    return torch.where(on, w, 1.0)


class DecisionFamily:
    """Family ``decision`` (module docstring). Points: proposer ``c`` (V values), verifier ``C + 2c + f`` (SAC, NS;
    f = 1 when the feature says x is right), approver ``3C + c`` (KEEP, REVISE). Roles: generator 0 (proposer,
    approver), verifier 1."""

    name = "decision"

    def __init__(self, setting: DecisionSetting, seeds: int, seed: int) -> None:
        s = self.s = setting
        self.S, self.C, self.V = seeds, s.contexts, s.values
        valid = torch.zeros(4 * self.C, self.V, dtype=torch.bool)
        valid[: self.C] = True
        valid[self.C:, :2] = True
        self.valid = valid
        self.roles = torch.zeros(4 * self.C, dtype=torch.long)
        self.roles[self.C: 3 * self.C] = 1
        self.mode = torch.randint(self.V, (seeds, self.C), generator=_gen(seed, -1))
        p = torch.full((seeds, self.C, self.V), (1 - s.modal) / (self.V - 1), dtype=torch.float64)
        self.gold_probs = p.scatter(-1, self.mode[..., None], s.modal)

    def policy(self) -> TablePolicy:
        return TablePolicy(self.S, self.valid, self.roles)

    def truth(self, probs: Tensor, game: bool = True) -> Tensor:
        """The submitted line's accuracy ``J [S]`` (module docstring); ``game=False``: the proposals' ``mean_c P_c``."""
        s, C = self.s, self.C
        p = probs.double()
        right = (p[:, :C] * self.gold_probs).sum(-1)  # P_c [S, C]
        if not game:
            return right.mean(-1)
        sac = p[:, C: 3 * C, SAC].reshape(self.S, C, 2)  # [S, C, f]
        rev = p[:, 3 * C:, REVISE]  # [S, C]
        b, z = s.verifier_accuracy, s.revision_right
        sac_right = (1 - b) * sac[..., 0] + b * sac[..., 1]  # x right: the feature says right with prob b
        sac_wrong = b * sac[..., 0] + (1 - b) * sac[..., 1]
        acc = right * (1 - sac_right * rev * (1 - z)) + (1 - right) * sac_wrong * rev * z
        return acc.mean(-1)

    def diagnostics(self, probs: Tensor) -> dict[str, Tensor]:
        """Per seed [S]: the approver's own REVISE probability and the verifier's SAC probability on a feature
        saying wrong / right, averaged over lines, and the proposals' accuracy."""
        C = self.C
        return {"revise": probs[:, 3 * C:, REVISE].double().mean(-1),
                "sac_on_wrong": probs[:, C: 3 * C, SAC].reshape(self.S, C, 2)[..., 0].double().mean(-1),
                "sac_on_right": probs[:, C: 3 * C, SAC].reshape(self.S, C, 2)[..., 1].double().mean(-1),
                "proposal": self.truth(probs, game=False)}

    @staticmethod
    def _pairs(seed: Tensor, points: Tensor, rewards: Tensor, groups: Tensor, policy: TablePolicy,
               table: Tensor) -> tuple[RolloutBatch, Tensor, Tensor]:
        """Both canonical actions (0, 1) of each decision as rows 2n, 2n + 1 (prompt token, action token), one
        group per decision, as :func:`~lit_credit.rollout.roles.action_batch` lays a role's pairs out."""
        N = len(points)
        seed_row = seed.repeat_interleave(2)
        tok_points = torch.stack([torch.full((2 * N,), -1), points.repeat_interleave(2)], 1)
        tok_actions = torch.stack([torch.full((2 * N,), -1), torch.arange(2).repeat(N)], 1)
        batch = RolloutBatch(
            input_ids=torch.stack([PROMPT + points.repeat_interleave(2), REPLY + torch.arange(2).repeat(N)], 1),
            attention_mask=torch.ones(2 * N, 2, dtype=torch.long),
            response_mask=torch.tensor([0.0, 1.0]).repeat(2 * N, 1), turn_ids=torch.tensor([-1, 0]).repeat(2 * N, 1),
            group_ids=groups.repeat_interleave(2), behaviour_logprobs=torch.zeros(2 * N, 2),
            scores=rewards.reshape(-1).float())
        return batch, seed_row, (tok_points, tok_actions)

    def sets(self, policy: TablePolicy, gen: torch.Generator, method: Method, estimator) -> list[LossSet]:
        s, S, C = self.s, self.S, self.C
        dpa = replace(s.dpa, **method.options.get("dpa", {}))  # the method's DPA settings over the setting's
        N = C * s.n
        ctx = torch.arange(N) // s.n
        u_x, u_gold, u_f, u_v, u_z, u_a, u_e = (_rand(gen, S, N) for _ in range(7))
        probs = policy.probs()
        table = policy.log_probs().detach()
        x = policy.sample(ctx.expand(S, N), u_x, probs)
        cdf = self.gold_probs[:, ctx].cumsum(-1)  # [S, N, V]
        gold = (u_gold[..., None] >= cdf).sum(-1).clamp_max(self.V - 1)
        x_right = x == gold
        looks_right = x_right ^ (u_f >= s.verifier_accuracy)
        v_points = C + 2 * ctx + looks_right.long()
        challenged = policy.sample(v_points, u_v, probs) == SAC
        z_right = u_z < s.revision_right
        a_points = (3 * C + ctx).expand(S, N)
        own = (policy.sample(a_points, u_a, probs) == REVISE) & challenged
        forced = challenged & ~own & (u_e < dpa.explore_revise)
        revised = own | forced
        seed = torch.arange(S)[:, None].expand(S, N)
        out: list[LossSet] = []
        opts = method.options
        if not opts.get("game", True):  # GRPO on the proposals (experiment=grpo_form)
            return [self._proposal_set(policy, table, x, x_right, ctx, estimator, reinforce_loss(), float(S))]
        # verifier pairs (SAC, NS) on every decision, weight verifier_weight x decisions (loss_reduction=sum)
        v_rewards = verifier_pair_rewards(x_right.reshape(-1))
        decision = torch.arange(S * N)
        batch, seed_row, (pts, acts) = self._pairs(seed.reshape(-1), v_points.expand(S, N).reshape(-1), v_rewards,
                                                   decision, policy, table)
        batch.behaviour_logprobs = policy.token_logp(table, seed_row, pts, acts)
        adv = estimator(batch).advantages
        out.append(LossSet(batch, seed_row, pts, acts, adv, batch.response_mask, dpa_loss(),
                           s.verifier_weight * S * N))
        # approver pairs (KEEP, REVISE) on the challenged decisions, with the REVISE bonus and the rarity weights
        ones = torch.ones_like(x_right)
        labels = case_labels(x_right.reshape(-1), challenged.reshape(-1), revised.reshape(-1), z_right.reshape(-1),
                             has_revision=ones.reshape(-1)).view(S, N)
        share = revise_shares(own, forced, challenged, dpa.revise_share)
        bonus = dpa.bonus(share)  # [S], one per seed
        a_rewards = dpa.approver_rewards(x_right.reshape(-1), z_right.reshape(-1), ones.reshape(-1)).view(S, N, 2)
        weights = rarity(labels, challenged, dpa.rarity_power)
        on = challenged.reshape(-1)
        if dpa.revise_bonus_on == "reward":
            a_rewards[..., 1] += bonus[:, None].to(a_rewards.dtype)
        if on.any():
            batch, seed_row, (pts, acts) = self._pairs(seed.reshape(-1)[on], a_points.reshape(-1)[on],
                                                       a_rewards.reshape(-1, 2)[on], decision[on], policy, table)
            batch.behaviour_logprobs = policy.token_logp(table, seed_row, pts, acts)
            adv = estimator(batch).advantages
            if dpa.revise_bonus_on == "advantage":  # DPAGRPOModule: adv + adv_bonus on the action tokens
                adv_bonus = torch.where(acts[:, 1] == REVISE, bonus[seed_row].float(), 0.0)
                adv = adv + adv_bonus[:, None] * batch.response_mask
            mask = batch.response_mask * weights.reshape(-1)[on].repeat_interleave(2)[:, None].float()
            out.append(LossSet(batch, seed_row, pts, acts, adv, mask, dpa_loss(), float(on.sum())))
        weight = opts.get("proposal_weight", 0.0)
        if weight:
            group = credit.GRPOCredit(unbiased=False, eps=1e-8)  # method.role_credit.proposer (conf/method/dpa_grpo.yaml)
            out.append(self._proposal_set(policy, table, x, x_right, ctx, group, dpa_loss(), weight * S * C))
        return out

    def _proposal_set(self, policy, table, x, x_right, ctx, estimator, loss, scale) -> LossSet:
        S, C, N = self.S, self.C, x.shape[1]
        seed_row = torch.arange(S)[:, None].expand(S, N).reshape(-1)
        pts = torch.stack([torch.full((S * N,), -1), ctx.repeat(S)], 1)
        acts = torch.stack([torch.full((S * N,), -1), x.reshape(-1)], 1)
        batch = RolloutBatch(
            input_ids=torch.stack([PROMPT + ctx.repeat(S), REPLY + x.reshape(-1)], 1),
            attention_mask=torch.ones(S * N, 2, dtype=torch.long), response_mask=torch.tensor([0.0, 1.0]).repeat(S * N, 1),
            turn_ids=torch.tensor([-1, 0]).repeat(S * N, 1), group_ids=(torch.arange(S)[:, None] * C + ctx).reshape(-1),
            behaviour_logprobs=policy.token_logp(table, seed_row, pts, acts), scores=x_right.reshape(-1).float())
        adv = estimator(batch).advantages
        return LossSet(batch, seed_row, pts, acts, adv, batch.response_mask, loss, scale)

    def knobs(self) -> dict[str, Any]:
        return asdict(self.s)


FAMILY_CLASSES = {"tool": (ToolFamily, ToolSetting), "revision": (RevisionFamily, RevisionSetting),
                  "decision": (DecisionFamily, DecisionSetting)}


def make_family(name: str, setting: Any, seeds: int, seed: int):
    return FAMILY_CLASSES[name][0](setting, seeds, seed)


# ------------------------------------------------------------------------------------------------ loop
def update(policy: TablePolicy, opt: torch.optim.Optimizer, sets: Sequence[LossSet], train: Train,
           gen: torch.Generator) -> None:
    """``minibatches`` AdamW updates (one when a set's rows vary by seed): each on a random ``1/minibatches`` of
    every seed's rows, loss ``sum_sets scale * PolicyLoss(logp, old, A, mask, ref)``, old = the behaviour
    log-probs, then per-seed, per-role clipping."""
    m = train.minibatches if all(s.rows is not None for s in sets) else 1
    chunks = []
    for s in sets:
        if m == 1:
            chunks.append([torch.arange(len(s.seed))])
            continue
        order = torch.rand(policy.theta.shape[0], s.rows, generator=gen).argsort(1)
        rows = torch.arange(policy.theta.shape[0])[:, None] * s.rows + order
        chunks.append([c.reshape(-1) for c in rows.chunk(m, 1)])
    for j in range(m):
        opt.zero_grad(set_to_none=False)
        table = policy.log_probs()
        total = 0.0
        for s, parts in zip(sets, chunks):
            idx = parts[j]
            logp = policy.token_logp(table, s.seed[idx], s.points[idx], s.actions[idx])
            ref = policy.token_logp(policy.reference, s.seed[idx], s.points[idx], s.actions[idx])
            loss, _ = s.loss(logp, s.batch.behaviour_logprobs[idx], s.advantages[idx], s.mask[idx], ref)
            total = total + s.scale * loss
        total.backward()
        policy.clip_(train.max_grad_norm)
        opt.step()


def train_method(family, method: Method, train: Train, seed: int) -> dict[str, Tensor]:
    """Train every seed of ``family`` with ``method``: ``{"truth": [S, steps + 1]}`` (the truth before each step
    and after the last) and, for the decision family, the final :meth:`DecisionFamily.diagnostics`."""
    policy = family.policy()
    opt = torch.optim.AdamW([policy.theta], lr=train.lr, weight_decay=0.0)
    estimator = method.make()
    game = method.options.get("game", True)
    truth = [family.truth(policy.probs(), game) if family.name == "decision" else family.truth(policy.probs())]
    for step in range(train.steps):
        gen = _gen(seed, step)
        sets = family.sets(policy, gen, method, estimator)
        update(policy, opt, sets, train, gen)
        probs = policy.probs()
        truth.append(family.truth(probs, game) if family.name == "decision" else family.truth(probs))
    out = {"truth": torch.stack(truth, 1)}
    if family.name == "decision":
        out.update({k: v for k, v in family.diagnostics(policy.probs()).items()})
    return out


# ------------------------------------------------------------------------------------------------ statistics
def steps_to(curve: Tensor, threshold: float) -> tuple[Tensor, Tensor]:
    """``(steps [S], reached [S])``: the first step t with ``J_t >= threshold`` (t = 0 before any update),
    censored at the budget ``T = curve.shape[1] - 1`` where never reached."""
    hit = curve >= threshold
    first = torch.where(hit.any(1), hit.double().argmax(1), curve.shape[1] - 1)
    return first.double(), hit.any(1)


def paired(x: Tensor, y: Tensor) -> dict[str, float | None]:
    """The seed-paired difference ``x - y``: mean, Student-t 95 % interval, sd and the smallest detectable
    difference (80 % power)."""
    d = (x - y).double()
    mean, low, high = paired_t(d.tolist())
    sd = float(d.std()) if len(d) > 1 else 0.0
    return {"diff": mean, "low": low, "high": high, "sd": sd, "detectable": detectable_effect(sd, len(d))}


def summarize(results: dict[str, dict[str, Tensor]], threshold: float, baseline: str = "grpo") -> list[dict]:
    """One row per method: ``final`` mean truth, ``steps`` mean steps-to-threshold, ``reached`` share, and against
    ``baseline`` the paired ``d_final`` and ``d_steps`` (:func:`paired`); the decision family's diagnostics."""
    base = results[baseline]["truth"]
    base_steps, _ = steps_to(base, threshold)
    rows = []
    for name, res in results.items():
        curve = res["truth"]
        steps, reached = steps_to(curve, threshold)
        row = {"method": name, "final": float(curve[:, -1].mean()), "final_sd": float(curve[:, -1].std()),
               "steps": float(steps.mean()), "reached": float(reached.double().mean()),
               "start": float(curve[:, 0].mean()),
               "curve": [float(v) for v in curve.mean(0)[:: max(1, (curve.shape[1] - 1) // 50)]],
               "identical_to_baseline": bool(torch.equal(curve, base))}
        row["d_final"] = paired(curve[:, -1], base[:, -1])
        row["d_steps"] = paired(steps, base_steps)
        for key in ("revise", "sac_on_wrong", "sac_on_right", "proposal"):
            if key in res:
                row[key] = float(res[key].mean())
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------------ sweeps
@dataclass(frozen=True)
class Sweep:
    """A dose-response sweep of one family: the knob (a field of the family's setting) and its values, the
    other knobs at ``base``."""

    family: str
    knob: str
    values: tuple
    base: Any
    train: Train


@dataclass(frozen=True)
class Size:
    seeds: int
    sweeps: tuple[Sweep, ...]


def _sizes() -> dict[str, Size]:
    tool = Train(steps=100, lr=0.05, threshold=0.9)
    revision = Train(steps=100, lr=0.05, threshold=0.9)
    decision = Train(steps=150, lr=0.1, threshold=0.5)
    full = (
        Sweep("tool", "judge_noise", (0.0, 0.25, 0.5, 0.75, 1.0), ToolSetting(), tool),
        Sweep("tool", "w_summary", (0.25, 1.0, 4.0), ToolSetting(), tool),
        Sweep("revision", "turns", (2, 3, 4, 6), RevisionSetting(), revision),
        Sweep("revision", "hard_share", (0.0, 0.5, 1.0), RevisionSetting(), revision),
        Sweep("revision", "verifier_noise", (0.0, 0.2, 0.4), RevisionSetting(), revision),
        Sweep("decision", "revision_right", (0.2, 0.4, 0.6, 0.8, 1.0), DecisionSetting(), decision),
    )
    tiny_train = {"tool": replace(tool, steps=30), "revision": replace(revision, steps=30),
                  "decision": replace(decision, steps=30)}
    tiny = (Sweep("tool", "judge_noise", (0.0, 1.0), ToolSetting(), tiny_train["tool"]),
            Sweep("revision", "turns", (3,), RevisionSetting(), tiny_train["revision"]),
            Sweep("decision", "revision_right", (0.2, 1.0), DecisionSetting(), tiny_train["decision"]))
    return {"tiny": Size(seeds=8, sweeps=tiny), "full": Size(seeds=200, sweeps=full)}


SIZES = _sizes()


def run_cell(family: str, setting: Any, train: Train, seeds: int, seed: int = 0,
             methods: Sequence[Method] | None = None) -> dict[str, Any]:
    """Every method of ``family`` on one setting, paired seeds: ``{"rows": summarize(...), "elapsed_s"}``."""
    fam = make_family(family, setting, seeds, seed)
    start = time.perf_counter()
    results = {m.name: train_method(fam, m, train, seed) for m in (methods or METHODS[family])}
    return {"rows": summarize(results, train.threshold), "elapsed_s": time.perf_counter() - start,
            "results": results}


def run(size: str = "tiny", seed: int = 0, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every sweep of ``size`` (:data:`SIZES`): ``{"settings", "cells"}``, a cell per (sweep, knob value)."""
    if size not in SIZES:
        raise ValueError(f"--size {size!r}: use one of {', '.join(SIZES)}")
    spec = SIZES[size]
    cells = []
    for sweep in spec.sweeps:
        for value in sweep.values:
            setting = replace(sweep.base, **{sweep.knob: value})
            cell = run_cell(sweep.family, setting, sweep.train, spec.seeds, seed)
            cell.pop("results")
            cells.append({"family": sweep.family, "knob": sweep.knob, "value": value, "setting": asdict(setting),
                          "train": asdict(sweep.train), **cell})
            if log:
                log(f"{sweep.family} {sweep.knob}={value}: {cell['elapsed_s']:.1f} s")
    return {"settings": {"size": size, "seed": seed, "seeds": spec.seeds}, "cells": cells}


# ------------------------------------------------------------------------------------------------ report
def _ci(d: dict) -> str:
    return f"{d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"


def _ci_steps(d: dict) -> str:
    return f"{d['diff']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}]"


def markdown(report: dict[str, Any]) -> str:
    """Per sweep, per knob value a table: method, start and final truth, the paired final difference vs GRPO
    with its 95 % interval, the mean steps to threshold (censored at the budget), the reached share and the
    paired steps difference vs GRPO; the decision family adds the approver's REVISE probability."""
    out = []
    for (family, knob), cells in _by_sweep(report).items():
        out += [f"### {family}: {knob}", ""]
        for cell in cells:
            t = cell["train"]
            head = (f"**{knob} = {cell['value']}** ({report['settings']['seeds']} seeds, {t['steps']} steps, "
                    f"threshold {t['threshold']}, {cell['elapsed_s']:.0f} s)")
            extra = family == "decision"
            out += [head, "", "| method | start | final | d final vs GRPO [95 % CI] | steps | reached | "
                    "d steps vs GRPO [95 % CI] |" + (" REVISE p | proposal acc |" if extra else ""),
                    "|---|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if extra else "")]
            for r in cell["rows"]:
                same = " (= GRPO)" if r["identical_to_baseline"] and r["method"] != "grpo" else ""
                line = (f"| {r['method']}{same} | {r['start']:.3f} | {r['final']:.3f} | {_ci(r['d_final'])} | "
                        f"{r['steps']:.1f} | {r['reached']:.2f} | {_ci_steps(r['d_steps'])} |")
                if extra:
                    line += f" {r.get('revise', float('nan')):.2f} | {r.get('proposal', float('nan')):.3f} |"
                out.append(line)
            out.append("")
    return "\n".join(out)


def _by_sweep(report: dict[str, Any]) -> dict[tuple[str, str], list[dict]]:
    out: dict[tuple[str, str], list[dict]] = {}
    for cell in report["cells"]:
        out.setdefault((cell["family"], cell["knob"]), []).append(cell)
    return out


def plot(report: dict[str, Any]):
    """A matplotlib Figure (pyplot-free): a row per sweep, columns the paired difference vs GRPO in final truth
    and in steps-to-threshold against the knob, one line per method with its 95 % interval as error bars."""
    from matplotlib.figure import Figure

    sweeps = _by_sweep(report)
    fig = Figure(figsize=(13, 3.2 * len(sweeps)), dpi=100)
    axes = fig.subplots(len(sweeps), 2, squeeze=False)
    for row, ((family, knob), cells) in enumerate(sweeps.items()):
        methods = [r["method"] for r in cells[0]["rows"] if r["method"] != "grpo"]
        xs = [c["value"] for c in cells]
        for col, (key, label) in enumerate((("d_final", "final truth - GRPO's"),
                                            ("d_steps", "steps to threshold - GRPO's"))):
            ax = axes[row, col]
            for i, m in enumerate(methods):
                ds = [next(r for r in c["rows"] if r["method"] == m)[key] for c in cells]
                mid = [d["diff"] for d in ds]
                err = [[d["diff"] - d["low"] for d in ds], [d["high"] - d["diff"] for d in ds]]
                shift = (i - len(methods) / 2) * 0.004 * (max(xs) - min(xs) or 1)
                ax.errorbar([x + shift for x in xs], mid, yerr=err, marker="os^Dv<>"[i % 7],
                            ls=("-", "--", ":", "-.")[i % 4], lw=1.1, ms=4, capsize=2, label=m)
            ax.axhline(0.0, color="grey", lw=0.7)
            ax.set_xticks(xs)
            ax.set_xlabel(knob, fontsize=8)
            ax.set_title(f"({family}) {label}", fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return fig


__all__ = ["DECISION_METHODS", "FAMILIES", "METHODS", "REVISION_METHODS", "SIZES", "TOOL_METHODS",
           "DecisionFamily", "DecisionSetting", "LossSet", "Method", "RevisionFamily", "RevisionSetting", "Sweep",
           "TablePolicy", "ToolFamily", "ToolSetting", "Train", "markdown", "paired", "plot", "rarity",
           "revise_shares", "revision_transitions", "run", "run_cell", "steps_to", "summarize", "train_method",
           "update"]


def main(argv: list[str] | None = None) -> dict:
    return ground_truth_main("credit_learning", sys.modules[__name__], __doc__, argv,
                             "tiny: the CI setting (seconds); full: the documented run (200 seeds per cell)",
                             "seed of every draw (contexts, sampling, noise)",
                             log=lambda m: print(m, file=sys.stderr, flush=True))


if __name__ == "__main__":
    main()
