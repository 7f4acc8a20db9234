"""GRPO / Dr.GRPO credit and DAPO's overlong shaping (docs/methods.md §0-§1).

``A_i = Norm_{g(i)}(R_i)`` on every learnable token of rollout i, with the group normalisation ``Norm_G`` of
:func:`~lit_credit.credit.groups.group_normalize`.
"""

from __future__ import annotations

from torch import Tensor

from lit_credit.credit.groups import group_normalize
from lit_credit.credit.registry import CreditEstimator, check_batch, register
from lit_credit.credit.tokens import rollout_credit, true_frac
from lit_credit.types import CreditOutput, RolloutBatch


def grpo_advantages(
    scores: Tensor, response_mask: Tensor, group_ids: Tensor, *, eps: float = 1e-6, norm_by_std: bool = True,
    unbiased: bool = True,
) -> CreditOutput:
    """GRPO: ``A_i = Norm_{g(i)}(R_i)`` on every learnable token of rollout i, 0 elsewhere.

    ``norm_by_std=False`` is Dr.GRPO (``A_i = R_i - mean_{g(i)} R``). Singleton groups get 0.
    ``unbiased`` picks the std of ``Norm``: Bessel-corrected ``sqrt(sum_G (R - mean)^2 / (|G| - 1))`` (the
    default), or the population std ``sqrt(sum_G (R - mean)^2 / |G|)`` with ``unbiased=False`` (the DPA-GRPO
    paper's baselines: a group of two scores [1, 0] gets +-0.5 / (0.5 + eps) = +-1, not +-0.707).
    Metrics: ``credit/adv_mean|adv_std|adv_abs_max`` over learnable tokens and
    ``credit/zero_variance_group_frac`` (groups where every rollout gets 0).

    Shape:
        scores: [B], response_mask: [B, T] (1 = learnable), group_ids: [B].
        Output advantages: [B, T]; ``parts["rollout"]``: [B].
    """
    adv = group_normalize(scores, group_ids, eps=eps, norm_by_std=norm_by_std, unbiased=unbiased)
    return rollout_credit(adv, response_mask, group_ids)


class OverlongPenalty:
    """DAPO's soft overlong punishment (DAPO paper, Eq. 13; verl's ``reward_model.overlong_buffer``).

    With ``L_max = max_len`` and ``L_cache = cache`` (default ``max(1, round(cache_frac * max_len))``; the
    paper's 4096 of 20480 is ``cache_frac = 0.2``), a response of ``|y|`` tokens gets

        ``R_len(y) = 0``                                     if ``|y| <= L_max - L_cache``,
        ``R_len(y) = factor * ((L_max - L_cache) - |y|) / L_cache``  if ``L_max - L_cache < |y| <= L_max``,
        ``R_len(y) = -factor``                               if ``|y| > L_max``,

    added to its reward before the group normalisation (``factor`` 1: verl's ``overlong_penalty_factor``).
    ``L_max = 10, L_cache = 2``: 8 tokens 0, 9 tokens -0.5, 10 tokens -1.

    Shape:
        lengths: [B] (any dtype). Output: [B] float32, in [-factor, 0].
    """

    def __init__(self, *, max_len: int, cache: int | None = None, cache_frac: float = 0.2,
                 factor: float = 1.0) -> None:
        if max_len < 1:
            raise ValueError(f"credit.overlong.max_len={max_len}: must be >= 1 (the generation limit, "
                             "data.sampling.max_new_tokens)")
        cache = max(1, round(cache_frac * max_len)) if cache is None else cache
        if not 1 <= cache <= max_len:
            raise ValueError(f"credit.overlong.cache={cache}: must be in [1, max_len={max_len}]")
        self.max_len, self.cache, self.factor = int(max_len), int(cache), float(factor)

    def __call__(self, lengths: Tensor) -> Tensor:
        exceed = (lengths.float() - (self.max_len - self.cache)).clamp(0, self.cache)
        return -self.factor * exceed / self.cache


def shaped_scores(batch: RolloutBatch, overlong: OverlongPenalty | None) -> tuple[Tensor, dict[str, float]]:
    """``batch.scores`` plus ``overlong`` of each rollout's length ``|y|`` = its learnable (policy-generated)
    tokens, ``response_mask.sum(1)``; and the metrics ``credit/overlong_frac`` (share of rollouts with a
    penalty) and ``credit/overlong_penalty_mean``. Without ``overlong``: the scores and no metric."""
    if overlong is None:
        return batch.scores, {}
    penalty = overlong(batch.response_mask.sum(1)).to(batch.scores.dtype)
    return batch.scores + penalty, {"credit/overlong_frac": true_frac(penalty < 0),
                                    "credit/overlong_penalty_mean": penalty.mean().item()}


@register("grpo")
class GRPOCredit(CreditEstimator):
    """:func:`grpo_advantages` of ``batch.scores``; ``unbiased=False``: population std (see there).

    ``overlong``: DAPO's soft overlong punishment (:class:`OverlongPenalty`) added to the scores first
    (:func:`shaped_scores`; ``credit/overlong=dapo``, on in the DAPO experiments); None: off."""

    def __init__(self, *, norm_by_std: bool = True, eps: float = 1e-6, unbiased: bool = True,
                 overlong: OverlongPenalty | None = None) -> None:
        self.norm_by_std = norm_by_std
        self.eps = eps
        self.unbiased = unbiased
        self.overlong = overlong

    def __call__(self, batch: RolloutBatch) -> CreditOutput:
        check_batch(batch, {"batch.scores": batch.scores})
        scores, metrics = shaped_scores(batch, self.overlong)
        out = grpo_advantages(
            scores, batch.response_mask, batch.group_ids, eps=self.eps, norm_by_std=self.norm_by_std,
            unbiased=self.unbiased,
        )
        out.metrics.update(metrics)
        return out


@register("dr_grpo")
class DrGRPOCredit(GRPOCredit):
    """Dr.GRPO: :class:`GRPOCredit` without the std division (``A_i = R_i - mean_{g(i)} R``)."""

    def __init__(self, *, norm_by_std: bool = False, eps: float = 1e-6,
                 overlong: OverlongPenalty | None = None) -> None:
        super().__init__(norm_by_std=norm_by_std, eps=eps, overlong=overlong)
