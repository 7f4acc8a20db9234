"""SLCA x TCPO: SLCA-GRPO's segments, with TCPO turn credit inside the tool segment (docs/methods.md §4).

SLCA gives the whole tool segment one scalar, so a right first call and a wrong second call get the same
credit; TCPO gives turn credit but knows no segments. Both are pure functions of the same records, so here
the summary keeps SLCA's advantage and each tool turn gets a TCPO credit computed from per-turn tool scores
(``tool_scores`` [B, K]: turn k's calls scored against gold step k, see
:func:`lit_credit.rewards.hierr.tool_turn_scores`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from lit_credit.credit.groups import group_normalize, zero_group_frac
from lit_credit.credit.registry import CreditEstimator, check_batch, register, require_parts
from lit_credit.credit.slca import SLCASettings, omission_checks, omission_guard, segments
from lit_credit.credit.tcpo import (
    Normalize,
    Preset,
    TCPOSettings,
    counterfactual_inputs,
    counterfactual_needs,
    tcpo_turn_advantages,
    turn_credit_metrics,
    turns_to_tokens,
)
from lit_credit.credit.tokens import merge_moments, moment_metrics, segment_moments, token_moments, true_frac
from lit_credit.types import CreditOutput, RolloutBatch


@dataclass(kw_only=True)
class SLCATCPOSettings(SLCASettings, TCPOSettings):
    """SLCA x TCPO's settings, passed whole to :func:`slca_tcpo_advantages`: TCPO's
    (:class:`~lit_credit.credit.tcpo.TCPOSettings`, for the tool turns) and SLCA's
    (:class:`~lit_credit.credit.slca.SLCASettings`, the segment weights and the summary's ``norm_by_std``), one
    ``eps`` for both. :class:`SLCATCPOCredit` is this dataclass, so each field is also the config key
    ``credit.<field>`` (conf/credit/slca_tcpo.yaml, which a test holds to these fields and defaults).

    Two defaults differ from TCPO's:

    - ``preset``: ``retro_hindsight`` (``tcpo`` adds counterfactual tool turns, ``augment=counterfactual_tool``);
    - ``normalize``: ``turn_mean_std``, a tool turn's credit centred against the same turn of the group's other
      rollouts. ``std``, TCPO's default, scales ``c / (std_G c + eps)`` over the group's tool turns without
      centring, which with ``r0 = 0`` credits every first call its own score: HierR's 0.4 floor for a
      well-formed single call on a one-call step then gives a worse-than-group first call a positive credit.
    """

    preset: Preset = "retro_hindsight"
    normalize: Normalize = "turn_mean_std"


def slca_tcpo_advantages(
    tool_scores: Tensor,
    tool_turn_mask: Tensor,
    summary_score: Tensor,
    response_mask: Tensor,
    turn_ids: Tensor,
    group_ids: Tensor,
    settings: SLCATCPOSettings | None = None,
    *,
    score_total: Tensor | None = None,
    should_call_but_no_call: Tensor | None = None,
    alt_scores: Tensor | None = None,
    cf_mask: Tensor | None = None,
    reward_weights: Mapping[str, float] | None = None,
) -> CreditOutput:
    """Composed token advantages: SLCA on the summary, TCPO turn credit on each tool turn, with the
    :class:`SLCATCPOSettings` ``settings``.

    1. Segments from the mask (:func:`~lit_credit.credit.slca.segment_masks`): the last learnable run is
       the summary, every earlier run (assistant turn k, by ``turn_ids``) is tool turn k.
    2. Omission guard (SLCA step 2): where ``should_call_but_no_call`` or ``score_total < 0``, every tool
       score of the rollout is 0 and ``s_sum = score_total``.
    3. Summary: ``A_sum = w_summary * Norm_{g(i)}(s_sum)`` over the group's rollouts with a summary
       (presence guard), exactly SLCA's.
    4. Tool turns: ``A_turn[i, k] = w_process * TCPO(tool_scores, tool_turn_mask)[i, k]`` with TCPO's
       ``preset`` (:func:`~lit_credit.credit.tcpo.tcpo_turn_advantages`; default ``retro_hindsight``:
       ``c = w_retro * retro + w_hind * hind``, ``+ w_cf * cf`` with preset ``tcpo`` and ``alt_scores``),
       normalised by ``normalize`` (default ``turn_mean_std``: ``Norm`` of c within each (group, turn index)
       cell); ``w_process`` after scaling, as in SLCA. A segment weight set to None is the reward's
       (``reward_weights``), 1.0 without one (:meth:`~lit_credit.credit.slca.SLCASettings.segment_weights`).
    5. ``advantages = tool_mask * A_turn[i, turn_ids] + summary_mask * A_sum`` (0 outside the response mask).

    Reduction: with one tool turn per rollout whose score is the rollout's process score and turn credit
    off (``preset="trajectory"``: ``A = Norm_{g(i)}`` of the last tool turn's score over the rollouts with a
    tool turn), this is :func:`~lit_credit.credit.slca.slca_advantages` exactly.

    Metrics: ``credit/adv_*``, ``credit/tool/adv_*``, ``credit/summary/adv_*``, ``credit/omission_frac``,
    ``credit/tool_present_frac``, ``credit/tool_turns`` (mean tool turns per rollout),
    ``credit/summary/zero_variance_group_frac``, and over the tool turns ``credit/turn_type/*`` and
    ``credit/turn/{k}/adv_mean`` (:func:`~lit_credit.credit.tcpo.turn_credit_metrics`).

    Shape:
        tool_scores: [B, K] float, tool_turn_mask: [B, K] bool (a prefix of the turns), summary_score,
        group_ids, score_total, should_call_but_no_call: [B]; response_mask, turn_ids: [B, T];
        alt_scores: [B, K, M] (NaN where not sampled), cf_mask: [B, K]. Output advantages: [B, T];
        ``parts["turn"]`` (A_turn) [B, K], ``parts["summary"]`` (A_sum) [B].
    """
    settings = SLCATCPOSettings() if settings is None else settings
    tool_mask, summary_mask, n_tool, n_sum = segments(response_mask)
    mask = tool_turn_mask.bool()
    s_turn, s_sum, omitted = omission_guard(tool_scores, summary_score, score_total, should_call_but_no_call)
    w_process, w_summary = settings.segment_weights(reward_weights)
    a_sum = w_summary * group_normalize(s_sum, group_ids, n_sum > 0, eps=settings.eps,
                                        norm_by_std=settings.norm_by_std)
    a_turn = w_process * tcpo_turn_advantages(s_turn, mask, group_ids, settings, alt_scores=alt_scores,
                                              cf_mask=cf_mask)
    tokens = turns_to_tokens(a_turn, turn_ids, tool_mask)  # tool tokens off the K turns get 0
    tool = token_moments(tokens, n_tool.sum())
    summary = segment_moments(a_sum, n_sum)
    torch.where(summary_mask, a_sum[:, None], tokens, out=tokens)
    metrics = {
        **moment_metrics(merge_moments(tool, summary)),
        **moment_metrics(tool, "credit/tool/"),
        **moment_metrics(summary, "credit/summary/"),
        "credit/omission_frac": 0.0 if omitted is None else true_frac(omitted),
        "credit/tool_present_frac": true_frac(mask.any(1)),
        "credit/tool_turns": mask.sum(1).float().mean().item(),
        "credit/summary/zero_variance_group_frac": zero_group_frac(a_sum, group_ids),
        **turn_credit_metrics(a_turn, s_turn, mask, settings.tau, settings.r0),
    }
    return CreditOutput(tokens, {"turn": a_turn, "summary": a_sum}, metrics)


@register("slca_tcpo")
@dataclass(kw_only=True)
class SLCATCPOCredit(SLCATCPOSettings, CreditEstimator):
    """:func:`slca_tcpo_advantages` of the reward's per-turn tool scores ``batch.turn_parts["tool_scores"]``
    and ``["tool_turn_mask"]`` ([B, K], from :class:`~lit_credit.rewards.HierRReward`), its parts
    ``reward_parts["summary"]``, the omission inputs ``["score"]`` (default ``batch.scores``) and
    ``["should_call_but_no_call"]``, and, when the preset uses counterfactuals (:attr:`needs`), TCPO's
    ``batch.extras["alt_scores"]`` / ``["cf_mask"]`` (added by ``augment=counterfactual_tool``).

    The estimator is its :class:`SLCATCPOSettings` (one keyword argument, and one ``credit.<field>`` key, per
    field); segment weights set to None follow the reward's (``batch.reward_weights``).
    """

    @property
    def needs(self) -> frozenset[str]:
        """``{"alt_scores", "cf_mask"}`` with preset ``tcpo`` and ``w_cf != 0`` (counterfactual tool turns,
        ``augment=counterfactual_tool``), else empty."""
        return counterfactual_needs(self.preset, self.w_cf)

    def __call__(self, batch: RolloutBatch) -> CreditOutput:
        fix = ("use reward=hierr on a tool task (task=toolcall_multistep): it returns the summary and the "
               "per-turn tool scores")
        require_parts(batch, ("tool_scores", "tool_turn_mask"), credit="slca_tcpo", fix=fix,
                      field="turn_parts")
        require_parts(batch, ("summary",), credit="slca_tcpo", fix=fix)
        alt, cf_mask, alt_check = counterfactual_inputs(
            batch, self.needs, credit="slca_tcpo", fix="augment=counterfactual_tool (TCPO's resampled tool "
            "turns), or credit.preset=retro_hindsight / credit.w_cf=0 (no counterfactual term)")
        parts, turns = batch.reward_parts, batch.turn_parts
        tool_scores = (turns["tool_scores"], turns["tool_turn_mask"])
        check_batch(batch, {"batch.turn_parts['tool_scores']": tool_scores, **omission_checks(batch, ("summary",)),
                            **alt_check})
        return slca_tcpo_advantages(
            turns["tool_scores"],
            turns["tool_turn_mask"],
            parts["summary"],
            batch.response_mask,
            batch.turn_ids,
            batch.group_ids,
            self,
            score_total=parts.get("score", batch.scores),
            should_call_but_no_call=parts.get("should_call_but_no_call"),
            alt_scores=alt,
            cf_mask=cf_mask,
            reward_weights=batch.reward_weights,
        )
