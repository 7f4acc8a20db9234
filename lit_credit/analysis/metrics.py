"""Rollout metrics of a batch: the shared ones (:func:`batch_metrics`) and the metric sets a method adds by
config (``metrics=tool``: :class:`ToolMetrics`, ``metrics=turn``: :class:`TurnMetrics`), the pass@k of a sampled
validation (:func:`pass_at_k`, :func:`pass_at_k_metrics`), and the segment gradient cosine of SLCA's diagnostics
(:func:`segment_grad_cosine`, :func:`gradient_cosine`)."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from lit_credit.credit.groups import nonzero_variance_groups
from lit_credit.credit.slca import segment_masks
from lit_credit.distributed import all_reduce_sum
from lit_credit.losses import PolicyLoss, aggregate
from lit_credit.types import RolloutBatch


def batch_metrics(batch: RolloutBatch, stage: str) -> dict[str, float]:
    """Every method's rollout metrics under ``<stage>/``: reward mean and std, the mean of each [B] reward
    part (``reward/<part>``), the share of zero-variance groups, the mean response length and the share of
    rollouts whose last turn hit the token limit (``truncated``)."""
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


def step_exact_match(tool_exact: torch.Tensor, gold_steps: torch.Tensor) -> dict[int, float]:
    """Per gold step k (1-based): the share of the rollouts whose plan has at least k steps whose tool turn k
    exists and matches gold step k exactly; steps no rollout's plan reaches are left out.

    Shape:
        tool_exact: [B, K] float (1 = exact, 0 = not or no such turn), gold_steps: [B]. Output: {k: share}.
    """
    depth = int(gold_steps.max().item()) if len(gold_steps) else 0
    exact = torch.cat([tool_exact, tool_exact.new_zeros(len(tool_exact), max(depth - tool_exact.shape[1], 0))], 1)
    has_step = gold_steps[:, None] > torch.arange(depth, device=gold_steps.device)
    hits = ((exact[:, :depth] == 1) & has_step).sum(0)
    return {k + 1: (hits[k] / has_step[:, k].sum()).item() for k in range(depth)}


def irrelevant_call_rates(parts: Mapping[str, torch.Tensor], stage: str) -> dict[str, float]:
    """Tool calls where none is due: over the rollouts of no-call prompts (``gold_steps == 0``, the
    irrelevant subset), the share with any tool-call tag (``<stage>/tool/irrelevant_call_rate``, debris
    included) and the share with a valid call (``<stage>/tool/irrelevant_valid_call_rate``). The first rising
    in a run is the reward hack of tool-call debris on no-call prompts; {} when the batch has no such prompt
    or the reward gives no ``tool_tag``/``valid_call`` parts.

    Shape:
        parts["gold_steps"], parts["tool_tag"], parts["valid_call"]: [B] float.
    """
    if not {"gold_steps", "tool_tag"} <= parts.keys():
        return {}
    no_call = parts["gold_steps"] == 0
    if not no_call.any():
        return {}
    logs = {f"{stage}/tool/irrelevant_call_rate": parts["tool_tag"][no_call].float().mean().item()}
    if "valid_call" in parts:
        logs[f"{stage}/tool/irrelevant_valid_call_rate"] = parts["valid_call"][no_call].float().mean().item()
    return logs


def score_scale(reward_weights: Mapping[str, float]) -> float:
    """``w_process + w_summary`` of the reward (HierR's ``part_weights``), the official score normaliser; 1 when
    the reward has no such weights or they do not sum to a positive number."""
    total = reward_weights.get("process"), reward_weights.get("summary")
    if any(w is None for w in total) or sum(total) <= 0:
        return 1.0
    return float(sum(total))


def pass_at_k(successes: torch.Tensor, n: int) -> torch.Tensor:
    """The unbiased pass@k estimator (Chen et al., 2021) of each prompt, for k = 1..n, from its ``c``
    successes among ``n`` samples:

        pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{j=0}^{k-1} (n - c - j) / (n - j)

    (a factor ``n - c - j <= 0`` is clamped to 0: C(n - c, k) = 0 once k > n - c, so pass@k = 1). The products
    are one ``cumprod`` over j, so column k - 1 holds pass@k.

    Shape:
        successes: [P] success counts (0..n). Output: [P, n] float64.
    """
    j = torch.arange(n, dtype=torch.float64, device=successes.device)
    factors = ((n - successes.double()[:, None] - j) / (n - j)).clamp_min(0.0)
    return 1.0 - factors.cumprod(1)


def pass_at_k_metrics(batch: RolloutBatch, success: float, stage: str) -> dict[str, float]:
    """``<stage>/pass@k`` for k = 1..n: the mean over the batch's prompts (its groups, n rollouts each) of
    :func:`pass_at_k`, where a rollout succeeds when its normalised score reaches ``success``:
    ``score / score_scale >= success`` (:func:`score_scale`: ``w_process + w_summary`` for HierR, else 1; so
    ``success = 1`` is the top score of every shipped reward). ``pass@1`` is the success rate of the samples.

    Raises ValueError when the groups do not all hold the same number of rollouts.
    """
    solved = (batch.scores.cpu() / score_scale(batch.reward_weights) >= success - 1e-9).double()
    _, group = torch.unique(batch.group_ids.cpu(), return_inverse=True)
    sizes = torch.bincount(group)
    n = int(sizes[0])
    if not (sizes == n).all():
        raise ValueError(f"pass@k needs n rollouts per prompt; the batch's groups hold {sorted(set(sizes.tolist()))}")
    successes = torch.zeros(len(sizes), dtype=torch.float64).index_add_(0, group, solved)
    values = pass_at_k(successes, n).mean(0)
    return {f"{stage}/pass@{k + 1}": v for k, v in enumerate(values.tolist())}


class ToolMetrics:
    """What the SLCA paper reports on tool calling (``metrics=tool``):

    - ``<stage>/success@t``: share of rollouts with ``score / (w_process + w_summary) >= t`` for t in
      ``success_thresholds``: the official ``weighted_score_norm`` (:func:`score_scale` of the batch's
      ``reward_weights``), so with HierR's default weights ``success@0.7`` means a total score of at least 1.4;
    - ``<stage>/tool/exact_match``: share whose calls match gold names, keys and values exactly
      (``name = key = value = 1``; a no-call reply to an irrelevant prompt counts as exact);
    - ``<stage>/step{k}/exact_match``: per gold step, :func:`step_exact_match` of the per-turn
      ``tool_exact`` (``turn_parts``: did tool turn k make exactly gold step k's calls);
    - ``<stage>/tool/irrelevant_call_rate`` and ``irrelevant_valid_call_rate`` (:func:`irrelevant_call_rates`).
    """

    def __init__(self, success_thresholds: Sequence[float] = (0.7, 0.8, 0.9, 1.0)) -> None:
        self.success_thresholds = tuple(success_thresholds)

    def __call__(self, batch: RolloutBatch, stage: str, context: Mapping[str, Any]) -> dict[str, float]:
        score_norm = batch.scores / score_scale(batch.reward_weights)
        logs = {f"{stage}/success@{t}": (score_norm >= t - 1e-9).float().mean().item()
                for t in self.success_thresholds}
        parts = batch.reward_parts
        if {"name", "key", "value"} <= parts.keys():
            exact = (parts["name"] == 1) & (parts["key"] == 1) & (parts["value"] == 1)
            logs[f"{stage}/tool/exact_match"] = exact.float().mean().item()
        if "tool_exact" in batch.turn_parts and "gold_steps" in parts:
            steps = step_exact_match(batch.turn_parts["tool_exact"], parts["gold_steps"])
            logs.update({f"{stage}/step{k}/exact_match": v for k, v in steps.items()})
        logs.update(irrelevant_call_rates(parts, stage))
        return logs


def turn_metrics(turn_scores: torch.Tensor, turn_mask: torch.Tensor, success: float = 1.0,
                 max_turns: int = 1) -> dict[str, float]:
    """Multi-turn outcome metrics of a batch, with ``hit[i, k] = r[i, k] >= success`` on reached turns:

    - ``pass@turn{k}`` (k = 1..max(max_turns, K)): share of rollouts with a hit among their first k turns
      (best-turn pass rate; a rollout that ended earlier keeps its value);
    - ``success``: share of rollouts whose final turn is a hit (the outcome ``reward=final_turn`` scores;
      equal to ``pass@turn{K}`` when episodes stop at the first success);
    - ``regress_after_success``: share of rollouts with a hit at some turn and a final turn that is not one
      (``pass@turn{K} - success``);
    - ``maintain_rate``: share of the turns that follow a rollout's first hit that are hits again (NaN when no
      turn follows a hit, e.g. with ``task.stop_on_success=true``);
    - ``turns_to_success``: mean 1-based index of the first hit over the rollouts with one (NaN when none);
    - ``turns``: mean turns taken.

    Shape:
        turn_scores: [B, K] float, turn_mask: [B, K] bool (a prefix of the K turns per rollout).
    """
    mask = turn_mask.bool()
    hit = (turn_scores >= success - 1e-9) & mask
    seen = hit.cummax(1).values  # a hit at some turn t <= k
    within = seen.float()
    within = torch.cat([within, within[:, -1:].expand(-1, max(max_turns - within.shape[1], 0))], 1)
    solved = seen[:, -1]
    final = hit.gather(1, (mask.sum(1, keepdim=True) - 1).clamp_min(0)).squeeze(1)
    after = torch.cat([torch.zeros_like(seen[:, :1]), seen[:, :-1]], 1) & mask  # turns after the first hit
    first = hit.float().argmax(1) + 1.0
    return {**{f"pass@turn{k + 1}": within[:, k].mean().item() for k in range(within.shape[1])},
            "success": final.float().mean().item(),
            "regress_after_success": (solved & ~final).float().mean().item(),
            "maintain_rate": ((hit & after).sum() / after.sum()).item() if after.any() else float("nan"),
            "turns_to_success": first[solved].mean().item() if solved.any() else float("nan"),
            "turns": mask.sum(1).float().mean().item()}


class TurnMetrics:
    """Multi-turn outcome metrics (``metrics=turn``): :func:`turn_metrics` of the environment's per-turn
    verifier scores under ``<stage>/`` (``pass@turn{k}`` for k up to the environment's ``max_turns``,
    ``success``, ``regress_after_success``, ``maintain_rate``, ``turns_to_success``, ``turns``); {} for a
    batch without turn scores. A turn scoring ``>= success`` solves the problem."""

    def __init__(self, success: float = 1.0) -> None:
        self.success = success

    def __call__(self, batch: RolloutBatch, stage: str, context: Mapping[str, Any]) -> dict[str, float]:
        if batch.turn_scores is None:
            return {}
        metrics = turn_metrics(batch.turn_scores, batch.turn_mask, self.success, context.get("max_turns", 1))
        return {f"{stage}/{k}": v for k, v in metrics.items()}


def segment_grad_cosine(loss: PolicyLoss, logp: torch.Tensor, advantages: torch.Tensor,
                        response_mask: torch.Tensor, params: Sequence[torch.nn.Parameter]) -> float | None:
    """The cosine between the policy-loss gradients of the tool tokens and of the summary tokens, ``cos(g_tool,
    g_summary)`` with ``g_seg = grad L_seg`` and ``L_seg`` the loss's surrogate aggregated over one segment
    (:func:`~lit_credit.credit.slca.segment_masks`) at ratio 1 (``old = logp``): the cross-segment interference
    SLCA removes. None when a segment's gradient is 0 (no such tokens, or zero advantage)."""
    grads = []
    for segment in segment_masks(response_mask):
        mask = response_mask * segment
        per_token, _ = loss.surrogate(logp, logp.detach(), advantages, mask)
        value = aggregate(per_token, mask, loss.aggregation, norm_length=loss.norm_length)
        g = torch.autograd.grad(value, params, retain_graph=True, allow_unused=True)
        grads.append(torch.cat([(x if x is not None else torch.zeros_like(p)).flatten() for x, p in zip(g, params)]))
    if not all(g.norm() > 0 for g in grads):
        return None
    return F.cosine_similarity(grads[0], grads[1], dim=0).item()


def gradient_cosine(a: torch.Tensor, b: torch.Tensor) -> float | None:
    """``cos(g_a, g_b) = sum(a b) / sqrt(sum(a^2) sum(b^2))`` of two gradients given as this rank's parts (its
    shards under FSDP2), each sum over the ranks (:func:`~lit_credit.distributed.all_reduce_sum`; gradients that
    every rank holds whole, as under DDP, scale all three sums alike). None when either gradient is 0."""
    dot, aa, bb = all_reduce_sum(torch.stack([(a * b).sum(), (a * a).sum(), (b * b).sum()]).double()).tolist()
    return dot / math.sqrt(aa * bb) if aa > 0 and bb > 0 else None
