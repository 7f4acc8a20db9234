"""MT-GRPO: turn reward plus outcome reward, each group-normalised (docs/methods.md §0).

Reading of "tokens of turns before the first verifier result": the verifier first speaks after turn 0
(the first assistant turn), so turn 0's tokens are the only ones before it. They get
``A_out + c * A_turn`` with the turn reward = turn 0's score; tokens of every later turn get ``A_out``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_credit.credit.groups import group_normalize, zero_group_frac
from lit_credit.credit.registry import CreditEstimator, check_batch, register
from lit_credit.credit.tcpo import turns_to_tokens
from lit_credit.credit.tokens import moment_metrics, token_moments
from lit_credit.types import CreditOutput, RolloutBatch


def mt_grpo_advantages(
    turn_score: Tensor,
    outcome_score: Tensor,
    turn_ids: Tensor,
    group_ids: Tensor,
    *,
    turn_present: Tensor | None = None,
    policy: Tensor | None = None,
    c: float = 1.0,
    eps: float = 1e-6,
    norm_by_std: bool = True,
) -> CreditOutput:
    """``A_turn = Norm_{g(i)}(turn_score)`` (over rollouts with ``turn_present``), ``A_out =
    Norm_{g(i)}(outcome_score)``; tokens of turn 0 get ``A_out + c * A_turn``, tokens of turns >= 1 get
    ``A_out``, tokens with ``turn_ids == -1`` or outside ``policy`` (default: all tokens) get 0. Metrics:
    ``credit/adv_*`` over the policy tokens (default: those with ``turn_ids >= 0``).

    Shape:
        turn_score, outcome_score, group_ids, turn_present (bool): [B]; turn_ids: [B, T] long, -1 off the
        policy tokens; policy: [B, T] bool or 0 / 1. Output advantages: [B, T]; ``parts["turn"]``,
        ``parts["outcome"]``: [B].
    """
    a_turn = group_normalize(turn_score, group_ids, turn_present, eps=eps, norm_by_std=norm_by_std)
    a_out = group_normalize(outcome_score, group_ids, eps=eps, norm_by_std=norm_by_std)
    tokens = turns_to_tokens(torch.stack([a_out + c * a_turn, a_out], 1), turn_ids, policy, repeat_last=True)
    counted = (turn_ids >= 0).sum() if policy is None else policy.sum()
    metrics = {
        **moment_metrics(token_moments(tokens, counted)),
        "credit/zero_variance_group_frac": zero_group_frac(a_out, group_ids),
        "credit/turn/zero_variance_group_frac": zero_group_frac(a_turn, group_ids),
    }
    return CreditOutput(tokens, {"turn": a_turn, "outcome": a_out}, metrics)


@register("mt_grpo")
class MTGRPOCredit(CreditEstimator):
    """:func:`mt_grpo_advantages` with turn reward ``batch.turn_scores[:, 0]`` (present where
    ``batch.turn_mask[:, 0]``), outcome reward ``batch.scores`` and ``batch.turn_ids`` (read only on the
    response mask, so tokens with ``response_mask == 0`` get 0 whatever their turn id)."""

    def __init__(self, *, c: float = 1.0, eps: float = 1e-6, norm_by_std: bool = True) -> None:
        self.c = c
        self.eps = eps
        self.norm_by_std = norm_by_std

    def __call__(self, batch: RolloutBatch) -> CreditOutput:
        if batch.turn_scores is None or batch.turn_mask is None:
            raise ValueError("credit=mt_grpo needs per-turn verifier scores (batch.turn_scores and "
                             "batch.turn_mask): use a task whose environment scores every turn "
                             "(task=math_revise or task=code_revise)")
        check_batch(batch, {"batch.scores": batch.scores,
                            "batch.turn_scores": (batch.turn_scores[:, :1], batch.turn_mask[:, :1])})
        return mt_grpo_advantages(
            batch.turn_scores[:, 0],
            batch.scores,
            batch.turn_ids,
            batch.group_ids,
            turn_present=batch.turn_mask[:, 0],
            policy=batch.response_mask,
            c=self.c,
            eps=self.eps,
            norm_by_std=self.norm_by_std,
        )
