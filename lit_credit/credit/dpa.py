"""DPA-GRPO paired counterfactual advantages (docs/methods.md §3).

At every decision both canonical actions ({SAC, NS} for the verifier, {KEEP, REVISE} for the approver)
are scored; the pair is a group of two normalised with the population std.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_credit.credit.groups import group_normalize
from lit_credit.credit.registry import CreditEstimator, check_batch, register
from lit_credit.credit.tokens import rollout_credit
from lit_credit.types import CreditOutput, RolloutBatch


def dpa_pair_advantages(rewards: Tensor, *, eps: float = 1e-8) -> Tensor:
    """``A = (r - mean) / (std_pop + eps)`` within each pair: +1 / -1 (up to eps), 0 on a tie.

    Shape:
        rewards: [N, 2] (row n = the two canonical actions of decision n). Output: [N, 2].
    """
    pair = torch.arange(len(rewards), device=rewards.device)[:, None].expand_as(rewards)
    return group_normalize(rewards, pair, eps=eps, unbiased=False)


@register("dpa")
class DPACredit(CreditEstimator):
    """Sequence-level DPA credit: ``batch.scores`` normalised within each ``batch.group_ids`` group (a pair
    of canonical actions) with the population std, ``A = (r - mean) / (std_pop + eps)``, on every learnable
    token of the action sequence."""

    def __init__(self, *, eps: float = 1e-8) -> None:
        self.eps = eps

    def __call__(self, batch: RolloutBatch) -> CreditOutput:
        check_batch(batch, {"batch.scores": batch.scores})
        adv = group_normalize(batch.scores, batch.group_ids, eps=self.eps, unbiased=False)
        return rollout_credit(adv, batch.response_mask, batch.group_ids)
