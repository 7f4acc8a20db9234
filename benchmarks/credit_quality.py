"""Credit quality with ground truth: does the credit a unit gets track how good the unit truly is?

    .venv/bin/python -m benchmarks.credit_quality [--size small|full] [--seed 0]
        [--out benchmarks/results/credit_quality.json] [--plot docs/experiments/credit_quality.png]

Three families of synthetic rollout batches whose units have a known true quality ``q_u``, built with the
project's own parts (toolcall rows and their tool environment, the HierR reward, the rollout layout of
:class:`~lit_credit.rollout.Trajectory` / :func:`~lit_credit.rollout.to_batch`, TCPO's counterfactual augmenter,
the DPA pair rewards); every registered credit estimator runs on them as in training. No model, no training.

- ``tool`` (:func:`tool_probes` with ``causal=True``): tool-calling rollouts, a tool turn per gold step (gold,
  value-, name-corrupted or malformed), then a summary. The truth is a latent the rewards measure: whether each
  call is right (the turn's kind is ``gold``), and the summary's rating, which depends on the calls: a summariser
  of skill ``r`` (1-5) writes a summary of rating ``1 + floor((r - 1) * c + 1/2)`` when a share ``c`` of its calls is
  right (a wrong call never fetched what a good summary reports). Both rewards measure with noise: HierR's
  process score (a partial-credit measure of the calls: a well-formed wrong call keeps a floor) and the judge's
  rating; ToolPO's strict ratio is the truth itself (up to parallel steps) under the same noise, so ToolPO is
  truth-fed here. Units: ``tool_turn`` (q = the call is right), ``tool`` (q = the share of right calls), ``summary``
  (q = the clean judge's score of the true rating).
- ``tool_mechanism`` (:func:`tool_probes`, ``causal=False``): the same rollouts as a mechanism check, not a
  contest: the tool units' truth is HierR's clean process score (what SLCA's tool advantage normalises, so SLCA
  scores Spearman 1 by construction) and the summary's rating is drawn independently of the calls. It shows
  whether judge noise reaches tool credit (``leak``), nothing about which credit is better.
- ``revision`` (:func:`revision_probes`): revision episodes of a synthetic process whose turns improve,
  maintain, regress, enable a later fix or fix; unit ``turn``, q = the turn's exact effect on the outcome.
- ``decision`` (:func:`decision_probes`): DPA decisions, both canonical actions scored; units ``verifier``,
  ``approver``, ``reviser``, q = whether the action's final value is right.

The noise level is that of the family's measurements: the summary judge and the process score (``tool``: each
rollout's process score and each turn's tool score, and TCPO's counterfactual alternatives' scores, independently
replaced by a uniform draw in [0, 1]), the summary judge alone (``tool_mechanism``), the per-turn verifier
(``revision``), the form oracle (``decision``). At level p each measured value is, with probability p,
replaced by a uniform draw of its range (a rating 1-5, a score in [0, 1] or {0, 0.5, 1}, a correctness bit);
truth never.

Scores of one estimator on one unit type, with ``c_u = mean_{t in u} A_t`` the unit's credit (its mean token
advantage) and g(u) its group (the rollouts of one prompt, or one DPA pair):

- ``spearman``: within each group, Spearman's rank correlation of c and q (average ranks on ties), averaged
  over groups; a group with constant q is skipped, one with constant c (and varying q) counts 0.
- ``sign``: the share of units with ``sign(c_u) = sign(q_u - mean_{g(u)} q)`` over the units whose q differs
  from the group mean (by more than 1e-9); zero credit never agrees.
- ``sign0`` (effects only, ``revision``): the share with ``sign(c_u) = sign(q_u)`` over units with a non-zero
  effect, since an effect has a natural zero: an improvement should be pushed up, a regression down.
- ``leak`` (tool units of ``tool``): the pooled within-group Pearson correlation between the judge-noise part
  of the rollout's summary score, ``e_i = summary_i(noisy judge) - summary_i(clean judge)``, and the credit:
  ``sum (e_i - mean_g e)(c_i - mean_g c) / sqrt(sum (e_i - mean_g e)^2 * sum (c_i - mean_g c)^2)``; undefined
  without noise. ``leak_se = 1 / sqrt(N - G)`` (N units in G groups) is its standard error when c does not
  depend on e.

An estimator that does not apply to a family (it raises ``ValueError`` on the batch, or it is listed in
:data:`NOT_APPLICABLE`) is reported n/a with the reason.

Output: the markdown table on stdout, the JSON report (with the machine) at ``--out``, the plot at ``--plot``.
``small`` runs in seconds (the test suite runs it), ``full`` in about a minute on 2 CPU cores.
"""
from __future__ import annotations

import dataclasses
import math
import random
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from benchmarks.machine import ground_truth_main
from lit_credit import credit
from lit_credit.credit.groups import group_rank, group_stats
from lit_credit.rewards import (
    FinalTurnReward,
    HierRReward,
    SummaryJudge,
    approver_pair_rewards,
    normalize_gold_calls,
    verifier_pair_rewards,
)
from lit_credit.rewards.dpa import reviser_pair_rewards
from lit_credit.rewards.hierr import CLOSE
from lit_credit.rollout.augment import CounterfactualTurns
from lit_credit.rollout.loop import Trajectory, to_batch
from lit_credit.rollout.roles import action_batch
from lit_credit.tasks.toolcall import ToolCallTask, tool_call_text
from lit_credit.types import Completion, Feedback, RewardResult, RolloutBatch, SamplingParams

NOISES = (0.0, 0.25, 0.5, 1.0)
GROUP_SIZE = 8
FAMILIES = ("tool", "tool_mechanism", "revision", "decision")
TOL = 1e-9

# Token ids are synthetic (no estimator reads them): prompt tokens carry the rollout's index, reply and
# feedback tokens their turn, so the scripted samplers below know which history an alternative continues.
PAD, REPLY, FEEDBACK, PROMPT = 0, 10, 100, 1000
CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class Size:
    """How many groups each family draws: ``tool_groups`` prompts and ``revision_groups`` episodes groups of
    :data:`GROUP_SIZE` rollouts, ``decisions`` DPA decisions (one pair per role each)."""

    tool_groups: int
    revision_groups: int
    decisions: int


