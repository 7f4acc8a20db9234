"""SLCA-GRPO: segment-level credit for the tool calls vs. the final summary (docs/methods.md §1), and ToolPO.

ToolPO (``credit=toolpo``) is the official baseline's computation; ``credit=toolpo_process`` is ToolPO's form
with HierR's score and process score.

A rollout's learnable tokens form runs separated by environment-injected (mask 0) tokens. With >= 2 runs
the last run is the summary and every earlier run is the tool (process) segment; a single run is the
summary alone (so a rollout that ends on a tool call reads that call as its summary: documented, not a
bug). Tool calls and summary then get separate group-normalised advantages, so a badly judged summary no
longer punishes correct tool calls.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from lit_credit.credit.groups import group_normalize, zero_group_frac
from lit_credit.credit.registry import CreditEstimator, check_batch, register, require_parts
from lit_credit.credit.tokens import row_blocks, segment_metrics, true_frac
from lit_credit.types import CreditOutput, RolloutBatch


def segment_masks(response_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Split the learnable tokens into the tool segment and the summary segment.

    Runs = maximal stretches of ``response_mask == 1``. 0 runs: both masks empty. 1 run: summary only.
    >= 2 runs: the last run is the summary, all earlier runs the tool segment.

    Shape:
        response_mask: [B, T]. Output: (tool_mask [B, T] bool, summary_mask [B, T] bool), disjoint,
        their union the response mask.
    """
    tool, summary, _, _ = segments(response_mask)
    return tool, summary


