"""RLOO, the leave-one-out baseline (docs/extending.md: the worked example of a new method).

``A_i = R_i - mean_{j in g(i), j != i} R_j = |G| / (|G| - 1) * (R_i - mean_G R)``: each rollout's reward
against the mean of the other rollouts of its prompt, on every learnable token. A group of one gets 0.
"""
from __future__ import annotations

import torch

from lit_credit.credit.groups import group_stats
from lit_credit.credit.registry import CreditEstimator, check_batch, register
from lit_credit.credit.tokens import rollout_credit
from lit_credit.types import CreditOutput, RolloutBatch


def rloo_advantages(scores: torch.Tensor, response_mask: torch.Tensor, group_ids: torch.Tensor) -> CreditOutput:
    """``A_i = |G| / (|G| - 1) * (R_i - mean_G R)`` broadcast to rollout i's learnable tokens (0 for ``|G| < 2``).

    Shape:
        scores: [B], response_mask: [B, T], group_ids: [B]. Output advantages: [B, T]; ``parts["rollout"]``: [B].
    """
    centred, _, count = group_stats(scores, group_ids)
    adv = torch.where(count >= 2, centred * count / (count - 1).clamp_min(1), 0)
    return rollout_credit(adv, response_mask, group_ids)


@register("rloo")
class RLOOCredit(CreditEstimator):
    """:func:`rloo_advantages` of ``batch.scores`` (``credit=rloo``)."""

    def __call__(self, batch: RolloutBatch) -> CreditOutput:
        check_batch(batch, {"batch.scores": batch.scores})
        return rloo_advantages(batch.scores, batch.response_mask, batch.group_ids)