SIZES = {"small": Size(tool_groups=4, revision_groups=6, decisions=48),
         "full": Size(tool_groups=200, revision_groups=400, decisions=2000)}


@dataclass
class Units:
    """The units of one type in one batch and their truth.

    of_token: [B, T] long, the unit each token belongs to (-1: none). truth, group, kind: [N] (float64, long,
    long): true quality, group id, index into ``kinds``. noise: [N] the judge-noise part of the summary score
    of the unit's rollout (``leak``), or None. effect: the truth is an effect with a natural zero (``sign0``).
    """

    name: str
    of_token: Tensor
    truth: Tensor
    group: Tensor
    kind: Tensor
    kinds: tuple[str, ...]
    noise: Tensor | None = None
    effect: bool = False


@dataclass
class Probe:
    """One batch of a family at one noise level and its unit types."""

    family: str
    noise: float
    batch: RolloutBatch
    units: list[Units] = field(default_factory=list)


def tokens(text: str) -> int:
    """Synthetic token count of a text: one per ``CHARS_PER_TOKEN`` characters, at least 1."""
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


# ------------------------------------------------------------------------------------------------ scoring
def unit_credit(advantages: Tensor, of_token: Tensor, n_units: int) -> Tensor:
    """``c_u = sum_{t: of_token = u} A_t / #{t: of_token = u}`` in float64 (exact on a unit whose tokens share
    one value, as every estimator's do), one ``index_add`` over the tokens.

    Shape:
        advantages [B, T], of_token [B, T] long (-1: no unit). Output: [N] float64.
    """
    on = of_token >= 0
    index = of_token[on]
    sums = torch.zeros(n_units, dtype=torch.float64).index_add_(0, index, advantages[on].double())
    return sums / torch.bincount(index, minlength=n_units).clamp_min(1)


def by_group(group: Tensor, *values: Tensor) -> tuple[list[Tensor], Tensor]:
    """Values laid out ``[G, M]`` (row = group in id order, M = the largest group; NaN padding) and the
    ``[G, M]`` valid mask: a sort by group and one scatter each."""
    rank = group_rank(group)
    counts = torch.bincount(rank)
    order = rank.argsort(stable=True)
    start = counts.cumsum(0) - counts
    pos = torch.empty_like(rank)
    pos[order] = torch.arange(len(rank)) - start[rank[order]]
    shape = (len(counts), int(counts.max()))
    valid = torch.zeros(shape, dtype=torch.bool).index_put_((rank, pos), torch.tensor(True))
    return [torch.full(shape, math.nan, dtype=torch.float64).index_put_((rank, pos), v.double())
            for v in values], valid


def average_ranks(x: Tensor, valid: Tensor) -> Tensor:
    """1-based ranks within each row over the valid entries, ties averaged:
    ``rank_i = #{j: x_j < x_i} + (#{j: x_j = x_i} + 1) / 2`` (the count of equals includes i). [G, M]."""
    xi, xj, vj = x[:, :, None], x[:, None, :], valid[:, None, :]
    less = ((xj < xi) & vj).sum(-1)
    equal = ((xj == xi) & vj).sum(-1)
    return torch.where(valid, less + (equal + 1) / 2, 0.0).double()