def segments(response_mask: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`segment_masks` plus the per-row token counts ``(n_tool, n_sum)`` [B] float.

    Per row block (:func:`~lit_credit.credit.tokens.row_blocks`), with positions counted from 1: a run
    starts at p where ``m[p] > m[p - 1]`` (or p = 1 with ``m[1]``); the last run's start is
    ``p_start = max(start * p)`` (0 without runs), the summary is ``m & (p >= p_start)``, the tool segment
    ``m ^ summary``; ``n_sum`` counts the summary, ``n_tool = sum_t response_mask - n_sum``."""
    n = response_mask.sum(1, dtype=torch.float32)
    tool = torch.empty(response_mask.shape, dtype=torch.bool, device=response_mask.device)
    summary, n_sum = torch.empty_like(tool), torch.zeros_like(n)
    if tool.shape[1] == 0:
        return tool, summary, n, n_sum
    pos = torch.arange(1, tool.shape[1] + 1, dtype=torch.int32, device=tool.device)
    for rows in row_blocks(tool.shape):
        block, last = response_mask[rows].bool(), summary[rows]
        m, starts = block.view(torch.uint8), torch.empty_like(block)
        starts[:, 0] = block[:, 0]
        torch.gt(m[:, 1:], m[:, :-1], out=starts[:, 1:])
        start = (starts.view(torch.uint8) * pos).amax(1, keepdim=True)
        torch.ge(pos, start, out=last)
        last &= block
        n_sum[rows] = last.view(torch.uint8).sum(1, dtype=torch.int32).to(n.dtype)
        torch.bitwise_xor(block, last, out=tool[rows])
    return tool, summary, n - n_sum, n_sum


def omission_guard(
    tool_score: Tensor, summary_score: Tensor, score_total: Tensor | None, should_call_but_no_call: Tensor | None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Step 2 of docs/methods.md §1: where ``should_call_but_no_call`` or ``score_total < 0``, the tool
    score(s) become 0 and the summary score becomes ``score_total``. Returns (tool, summary, omitted flags [B]
    or None when neither input is given).

    Shape:
        tool_score: [B] or [B, K] (per tool turn); summary_score, score_total, should_call_but_no_call: [B].
    """
    if should_call_but_no_call is not None and score_total is None:
        raise ValueError(
            "should_call_but_no_call needs score_total (the omission score becomes the summary score)"
        )
    omitted = None if score_total is None else score_total < 0
    if should_call_but_no_call is not None:
        omitted = omitted | should_call_but_no_call.bool()
    if omitted is None:
        return tool_score, summary_score, None
    rows = omitted.view(-1, *([1] * (tool_score.dim() - 1)))
    return torch.where(rows, 0, tool_score), torch.where(omitted, score_total, summary_score), omitted


@dataclass(kw_only=True)
class SLCASettings:
    """SLCA's settings, passed whole to :func:`slca_advantages` (and, with TCPO's, to
    :func:`~lit_credit.credit.slca_tcpo.slca_tcpo_advantages`). :class:`SLCACredit` is this dataclass, so each
    field is also the config key ``credit.<field>`` (conf/credit/slca.yaml, which a test holds to these fields
    and defaults): a setting is added here and in the YAML file, nowhere else.

    - ``w_process``, ``w_summary``: the weights of the tool (process) and summary segments' advantages,
      applied after normalisation; None: the reward's weight of that part (:meth:`segment_weights`), so the
      segments are weighted as the score is.
    - ``eps``: added to every group std divided by.
    - ``norm_by_std``: divide by the group's std (False: centre only).
    """

    w_process: float | None = None
    w_summary: float | None = None
    eps: float = 1e-6
    norm_by_std: bool = True

    def segment_weights(self, reward_weights: Mapping[str, float] | None = None) -> tuple[float, float]:
        """``(w_process, w_summary)``: each as set, or where None the reward's weight of that part
        (``reward_weights``: ``batch.reward_weights``, HierR's ``w_process`` / ``w_summary``), 1.0 when the
        reward has none or none is given."""
        weights = reward_weights or {}
        return (weights.get("process", 1.0) if self.w_process is None else self.w_process,
                weights.get("summary", 1.0) if self.w_summary is None else self.w_summary)


def slca_advantages(
    process_score: Tensor,
    summary_score: Tensor,
    response_mask: Tensor,
    group_ids: Tensor,
    settings: SLCASettings | None = None,
    *,
    score_total: Tensor | None = None,
    should_call_but_no_call: Tensor | None = None,
    reward_weights: Mapping[str, float] | None = None,
) -> CreditOutput:
    """SLCA-GRPO token advantages, with the :class:`SLCASettings` ``settings``.

    1. ``s_tool = process``, ``s_sum = summary``.
    2. Omission guard: where ``should_call_but_no_call`` or ``score_total < 0``: ``s_tool = 0``,
       ``s_sum = score_total``.
    3. ``A_tool = Norm_{g(i)}(s_tool)`` over the group's rollouts with a tool segment, ``A_sum`` likewise
       over those with a summary segment; presence guard (< 2 present in a group -> 0); absent -> 0.
    4. ``A_tool *= w_process``, ``A_sum *= w_summary`` (after normalisation: before, it would cancel); a weight
       set to None is the reward's (``reward_weights``), 1.0 without one (:meth:`SLCASettings.segment_weights`).
    5. ``advantages = tool_mask * A_tool + summary_mask * A_sum`` (0 outside the response mask).

    Metrics: ``credit/adv_*`` over learnable tokens, ``credit/tool/adv_*`` and ``credit/summary/adv_*``
    over each segment, ``credit/omission_frac``, ``credit/tool_present_frac``,
    ``credit/{tool,summary}/zero_variance_group_frac``.

    Shape:
        process_score, summary_score, group_ids, score_total, should_call_but_no_call: [B];
        response_mask: [B, T]. Output advantages: [B, T]; ``parts["tool"]``, ``parts["summary"]``: [B].
    """
    settings = SLCASettings() if settings is None else settings
    tool_mask, summary_mask, n_tool, n_sum = segments(response_mask)
    s_tool, s_sum, omitted = omission_guard(process_score, summary_score, score_total, should_call_but_no_call)
    w_process, w_summary = settings.segment_weights(reward_weights)

    def norm(x: Tensor, present: Tensor) -> Tensor:
        return group_normalize(x, group_ids, present, eps=settings.eps, norm_by_std=settings.norm_by_std)

    has_tool = n_tool > 0
    a_tool, a_sum = w_process * norm(s_tool, has_tool), w_summary * norm(s_sum, n_sum > 0)
    tokens = torch.where(summary_mask, a_sum[:, None], 0)
    torch.where(tool_mask, a_tool[:, None], tokens, out=tokens)  # disjoint masks: one allocation
    metrics = {
        **segment_metrics(torch.stack([a_tool, a_sum], 1), torch.stack([n_tool, n_sum], 1)),
        **segment_metrics(a_tool, n_tool, "credit/tool/"),
        **segment_metrics(a_sum, n_sum, "credit/summary/"),
        "credit/omission_frac": 0.0 if omitted is None else true_frac(omitted),
        "credit/tool_present_frac": true_frac(has_tool),
        "credit/tool/zero_variance_group_frac": zero_group_frac(a_tool, group_ids),
        "credit/summary/zero_variance_group_frac": zero_group_frac(a_sum, group_ids),
    }
    return CreditOutput(tokens, {"tool": a_tool, "summary": a_sum}, metrics)


def toolpo_advantages(
    tool_score: Tensor,
    outcome: Tensor,
    response_mask: Tensor,
    group_ids: Tensor,
    *,
    lam: float = 1.0,
    eps: float = 1e-6,
    norm_by_std: bool = True,
) -> CreditOutput:
    """ToolPO: a GRPO advantage of the outcome everywhere plus a tool advantage on the tool tokens, as the
    official ``compute_toolpo_grpo_advantage`` (SLCA-GRPO ``verl/trainer/ppo/core_algos.py``) forms it.

    ``A_global = Norm_{g(i)}(outcome)`` over all rollouts of the group; ``A_tool = Norm_{g(i)}(tool_score)``
    over the group's rollouts with a tool segment (presence guard: < 2 present -> 0; absent -> 0). Tool
    tokens get ``A_global + lam * A_tool``, summary tokens ``A_global``; 0 outside the response mask. No
    omission guard (official). ``credit=toolpo`` passes the official inputs (outcome = the binary ``solved``,
    tool score = the strict ``toolpo_correct_ratio``), ``credit=toolpo_process`` HierR's score and its
    omission-guarded process score. One difference at a group of one rollout: ``Norm`` gives it
    ``A_global = 0``, the official code (verl's convention for a singleton: mean 0, std 1) its raw outcome.

    Shape:
        tool_score, outcome, group_ids: [B]; response_mask: [B, T].
        Output advantages: [B, T]; ``parts["rollout"]`` (A_global), ``parts["tool"]`` (A_tool): [B].
    """
    tool_mask, summary_mask, n_tool, n_sum = segments(response_mask)
    a_global = group_normalize(outcome, group_ids, eps=eps, norm_by_std=norm_by_std)
    a_tool = group_normalize(tool_score, group_ids, n_tool > 0, eps=eps, norm_by_std=norm_by_std)
    on_tool = a_global + lam * a_tool
    tokens = torch.where(summary_mask, a_global[:, None], 0)  # tool and summary tile the response mask
    torch.where(tool_mask, on_tool[:, None], tokens, out=tokens)
    metrics = {
        **segment_metrics(torch.stack([on_tool, a_global], 1), torch.stack([n_tool, n_sum], 1)),
        **segment_metrics(on_tool, n_tool, "credit/tool/"),
        "credit/tool_present_frac": true_frac(n_tool > 0),
        "credit/zero_variance_group_frac": zero_group_frac(a_global, group_ids),
        "credit/tool/zero_variance_group_frac": zero_group_frac(a_tool, group_ids),
    }
    return CreditOutput(tokens, {"rollout": a_global, "tool": a_tool}, metrics)


def toolpo_process_advantages(
    process_score: Tensor,
    score_total: Tensor,
    response_mask: Tensor,
    group_ids: Tensor,
    *,
    should_call_but_no_call: Tensor | None = None,
    lam: float = 1.0,
    eps: float = 1e-6,
    norm_by_std: bool = True,
) -> CreditOutput:
    """ToolPO with HierR's rewards (this project's earlier ``toolpo``, not the official computation):
    :func:`toolpo_advantages` with ``outcome = score_total`` (HierR's score) and ``tool_score`` = the process
    score after SLCA's omission guard (``s_tool = 0`` where ``should_call_but_no_call`` or
    ``score_total < 0``).

    Shape:
        process_score, score_total, group_ids, should_call_but_no_call: [B]; response_mask: [B, T].
        Output advantages: [B, T]; ``parts["rollout"]`` (A_global), ``parts["tool"]`` (A_tool): [B].
    """
    s_tool, _, omitted = omission_guard(process_score, score_total, score_total, should_call_but_no_call)
    out = toolpo_advantages(s_tool, score_total, response_mask, group_ids, lam=lam, eps=eps, norm_by_std=norm_by_std)
    out.metrics["credit/omission_frac"] = 0.0 if omitted is None else true_frac(omitted)
    return out


HIERR_FIX = "use reward=hierr (it returns process, summary and should_call_but_no_call) on a tool task"


def omission_checks(batch: RolloutBatch, keys: tuple[str, ...]) -> dict[str, Tensor]:
    """The :func:`~lit_credit.credit.registry.check_batch` entries of the SLCA family: the reward parts
    ``keys``, the total score (``reward_parts["score"]``, default ``batch.scores``) and the optional
    ``should_call_but_no_call``."""
    parts = batch.reward_parts
    names = [*keys, "should_call_but_no_call"] + (["score"] if "score" in parts else [])
    checks = {f"batch.reward_parts[{k!r}]": parts[k] for k in names if k in parts}
    return checks if "score" in parts else {**checks, "batch.scores": batch.scores}


@register("slca")
@dataclass(kw_only=True)
class SLCACredit(SLCASettings, CreditEstimator):
    """:func:`slca_advantages` of ``batch.reward_parts["process"]`` and ``["summary"]``; the estimator is its
    :class:`SLCASettings` (one keyword argument, and one ``credit.<field>`` key, per field).

    The omission guard reads ``reward_parts["score"]`` (default: ``batch.scores``, the total score) and the
    optional ``reward_parts["should_call_but_no_call"]``. ``w_process`` / ``w_summary``: None (default)
    follows the reward's weights (``batch.reward_weights``), so the segments are weighted as the score is.
    """

    def __call__(self, batch: RolloutBatch) -> CreditOutput:
        parts = batch.reward_parts
        require_parts(batch, ("process", "summary"), credit="slca", fix=HIERR_FIX)
        check_batch(batch, omission_checks(batch, ("process", "summary")))
        return slca_advantages(
            parts["process"],
            parts["summary"],
            batch.response_mask,
            batch.group_ids,
            self,
            score_total=parts.get("score", batch.scores),
            should_call_but_no_call=parts.get("should_call_but_no_call"),
            reward_weights=batch.reward_weights,
        )


TOOLPO_FIX = ("use reward=hierr (it returns ToolPO's toolpo_correct_ratio and solved) on a tool task, or "
              "credit=toolpo_process (HierR's score and process score)")


@register("toolpo")
class ToolPOCredit(CreditEstimator):
    """ToolPO as the official code computes it: :func:`toolpo_advantages` of the binary outcome
    ``reward_parts["solved"]`` (``R_succ``) and the strict correct-call ratio
    ``reward_parts["toolpo_correct_ratio"]`` (``R_action``; :func:`~lit_credit.rewards.hierr.strict_correct_ratio`),
    no omission guard. ``lam``: the official ``toolpo_lambda`` (1.0).
    """

    def __init__(self, *, lam: float = 1.0, eps: float = 1e-6, norm_by_std: bool = True) -> None:
        self.lam = lam
        self.eps = eps
        self.norm_by_std = norm_by_std

    def __call__(self, batch: RolloutBatch) -> CreditOutput:
        parts = batch.reward_parts
        keys = ("solved", "toolpo_correct_ratio")
        require_parts(batch, keys, credit="toolpo", fix=TOOLPO_FIX)
        check_batch(batch, {f"batch.reward_parts[{k!r}]": parts[k] for k in keys})
        return toolpo_advantages(parts["toolpo_correct_ratio"], parts["solved"], batch.response_mask,
                                 batch.group_ids, lam=self.lam, eps=self.eps, norm_by_std=self.norm_by_std)


@register("toolpo_process")
class ToolPOProcessCredit(ToolPOCredit):
    """:func:`toolpo_process_advantages` of ``reward_parts["process"]`` and the total score
    (``reward_parts["score"]``, default ``batch.scores``); optional ``reward_parts["should_call_but_no_call"]``.
    Not the official ToolPO (``credit=toolpo``): its tool advantage is built from HierR's process score.
    """

    def __call__(self, batch: RolloutBatch) -> CreditOutput:
        parts = batch.reward_parts
        require_parts(batch, ("process",), credit="toolpo_process", fix=HIERR_FIX)
        check_batch(batch, omission_checks(batch, ("process",)))
        return toolpo_process_advantages(
            parts["process"],
            parts.get("score", batch.scores),
            batch.response_mask,
            batch.group_ids,
            should_call_but_no_call=parts.get("should_call_but_no_call"),
            lam=self.lam,
            eps=self.eps,
            norm_by_std=self.norm_by_std,
        )


def credit_leakage(batch: RolloutBatch, advantages: torch.Tensor) -> float:
    """Cross-segment leakage: the Pearson correlation, over the rollouts with a tool segment, between the
    summary score (``reward_parts["summary"]``) and the rollout's mean tool-token advantage. High under GRPO
    (one advantage for both segments), near 0 under SLCA. NaN without a summary score, with fewer than 3
    such rollouts, or when either side is constant.
    """
    summary = batch.reward_parts.get("summary")
    if summary is None:
        return math.nan
    tool, _ = segment_masks(batch.response_mask)
    has_tool = tool.any(1)
    if has_tool.sum() < 3:
        return math.nan
    tool_adv = (advantages * tool).sum(1)[has_tool] / tool.sum(1)[has_tool]
    x, y = summary[has_tool].double(), tool_adv.double()
    x, y = x - x.mean(), y - y.mean()
    denom = (x.square().sum() * y.square().sum()).sqrt()
    return (x * y).sum().div(denom).item() if denom > 1e-12 else math.nan
