"""SLCA-GRPO: the GRPO module with segment credit (``credit=slca``) and HierR rewards; only metrics differ.
SLCA x TCPO (``credit=slca_tcpo``) adds TCPO's counterfactual resampling of tool turns."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lit_credit.credit.slca import segment_masks
from lit_credit.losses import aggregate
from lit_credit.methods.grpo import GRPOModule
from lit_credit.methods.tcpo import TCPOModule
from lit_credit.types import RolloutBatch


def step_exact_match(tool_exact: torch.Tensor, gold_steps: torch.Tensor) -> dict[int, float]:
    """Per gold step k (1-based): the share of the rollouts whose plan has at least k steps whose tool turn k
    exists and matches gold step k exactly; steps no rollout's plan reaches are left out.

    Shape:
        tool_exact: [B, K] float (1 = exact, 0 = not or no such turn), gold_steps: [B]. Output: {k: share}.
    """
    depth = int(gold_steps.max().item()) if len(gold_steps) else 0
    exact = torch.cat([tool_exact, tool_exact.new_zeros(len(tool_exact), max(depth - tool_exact.shape[1], 0))], 1)
    has_step = gold_steps[:, None] > torch.arange(depth)
    hits = ((exact[:, :depth] == 1) & has_step).sum(0)
    return {k + 1: (hits[k] / has_step[:, k].sum()).item() for k in range(depth)}


def irrelevant_call_rates(parts: dict[str, torch.Tensor], stage: str) -> dict[str, float]:
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


class SLCAGRPOModule(GRPOModule):
    """GRPO base + tool-calling metrics. The credit estimator (SLCA, GRPO or ToolPO) and the HierR reward
    are injected like any other; this class only adds what the SLCA paper reports:

    - ``<stage>/success@t``: share of rollouts with ``score / (w_process + w_summary) >= t`` for t in
      ``success_thresholds``: the official ``weighted_score_norm`` (the reward's weights; 1 when the reward
      has none), so with HierR's default weights ``success@0.7`` means a total score of at least 1.4;
    - ``<stage>/tool/exact_match``: share whose calls match gold names, keys and values exactly
      (``name = key = value = 1``; a no-call reply to an irrelevant prompt counts as exact);
    - ``<stage>/step{k}/exact_match``: per gold step, :func:`step_exact_match` of the per-turn
      ``tool_exact`` (multi-step plans: did tool turn k make exactly gold step k's calls);
    - ``<stage>/tool/irrelevant_call_rate`` and ``irrelevant_valid_call_rate``: on no-call prompts, the share
      of rollouts with any tool-call tag / a valid call (:func:`irrelevant_call_rates`);
    - ``slca/grad_cosine`` every ``grad_cosine_every`` steps: the cosine between the policy-loss gradients
      of the tool tokens and of the summary tokens (``L_seg`` = the loss with the advantage restricted to
      one segment), the cross-segment interference SLCA removes.
    """

    def __init__(self, *args, grad_cosine_every: int = 10,
                 success_thresholds: tuple[float, ...] = (0.7, 0.8, 0.9, 1.0), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.grad_cosine_every, self.success_thresholds = grad_cosine_every, tuple(success_thresholds)

    def rollout_metrics(self, batch: RolloutBatch, stage: str) -> dict[str, float]:
        logs = super().rollout_metrics(batch, stage)
        score_norm = batch.scores / self.score_scale()
        logs.update({f"{stage}/success@{t}": (score_norm >= t - 1e-9).float().mean().item()
                     for t in self.success_thresholds})
        parts = batch.reward_parts
        if {"name", "key", "value"} <= parts.keys():
            exact = (parts["name"] == 1) & (parts["key"] == 1) & (parts["value"] == 1)
            logs[f"{stage}/tool/exact_match"] = exact.float().mean().item()
        if {"tool_exact", "gold_steps"} <= parts.keys():
            steps = step_exact_match(parts["tool_exact"], parts["gold_steps"])
            logs.update({f"{stage}/step{k}/exact_match": v for k, v in steps.items()})
        logs.update(irrelevant_call_rates(parts, stage))
        return logs

    def score_scale(self) -> float:
        """``w_process + w_summary`` of the reward (HierR's top weights), the official score normaliser; 1 when
        the reward has no such weights or they do not sum to a positive number."""
        reward = getattr(getattr(self, "rollouts", None), "reward", None)
        total = getattr(reward, "w_process", None), getattr(reward, "w_summary", None)
        if any(not isinstance(w, (int, float)) for w in total) or sum(total) <= 0:
            return 1.0
        return float(sum(total))

    def credit_diagnostics(self, batch: RolloutBatch, advantages: torch.Tensor) -> dict[str, float]:
        if not self.grad_cosine_every or self.global_step % self.grad_cosine_every:
            return {}
        params = [p for p in self.policy.parameters() if p.requires_grad]
        logp = self._logprobs(self.policy, batch)[0]
        grads = []
        for segment in segment_masks(batch.response_mask):
            mask = batch.response_mask * segment
            per_token, _ = self.loss.surrogate(logp, logp.detach(), advantages, mask)
            loss = aggregate(per_token, mask, self.loss.aggregation, norm_length=self.loss.norm_length)
            g = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
            grads.append(torch.cat([(x if x is not None else torch.zeros_like(p)).flatten()
                                    for x, p in zip(g, params)]))
        if not all(g.norm() > 0 for g in grads):
            return {}
        return {"slca/grad_cosine": F.cosine_similarity(grads[0], grads[1], dim=0).item()}


class SLCATCPOModule(SLCAGRPOModule, TCPOModule):
    """SLCA-GRPO's metrics and diagnostics with TCPO's counterfactual resampling, for ``credit=slca_tcpo``
    (and its baselines ``credit=slca`` / ``grpo``, which leave the resampling off).

    With preset ``tcpo`` (``w_cf != 0``) the top ``cf_top_l`` tool turns per group (by ``cf_select``) are
    resampled ``cf_samples`` times from their exact history, and each alternative is scored by the reward's
    per-turn tool score against that turn's gold step (:meth:`~lit_credit.rewards.HierRReward.turn_score`).
    """

    def scored_turns(self, batch: RolloutBatch) -> torch.Tensor | None:
        mask = batch.reward_parts.get("tool_turn_mask")
        return None if mask is None else mask.bool()

    def score_alternative(self, row: dict, turn: int, reply: str) -> float:
        return self.rollouts.reward.turn_score(row, turn, reply)