def row_pearson(x: Tensor, y: Tensor, valid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per row ``(r, var x, var y)`` over the valid entries (sums of squares, not divided); r is NaN where a
    variance is 0."""
    n = valid.sum(1).clamp_min(1)
    cx = torch.where(valid, x - torch.where(valid, x, 0).sum(1, keepdim=True) / n[:, None], 0)
    cy = torch.where(valid, y - torch.where(valid, y, 0).sum(1, keepdim=True) / n[:, None], 0)
    vx, vy = (cx * cx).sum(1), (cy * cy).sum(1)
    return (cx * cy).sum(1) / (vx * vy).sqrt(), vx, vy


def within_group_spearman(credit_: Tensor, truth: Tensor, group: Tensor) -> tuple[float | None, int]:
    """``(mean over groups of Spearman(c, q), groups counted)``: groups with constant q are skipped, a group
    with constant c counts 0 (its credit ranks nothing); None when no group counts."""
    (c, q), valid = by_group(group, credit_, truth)
    r, var_c, var_q = row_pearson(average_ranks(c, valid), average_ranks(q, valid), valid)
    counted = var_q > 0
    if not counted.any():
        return None, 0
    return torch.where(var_c > 0, r, 0)[counted].mean().item(), int(counted.sum())


def sign_agreement(credit_: Tensor, truth: Tensor, group: Tensor, kind: Tensor, n_kinds: int
                   ) -> tuple[float | None, int, list[float | None]]:
    """``(share, units counted, share per kind)`` of ``sign(c_u) = sign(q_u - mean_{g(u)} q)`` over the units
    whose q is off the group mean; |c| <= 1e-9 counts as 0, which never agrees."""
    centred = group_stats(truth.double(), group)[0]
    return _agreement(credit_, centred, kind, n_kinds)


def _agreement(credit_: Tensor, target: Tensor, kind: Tensor, n_kinds: int
               ) -> tuple[float | None, int, list[float | None]]:
    counted = target.abs() > TOL
    agree = (torch.sign(credit_) * (credit_.abs() > TOL)) == torch.sign(target)
    units = torch.bincount(kind[counted], minlength=n_kinds)
    hits = torch.bincount(kind[counted], weights=agree[counted].double(), minlength=n_kinds)
    per_kind = [h / n if n else None for h, n in zip(hits.tolist(), units.tolist())]
    n = int(counted.sum())
    return (agree[counted].double().mean().item() if n else None), n, per_kind


def leakage(noise: Tensor, credit_: Tensor, group: Tensor) -> tuple[float | None, float | None]:
    """``(leak, leak_se)``: the pooled within-group Pearson correlation of the judge-noise part e and the
    credit c (module docstring), None where e or c does not vary within any group; ``leak_se = 1 / sqrt(N - G)``.
    """
    ce, cc = group_stats(noise.double(), group)[0], group_stats(credit_.double(), group)[0]
    groups = torch.unique(group).numel()
    se = 1 / math.sqrt(len(group) - groups) if len(group) > groups else None
    denom = math.sqrt((ce * ce).sum().item() * (cc * cc).sum().item())
    return ((ce * cc).sum().item() / denom if denom > 0 else None), se


def score_units(units: Units, advantages: Tensor) -> dict[str, Any]:
    """Every score of one estimator's token advantages on one unit type (module docstring)."""
    c = unit_credit(advantages, units.of_token, len(units.truth))
    rho, groups = within_group_spearman(c, units.truth, units.group)
    sign, signed, per_kind = sign_agreement(c, units.truth, units.group, units.kind, len(units.kinds))
    row: dict[str, Any] = {"spearman": rho, "groups": groups, "sign": sign, "signed_units": signed,
                           "units": len(units.truth), "sign_by_kind": dict(zip(units.kinds, per_kind))}
    if units.effect:
        row["sign0"], row["effect_units"], by_kind = _agreement(c, units.truth, units.kind, len(units.kinds))
        row["sign0_by_kind"] = dict(zip(units.kinds, by_kind))
    if units.noise is not None:
        row["leak"], row["leak_se"] = leakage(units.noise, c, units.group)
    return row


# ------------------------------------------------------------------------------------------------ (a) tool
KINDS = ("gold", "value", "name", "malformed")
KIND_PROBS = (0.4, 0.25, 0.2, 0.15)
TOOL_SUBSETS = {"single": 1.0, "parallel": 1.0, "multi": 1.0, "chain": 1.0}
SEGMENT_KINDS = ("all gold", "worst value", "worst name", "worst malformed")
SUMMARY_KINDS = ("rating 1", "rating 2", "rating 3", "rating 4", "rating 5", "no tool response")


class KnownQualityJudge(SummaryJudge):
    """The construction's summary judge: it rates a summary with its true rating, ``truth`` (1-5), which the
    builder sets before each call; :class:`~lit_credit.rewards.SummaryJudge` adds the guards (no real tool
    response or a short reply: 0, not rated) and the noise (with probability ``noise`` a uniform 1-5 from its
    own ``random.Random(seed)``)."""

    def __init__(self, noise: float = 0.0, seed: int = 0) -> None:
        super().__init__(noise=noise, seed=seed)
        self.truth = 1

    def rate(self, question: str, tool_responses: list[str], reply: str) -> int:
        return self.truth


@dataclass(frozen=True)
class ToolSpec:
    """One tool rollout: ``group`` (index of its row: the prompt), ``kinds`` (one of :data:`KINDS` per gold
    step of the row) and ``rating`` (the summary's true rating, 1-5)."""

    group: int
    kinds: tuple[str, ...]
    rating: int


def wrong_value(value: Any) -> Any:
    """A value HierR's loose equality tells from ``value``: a bool negated, a number + 1, else ``str + "x"``."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    return f"{value}x"


def tool_turn_text(step: Sequence[Mapping[str, Any]], kind: str, allowed: Sequence[str]) -> str:
    """The assistant turn of gold ``step`` as ``kind``: ``gold`` the gold block; ``value`` the first argument
    of the first call wrong (:func:`wrong_value`); ``name`` the first call renamed to the first tool the row
    allows that the step does not call; ``malformed`` the gold block with its JSON body cut by one character."""
    if kind not in KINDS:
        raise ValueError(f"tool turn kind {kind!r}: use one of {KINDS}")
    calls = [{"name": c["name"], "arguments": dict(c["arguments"])} for c in step]
    first = calls[0]
    if kind == "value":
        key = next(iter(first["arguments"]))
        first["arguments"][key] = wrong_value(first["arguments"][key])
    elif kind == "name":
        names = {c["name"] for c in step}
        others = [t for t in allowed if t not in names]
        if not others:
            raise ValueError("a name-corrupted turn needs a row that allows a tool its step does not call "
                             "(task.max_distractors >= 1)")
        first["name"] = others[0]
    text = tool_call_text(calls)
    return text[: -len(CLOSE) - 1] + CLOSE if kind == "malformed" else text


def summary_text(responses: Sequence[str], rating: int) -> str:
    """The final reply: the real tool responses restated (more of them for a better rating), or an apology."""
    facts = " ".join(responses)
    return f"Here is what I found: {facts[: 40 * rating]}" if facts else "I could not get an answer from the tools."


def tool_episode(row: dict[str, Any], spec: ToolSpec, index: int, env: Any) -> Trajectory:
    """Rollout ``index`` of ``spec``, laid out as :func:`~lit_credit.rollout.run_episodes` lays out a real one:
    prompt (mask 0), per gold step k the tool turn (mask 1, turn k; behaviour log-prob ``log P(kind)`` per token),
    the environment's answers (mask 0), then the summary (turn K, the last learnable run: SLCA's summary)."""
    gold = normalize_gold_calls(row["gold_tool_calls"])
    if len(spec.kinds) != len(gold):
        raise ValueError(f"row {row.get('id')!r} has {len(gold)} gold steps but the spec {len(spec.kinds)} kinds")
    ep = Trajectory(row=row, group=spec.group, token_ids=[PROMPT + index] * tokens(row["question"] + row["tools"]))
    for k, (step, kind) in enumerate(zip(gold, spec.kinds)):
        text = tool_turn_text(step, kind, row["allowed_tools"])
        n, logp = tokens(text), math.log(KIND_PROBS[KINDS.index(kind)])
        ep.add_reply(Completion([REPLY + k] * n, [logp] * n, text), k)
        feedback = env.step(row, k, text)
        ep.turn_scores.append(feedback.score)
        ep.tool_responses += feedback.info.get("tool_responses", [])
        ep.add_feedback([FEEDBACK + k] * tokens("".join(m["content"] for m in feedback.messages)))
    summary = summary_text(ep.tool_responses, spec.rating)
    n = tokens(summary)
    ep.add_reply(Completion([REPLY + len(gold)] * n, [math.log(0.2)] * n, summary), len(gold))
    ep.turn_scores.append(env.step(row, len(gold), summary).score)
    return ep


def _history(prefix: Sequence[int]) -> tuple[int, int]:
    """(rollout index, turn) of the turn that continues ``prefix`` (the synthetic token ids above)."""
    last = prefix[-1]
    return prefix[0] - PROMPT, (last - FEEDBACK + 1 if FEEDBACK <= last < PROMPT else 0)


class ToolSampler:
    """The experience layer for :class:`~lit_credit.rollout.augment.CounterfactualTurns` (``score=reward``) on
    a tool batch: an alternative of tool turn k is a fresh kind drawn from :data:`KIND_PROBS` written on gold
    step k (:func:`tool_turn_text`), scored by the reward's ``turn_score`` (HierR's process score of the turn
    against gold step k). Only what the augmenter calls with ``score=reward`` (``sampling``, ``sample``,
    ``turn_score``) exists: it is the synthetic stand-in of that part of the experience layer."""

    def __init__(self, rows: Sequence[dict[str, Any]], reward: HierRReward, seed: int) -> None:
        self.rows, self.reward, self.rng = rows, reward, random.Random(seed)
        self.sampling = SamplingParams(n=4)

    def sample(self, prompts: list[list[int]], sampling: SamplingParams, seeds: list[int] | None = None
               ) -> list[list[Completion]]:
        out = []
        for prefix in prompts:
            i, k = _history(prefix)
            row = self.rows[i]
            step = normalize_gold_calls(row["gold_tool_calls"])[k]
            kinds = self.rng.choices(KINDS, KIND_PROBS, k=sampling.n)
            texts = [tool_turn_text(step, kind, row["allowed_tools"]) for kind in kinds]
            out.append([Completion([REPLY + k], [0.0], text) for text in texts])
        return out

    def turn_score(self, row: dict[str, Any], turn: int, reply: str) -> float:
        return self.reward.turn_score(row, turn, reply)


def tool_rows(groups: int, seed: int) -> list[dict[str, Any]]:
    """``groups`` held-out rows of the synthetic tool task, equal shares of single, parallel, multi and chain
    (one to three gold steps; irrelevant rows have no tool turn to credit)."""
    task = ToolCallTask(num_train=0, num_test=groups, subsets=TOOL_SUBSETS, seed=seed, debris_ends_episode=False)
    return [dict(r) for r in task.dataset("test")]


def right_share(spec: ToolSpec) -> float:
    """The share of ``spec``'s calls that are right (kind ``gold``): the tool segment's latent quality."""
    return spec.kinds.count("gold") / len(spec.kinds)


def summary_rating(spec: ToolSpec) -> int:
    """The true rating of ``spec``'s summary in the causal family: ``1 + floor((r - 1) * c + 1/2)`` (halves round up) for skill ``r =
    spec.rating`` and right-call share ``c`` (:func:`right_share`): all calls right gives ``r``, none gives 1."""
    return 1 + math.floor((spec.rating - 1) * right_share(spec) + 0.5)


def measured(batch: RolloutBatch, weights: Mapping[str, float], noise: float, seed: int) -> RolloutBatch:
    """``batch`` as noisy measurements of the calls report it: with probability ``noise`` independently, each
    rollout's ``reward_parts["process"]`` and ``reward_parts["toolpo_correct_ratio"]`` (ToolPO's strict ratio,
    a measurement of the same calls), each tool turn's ``turn_parts["tool_scores"]`` and each of TCPO's
    counterfactual ``extras["alt_scores"]`` is replaced by a uniform draw in [0, 1] (``torch.Generator`` seeded
    ``seed``); ``scores`` follow, ``score + w_process * (process' - process)``. The input is not changed."""
    if noise == 0:
        return batch
    gen = torch.Generator().manual_seed(seed)

    def noisy(x: Tensor) -> Tensor:
        hit = torch.rand(x.shape, generator=gen, dtype=torch.float64) < noise
        draw = torch.rand(x.shape, generator=gen, dtype=torch.float64).to(x.dtype)
        return torch.where(hit, draw, x)

    process = batch.reward_parts["process"]
    new_process = noisy(process)
    out = dataclasses.replace(
        batch, scores=batch.scores + weights["process"] * (new_process - process).to(batch.scores.dtype),
        reward_parts={**batch.reward_parts, "process": new_process,
                      **({"toolpo_correct_ratio": noisy(batch.reward_parts["toolpo_correct_ratio"])}
                         if "toolpo_correct_ratio" in batch.reward_parts else {})},
        turn_parts={**batch.turn_parts, "tool_scores": noisy(batch.turn_parts["tool_scores"])},
        extras=dict(batch.extras))
    if "alt_scores" in batch.extras:
        out.extras["alt_scores"] = noisy(batch.extras["alt_scores"])
    return out


def tool_specs(rows: Sequence[dict[str, Any]], seed: int, group_size: int = GROUP_SIZE) -> list[ToolSpec]:
    """``group_size`` rollouts per row: each gold step's kind drawn from :data:`KIND_PROBS`, the summary's true
    rating uniform in 1-5, from ``random.Random(seed)``."""
    rng = random.Random(seed)
    return [ToolSpec(g, tuple(rng.choices(KINDS, KIND_PROBS, k=len(normalize_gold_calls(row["gold_tool_calls"])))),
                     rng.randint(1, 5)) for g, row in enumerate(rows) for _ in range(group_size)]


def tool_probes(rows: Sequence[dict[str, Any]], specs: Sequence[ToolSpec], judges: Mapping[float, SummaryJudge],
                *, seed: int = 0, causal: bool = False) -> list[Probe]:
    """One probe per judge (noise level -> judge): the rollouts of ``specs`` on ``rows`` (environment
    ``ToolEnvironment(debris_ends_episode=False)``, so a malformed turn gets an error answer and the rollout
    goes on to its summary), scored by ``HierRReward(judge=judge)`` (weights 1, 1) and, for the truth, by the
    same reward with a clean :class:`KnownQualityJudge`. Every judge gets ``judge.truth`` = the summary's true
    rating before each call: ``spec.rating`` (``causal=False``, the ``tool_mechanism`` family) or
    :func:`summary_rating` (``causal=True``, the ``tool`` family, whose process measurements are also noisy at
    the judge's level: :func:`measured`, seeded ``seed``). TCPO's counterfactual alternatives of the tool turns
    (``batch.extras``, for ``slca_tcpo`` preset ``tcpo``) come from the project's
    ``CounterfactualTurns(score="reward")`` with its defaults (top 5 turns per group by surprisal, 4 samples) and
    a :class:`ToolSampler`; they do not depend on the judge. Truth: the clean process score (mechanism) or the
    right calls (causal) for the tool units, the clean judge's score for the summary."""
    env = ToolCallTask(num_train=0, num_test=0, debris_ends_episode=False).environment()
    ratings_true = [summary_rating(s) if causal else s.rating for s in specs]
    episodes = [tool_episode(rows[s.group], dataclasses.replace(s, rating=r), i, env)
                for i, (s, r) in enumerate(zip(specs, ratings_true))]

    def scored(judge: SummaryJudge) -> tuple[RolloutBatch, list[RewardResult]]:
        reward = HierRReward(judge=judge)
        results = []
        for ep, rating in zip(episodes, ratings_true):
            judge.truth = rating  # type: ignore[attr-defined]
            results.append(reward(ep.row, ep.replies, tool_responses=ep.tool_responses, turn_scores=ep.turn_scores))
        batch = to_batch(episodes, results, PAD)
        batch.reward_weights = reward.part_weights
        return batch, results

    clean, clean_results = scored(KnownQualityJudge(noise=0.0, seed=seed))
    sampler = ToolSampler([ep.row for ep in episodes], HierRReward(judge=KnownQualityJudge()), seed)
    CounterfactualTurns(score="reward", seed=seed)(clean, sampler)
    summary_clean = torch.tensor([r.parts["summary"] for r in clean_results], dtype=torch.float64)
    guarded = torch.tensor([r.parts["no_tool_response"] > 0 for r in clean_results])
    ratings = torch.tensor(ratings_true)
    mask = clean.turn_parts["tool_turn_mask"].bool()
    width = mask.shape[1]
    kinds = torch.tensor([[KINDS.index(k) for k in s.kinds] + [0] * (width - len(s.kinds)) for s in specs])
    rollout = torch.arange(len(specs))
    turn_unit = torch.where(mask, mask.flatten().long().cumsum(0).view_as(mask) - 1, -1)
    tool_mask, summary_mask = credit.segment_masks(clean.response_mask)
    on_turn = (clean.turn_ids >= 0) & (clean.turn_ids < width) & clean.response_mask.bool()
    turn_of_token = torch.where(on_turn, turn_unit.gather(1, clean.turn_ids.clamp(0, width - 1)), -1)
    groups = clean.group_ids
    if causal:
        turn_truth = (kinds == KINDS.index("gold")).double()[mask]
        tool_truth = torch.tensor([right_share(s) for s in specs], dtype=torch.float64)
    else:
        turn_truth = clean.turn_parts["tool_scores"][mask].double()
        tool_truth = torch.tensor([r.parts["process"] for r in clean_results], dtype=torch.float64)
    probes = []
    for level, judge in judges.items():
        batch, results = scored(judge)
        batch.extras = dict(clean.extras)
        if causal:
            batch = measured(batch, HierRReward().part_weights, float(level), seed)
        noise = torch.tensor([r.parts["summary"] for r in results], dtype=torch.float64) - summary_clean
        units = [
            Units("tool_turn", turn_of_token, turn_truth, groups[:, None].expand_as(mask)[mask], kinds[mask], KINDS,
                  noise[:, None].expand_as(mask)[mask]),
            Units("tool", torch.where(tool_mask, rollout[:, None], -1), tool_truth, groups,
                  torch.where(mask, kinds, 0).amax(1), SEGMENT_KINDS, noise),
            Units("summary", torch.where(summary_mask, rollout[:, None], -1), summary_clean, groups,
                  torch.where(guarded, len(SUMMARY_KINDS) - 1, ratings - 1), SUMMARY_KINDS),
        ]
        probes.append(Probe("tool" if causal else "tool_mechanism", float(level), batch, units))
    return probes


# ------------------------------------------------------------------------------------------------ (b) revision
ACTIONS = ("improve", "maintain", "regress", "enable", "fix")
ACTION_PROBS = (0.3, 0.25, 0.15, 0.15, 0.15)
IMPROVE, MAINTAIN, REGRESS, ENABLE, FIX = range(len(ACTIONS))
LEVELS = (0.0, 0.5, 1.0)
STEP, TURNS = 0.5, 5


def revision_step(score: Tensor, enabled: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
    """One turn of the process, elementwise, on the verifier's score s in {0, 0.5, 1} and an ``enabled`` flag:
    improve ``min(s + 0.5, 1)``, maintain ``s``, regress ``max(s - 0.5, 0)``, enable ``s`` (and sets the flag),
    fix ``1`` once enabled, else ``s``."""
    s = torch.where(action == IMPROVE, (score + STEP).clamp_max(1.0), score)
    s = torch.where(action == REGRESS, (score - STEP).clamp_min(0.0), s)
    s = torch.where((action == FIX) & enabled, torch.ones_like(s), s)
    return s, enabled | (action == ENABLE)


def simulate(actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(score after each turn, score before, enabled before)``, each [B, K], from s = 0, not enabled (a loop
    over the K turns, vectorised over rollouts)."""
    score, enabled = torch.zeros(len(actions), dtype=torch.float64), torch.zeros(len(actions), dtype=torch.bool)
    after, before, enabled_before = [], [], []
    for k in range(actions.shape[1]):
        before.append(score)
        enabled_before.append(enabled)
        score, enabled = revision_step(score, enabled, actions[:, k])
        after.append(score)
    return torch.stack(after, 1), torch.stack(before, 1), torch.stack(enabled_before, 1)


def true_effects(actions: Tensor) -> Tensor:
    """``effect[i, k] = s_K(a_i) - s_K(a_i with a_ik := maintain)``: the exact change of the outcome (the final
    clean score) that turn k's action made, every other action held fixed. [B, K] float64."""
    final = simulate(actions)[0][:, -1]
    effects = []
    for k in range(actions.shape[1]):
        kept = actions.clone()
        kept[:, k] = MAINTAIN
        effects.append(final - simulate(kept)[0][:, -1])
    return torch.stack(effects, 1)


def observe(clean: Tensor, noise: float, u: Tensor, draw: Tensor, levels: Sequence[float]) -> Tensor:
    """The measured values: ``levels[draw]`` where ``u < noise``, else ``clean`` (common random numbers ``u``,
    ``draw`` across noise levels, so a higher level replaces a superset)."""
    return torch.where(u < noise, torch.tensor(levels, dtype=clean.dtype)[draw], clean)


class RevisionSampler:
    """The experience layer for :class:`~lit_credit.rollout.augment.CounterfactualTurns` (``score=verifier``)
    on a revision batch: an alternative of turn k is an action drawn from :data:`ACTION_PROBS` (the policy of
    the batch), and the verifier scores it from the rollout's state before turn k (``row["before"][k]``) with
    the batch's verifier noise, from its own ``random.Random(seed)``. Only what the augmenter calls with
    ``score=verifier`` (``sampling``, ``sample``, ``verify``) exists."""

    def __init__(self, noise: float, seed: int) -> None:
        self.noise, self.rng = noise, random.Random(seed)
        self.sampling = SamplingParams(n=4)

    def sample(self, prompts: list[list[int]], sampling: SamplingParams, seeds: list[int] | None = None
               ) -> list[list[Completion]]:
        return [[Completion([REPLY + _history(p)[1]], [math.log(ACTION_PROBS[ACTIONS.index(a)])], a)
                 for a in self.rng.choices(ACTIONS, ACTION_PROBS, k=sampling.n)] for p in prompts]

    def verify(self, row: dict[str, Any], turn: int, reply: str, prefix: Any = None, seed: int = 0) -> Feedback:
        score, enabled = row["before"][turn]
        after = revision_step(torch.tensor([score], dtype=torch.float64), torch.tensor([enabled]),
                              torch.tensor([ACTIONS.index(reply)]))[0].item()
        if self.rng.random() < self.noise:
            after = self.rng.choice(LEVELS)
        return Feedback(done=False, score=after)


def revision_probes(groups: int, seed: int, *, noises: Sequence[float] = NOISES,
                    actions: Tensor | None = None, group_size: int = GROUP_SIZE) -> list[Probe]:
    """One probe per noise level: ``groups`` x ``group_size`` episodes of :data:`TURNS` turns (every turn
    reached: the episode goes on after a success, as ``task.stop_on_success=false``), actions drawn from
    :data:`ACTION_PROBS` (or ``actions`` [B, K] given), per-turn verifier scores observed with the level's noise
    (``batch.turn_scores``), the outcome by ``FinalTurnReward`` (the last turn's observed score), TCPO's
    alternatives by ``CounterfactualTurns(score="verifier")`` with its defaults and a :class:`RevisionSampler`.
    Unit ``turn``: truth :func:`true_effects`."""
    g = torch.Generator().manual_seed(seed)
    n = groups * group_size
    if actions is None:
        actions = torch.multinomial(torch.tensor(ACTION_PROBS), n * TURNS, True, generator=g).view(n, TURNS)
    n, k = actions.shape
    after, before, enabled = simulate(actions)
    effects = true_effects(actions)
    lengths = torch.randint(6, 21, (n, k), generator=g)
    u, draw = torch.rand(n, k, generator=g, dtype=torch.float64), torch.randint(len(LEVELS), (n, k), generator=g)
    logp = torch.tensor(ACTION_PROBS).log()[actions]
    reward = FinalTurnReward()
    probes = []
    for level in noises:
        observed = observe(after, level, u, draw, LEVELS)
        episodes, results = [], []
        for i in range(n):
            row = {"id": f"revision:{i // group_size}",
                   "before": list(zip(before[i].tolist(), enabled[i].tolist()))}
            ep = Trajectory(row=row, group=i // group_size, token_ids=[PROMPT + i] * 12)
            for t in range(k):
                m = int(lengths[i, t])
                ep.add_reply(Completion([REPLY + t] * m, [float(logp[i, t])] * m, ACTIONS[int(actions[i, t])]), t)
                ep.turn_scores.append(float(observed[i, t]))
                if t < k - 1:
                    ep.add_feedback([FEEDBACK + t] * 8)
            episodes.append(ep)
            results.append(reward(row, ep.replies, turn_scores=ep.turn_scores))
        batch = to_batch(episodes, results, PAD)
        CounterfactualTurns(score="verifier", seed=seed)(batch, RevisionSampler(level, seed))
        of_token = torch.where(batch.response_mask.bool(), torch.arange(n)[:, None] * k + batch.turn_ids, -1)
        units = Units("turn", of_token, effects.flatten(), batch.group_ids.repeat_interleave(k),
                      actions.flatten(), ACTIONS, effect=True)
        probes.append(Probe("revision", float(level), batch, [units]))
    return probes


# ------------------------------------------------------------------------------------------------ (c) decision
VERIFIER_KINDS = ("x right", "x wrong")
PAIR_KINDS = ("x right, z right", "x right, z wrong", "x wrong, z right", "x wrong, z wrong", "no revision")


def decision_truth(x_right: Tensor, z_right: Tensor, has_revision: Tensor) -> dict[str, Tensor]:
    """The true quality of both canonical actions of each decision ([N, 2], 1 = the final value is right),
    in the column order of the pair rewards: verifier (SAC, NS) = (x wrong, x right); approver (KEEP, REVISE)
    = (x right, z right if a revision is parsable else x right: REVISE without one submits x); reviser (keep
    text, revise text) = (x right, z right and parsable)."""
    z = z_right & has_revision
    return {"verifier": torch.stack([~x_right, x_right], 1).double(),
            "approver": torch.stack([x_right, torch.where(has_revision, z, x_right)], 1).double(),
            "reviser": torch.stack([x_right, z], 1).double()}


def decision_probes(decisions: int, seed: int, *, noises: Sequence[float] = NOISES) -> list[Probe]:
    """Three probes (verifier, approver, reviser pairs) per noise level: ``decisions`` decisions with x right
    with probability 0.5, a parsable revision with 0.85 and z right with 0.5; the pair rewards of the form
    game (``verifier_pair_rewards``, ``approver_pair_rewards``, ``reviser_pair_rewards``, official defaults)
    from the oracle's view of x and z at the level's noise; each pair one group of two rows
    (:func:`~lit_credit.rollout.roles.action_batch`), as a DPA role batch."""
    g = torch.Generator().manual_seed(seed)
    x_right, has_revision = torch.rand(decisions, generator=g) < 0.5, torch.rand(decisions, generator=g) < 0.85
    z_right = (torch.rand(decisions, generator=g) < 0.5) & has_revision
    u = torch.rand(2, decisions, generator=g, dtype=torch.float64)
    coin = torch.rand(2, decisions, generator=g) < 0.5
    truth = decision_truth(x_right, z_right, has_revision)
    situation = torch.where(x_right, 0, 2) + (~z_right).long()
    situation = torch.where(has_revision, situation, len(PAIR_KINDS) - 1)
    kinds = {"verifier": ((~x_right).long(), VERIFIER_KINDS), "approver": (situation, PAIR_KINDS),
             "reviser": (situation, PAIR_KINDS)}
    groups = torch.arange(decisions).repeat_interleave(2)
    prompts, actions = [[PROMPT + i // 2] * 8 for i in range(2 * decisions)], [[REPLY] * 4] * (2 * decisions)
    probes = []
    for level in noises:
        x_seen = torch.where(u[0] < level, coin[0], x_right)
        z_seen = torch.where(u[1] < level, coin[1], z_right) & has_revision
        rewards = {"verifier": verifier_pair_rewards(x_seen),
                   "approver": approver_pair_rewards(x_seen, z_seen, has_revision),
                   "reviser": reviser_pair_rewards(x_seen, z_seen, has_revision)}
        for role, pair in rewards.items():
            batch = action_batch(prompts, actions, groups.tolist(), pair.flatten().tolist(), PAD)
            of_token = torch.where(batch.response_mask.bool(), torch.arange(2 * decisions)[:, None], -1)
            kind, names = kinds[role]
            probes.append(Probe("decision", float(level), batch, [
                Units(role, of_token, truth[role].flatten(), groups, kind.repeat_interleave(2), names)]))
    return probes


# ------------------------------------------------------------------------------------------------ estimators
@dataclass(frozen=True)
class Case:
    """One estimator setting: a display ``name``, the registered ``estimator`` and its keyword arguments."""

    name: str
    estimator: str
    kwargs: dict = field(default_factory=dict)

    def make(self) -> credit.CreditEstimator:
        return credit.get(self.estimator)(**self.kwargs)


TCPO_LADDER = ("trajectory", "turn", "diff", "retro", "retro_hindsight")  # the registered default is "tcpo"
VARIANTS = {"tool": [Case("slca_tcpo[tcpo]", "slca_tcpo", {"preset": "tcpo"})],
            "tool_mechanism": [Case("slca_tcpo[tcpo]", "slca_tcpo", {"preset": "tcpo"})],
            "revision": [Case(f"tcpo[{p}]", "tcpo", {"preset": p}) for p in TCPO_LADDER]}
_DPA_ON_TOOL = ("DPA credit normalises the two canonical actions of one decision (a pair); these groups are n "
                "sampled rollouts of a prompt, on which it is GRPO with the population std")
NOT_APPLICABLE = {
    ("dpa", "tool"): _DPA_ON_TOOL,
    ("dpa", "tool_mechanism"): _DPA_ON_TOOL,
    ("dpa", "revision"): "DPA credit normalises the two canonical actions of one decision (a pair); these groups "
                         "are n sampled episodes of a prompt, on which it is GRPO with the population std",
}


def cases(family: str) -> list[Case]:
    """Every registered estimator with its defaults (``credit.available()``), each followed by the family's
    variants of it (:data:`VARIANTS`: TCPO's ablation ladder, SLCA x TCPO with counterfactuals)."""
    out = []
    for name in credit.available():
        out += [Case(name, name), *[c for c in VARIANTS.get(family, []) if c.estimator == name]]
    return out


def evaluate(probes: Sequence[Probe]) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """``(results, not_applicable)``: a row per (probe, estimator case, unit type) with :func:`score_units`'
    scores, and a row per (family, case) that does not apply, with the reason (the estimator's ``ValueError``
    on the family's batch, or :data:`NOT_APPLICABLE`)."""
    results: list[dict[str, Any]] = []
    skipped: dict[tuple[str, str], str] = {}
    for probe in probes:
        for case in cases(probe.family):
            key = (probe.family, case.name)
            reason = skipped.get(key) or NOT_APPLICABLE.get((case.estimator, probe.family))
            if reason is None:
                try:
                    advantages = case.make()(probe.batch).advantages
                except ValueError as err:
                    reason = str(err)
            if reason is not None:
                skipped[key] = reason
                continue
            for units in probe.units:
                results.append({"family": probe.family, "unit": units.name, "estimator": case.name,
                                "noise": probe.noise, **score_units(units, advantages)})
    results = [r for r in results if (r["family"], r["estimator"]) not in skipped]
    return results, [{"family": f, "estimator": e, "reason": r} for (f, e), r in skipped.items()]


def run(size: str = "small", seed: int = 0) -> dict[str, Any]:
    """The whole benchmark at ``size`` (:data:`SIZES`): ``{"settings", "results", "not_applicable"}``."""
    if size not in SIZES:
        raise ValueError(f"--size {size!r}: use one of {', '.join(SIZES)}")
    s = SIZES[size]
    rows = tool_rows(s.tool_groups, seed)
    judges = {p: KnownQualityJudge(noise=p, seed=seed) for p in NOISES}
    specs = tool_specs(rows, seed)
    probes = [*tool_probes(rows, specs, judges, seed=seed, causal=True), *tool_probes(rows, specs, judges, seed=seed),
              *revision_probes(s.revision_groups, seed), *decision_probes(s.decisions, seed)]
    results, not_applicable = evaluate(probes)
    settings = {"size": size, "seed": seed, "noises": list(NOISES), "group_size": GROUP_SIZE,
                "tool_groups": s.tool_groups, "revision_groups": s.revision_groups, "decisions": s.decisions,
                "kinds": list(KINDS), "kind_probs": list(KIND_PROBS), "actions": list(ACTIONS),
                "action_probs": list(ACTION_PROBS), "turns": TURNS}
    return {"settings": settings, "results": results, "not_applicable": not_applicable}


# ------------------------------------------------------------------------------------------------ report
TITLES = {"tool": "(a) tool calling: truth = the calls' correctness and a summary that depends on them; process "
                  "score and judge both noisy",
          "tool_mechanism": "(a') tool calling, mechanism check (built-in winner: the truth is SLCA's own input): "
                            "HierR's clean process score, an independent summary rating, judge noise only",
          "revision": "(b) multi-turn revision: a synthetic process, verifier noise",
          "decision": "(c) DPA decisions: both canonical actions scored, oracle noise"}
KIND_TABLES = (("tool", "tool_turn"), ("tool_mechanism", "tool_turn"), ("revision", "turn"), ("decision", "approver"))


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _order(report: dict[str, Any], family: str) -> list[str]:
    names = [c.name for c in cases(family)]
    return [n for n in names if any(r["family"] == family and r["estimator"] == n for r in report["results"])]


def markdown(report: dict[str, Any]) -> str:
    """The report as markdown: per family a table (rows: unit type x estimator; a column per noise level; a
    cell ``spearman / sign``, plus ``/ sign0`` on effects and ``/ leak`` on units with judge noise), the n/a
    estimators with their reasons, and the sign agreement by kind at noise 0."""
    results, noises = report["results"], report["settings"]["noises"]
    cell = {(r["family"], r["unit"], r["estimator"], r["noise"]): r for r in results}
    out = []
    for family in FAMILIES:
        units = list(dict.fromkeys(r["unit"] for r in results if r["family"] == family))
        if not units:
            continue
        first = next(r for r in results if r["family"] == family)
        legend = "spearman / sign" + (" / sign0" if "sign0" in first else "")
        out += [f"### {TITLES[family]}", "",
                f"Cells: {legend}" + (" (/ leak on tool units)" if family.startswith("tool") else "") + ".", "",
                "| unit | estimator | " + " | ".join(f"noise {p:g}" for p in noises) + " |",
                "|---|---|" + "---:|" * len(noises)]
        for unit in units:
            for name in _order(report, family):
                cells = []
                for p in noises:
                    r = cell[(family, unit, name, p)]
                    text = f"{_f(r['spearman'])} / {_f(r['sign'])}"
                    text += f" / {_f(r['sign0'])}" if "sign0" in r else ""
                    text += f" / {_f(r['leak'])}" if "leak" in r else ""
                    cells.append(text)
                out.append(f"| {unit} | {name} | " + " | ".join(cells) + " |")
        out.append("")
        se = {r["unit"]: r["leak_se"] for r in results if r["family"] == family and r.get("leak_se")}
        if se:
            out += ["leak's standard error when the credit does not depend on the judge noise: "
                    + ", ".join(f"{u} {v:.3f}" for u, v in se.items()) + ".", ""]
        for na in report["not_applicable"]:
            if na["family"] == family:
                out.append(f"- n/a `{na['estimator']}`: {na['reason']}")
        out.append("")
    for family, unit in KIND_TABLES:
        rows = [r for r in results if r["family"] == family and r["unit"] == unit and r["noise"] == 0.0]
        if not rows:
            continue
        kinds = list(rows[0]["sign_by_kind"])
        key = "sign0_by_kind" if "sign0_by_kind" in rows[0] else "sign_by_kind"
        out += [f"Sign agreement by kind, {family} / {unit}, noise 0 ({key.removesuffix('_by_kind')}):", "",
                "| estimator | " + " | ".join(kinds) + " |", "|---|" + "---:|" * len(kinds)]
        by_name = {r["estimator"]: r for r in rows}
        out += [f"| {n} | " + " | ".join(_f(by_name[n][key][k]) for k in kinds) + " |"
                for n in _order(report, family)]
        out.append("")
    return "\n".join(out)


PANELS = (("tool", "tool", "spearman", "(a) tool segment: Spearman(credit, share of right calls)"),
          ("tool_mechanism", "tool", "leak", "(a') mechanism check, tool segment: leakage of judge noise"),
          ("revision", "turn", "spearman", "(b) revision turns: Spearman(credit, true effect)"),
          ("decision", None, "sign", "(c) DPA credit: sign agreement with the right action"))


def plot(report: dict[str, Any]):
    """A 2 x 2 matplotlib Figure (pyplot-free) of the main scores against the noise level: (a) tool-segment
    Spearman and leakage per estimator, (b) turn Spearman per estimator, (c) DPA's sign agreement per role."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 8.5), dpi=110)
    axes = fig.subplots(2, 2).flatten()
    results = report["results"]
    for ax, (family, unit, metric, title) in zip(axes, PANELS):
        if unit is None:  # one line per role, DPA's credit
            lines = {u: [r for r in results if r["family"] == family and r["unit"] == u and r["estimator"] == "dpa"]
                     for u in dict.fromkeys(r["unit"] for r in results if r["family"] == family)}
        else:
            lines = {n: [r for r in results if r["family"] == family and r["unit"] == unit and r["estimator"] == n]
                     for n in _order(report, family)}
        for i, (label, rows) in enumerate(lines.items()):
            points = [(r["noise"], r[metric]) for r in rows if r.get(metric) is not None]
            if points:  # line styles cycle, so estimators that coincide (GRPO, RLOO, Dr.GRPO) stay visible
                ax.plot(*zip(*points), marker="os^D"[i % 4], ls=("-", "--", ":", "-.")[i % 4], lw=1.2,
                        ms=4, label=label)
        ax.axhline(0.0, color="grey", lw=0.6)
        ax.set_xticks(report["settings"]["noises"])
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("noise level", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return fig


__all__ = ["FAMILIES", "NOISES", "SIZES", "Case", "KnownQualityJudge", "Probe", "ToolSpec", "Units",
           "cases", "decision_probes", "evaluate", "leakage", "markdown", "measured", "plot",
           "revision_probes", "right_share", "run", "score_units", "sign_agreement", "simulate",
           "summary_rating", "tool_probes", "tool_rows", "tool_specs", "true_effects", "unit_credit",
           "within_group_spearman"]


def main(argv: list[str] | None = None) -> dict:
    return ground_truth_main("credit_quality", sys.modules[__name__], __doc__, argv,
                             "how many groups each family draws (small: seconds, full: the documented run)",
                             "seed of every draw (rows, kinds, noise, actions)")


if __name__ == "__main__":
    main()
