"""The policy loss of every GRPO-family method: surrogate + KL penalty, aggregated."""

from __future__ import annotations

import torch
from torch import Tensor

from lit_credit.losses.aggregate import AGGREGATION_MODES, AggregationMode, aggregate, masked_mean
from lit_credit.losses.kl import KL_ESTIMATORS, KLEstimator, kl_penalty
from lit_credit.losses.surrogates import Surrogate


class PolicyLoss:
    r"""Clipped policy-gradient loss with an optional KL penalty to a frozen reference.

    ``loss = aggregate(l^surr + kl_coef * kl, mask, aggregation)`` where ``l^surr [B, T]`` comes from
    ``surrogate`` (:class:`ClippedSurrogate` or :class:`GSPOSurrogate`) and ``kl = kl_penalty(logp, ref_logp,
    kl_estimator)`` per token. Presets of docs/methods.md §0:

    - GRPO:    ``ClippedSurrogate(0.2)``, ``kl_coef > 0`` (e.g. 0.001), ``kl_estimator="k3"``.
    - Dr.GRPO: ``ClippedSurrogate(0.2)``, ``aggregation="seq-mean-token-sum-norm"`` (``norm_length`` =
      max response length), advantages without std normalisation (the credit estimator's job).
    - DAPO:    ``ClippedSurrogate(0.2, 0.28)``, ``aggregation="token-mean"``, ``kl_coef=0``.
    - GSPO:    ``GSPOSurrogate(3e-4, 4e-4)``, ``aggregation="seq-mean-token-mean"``.
    - verl's PPO loss: ``ClippedSurrogate(0.2, clip_ratio_c=3.0)`` (dual-clip; off in every preset here).

    The KL term is differentiated through ``logp`` only (``ref_logp`` is a constant input). Masked tokens
    (``mask == 0``) enter neither the loss nor the gradient, whatever their values (even NaN / inf).

    ``length_normalize`` (with ``aggregation="seq-mean-token-sum"`` only): each row's per-token loss is
    divided by its number of learnable tokens ``|y_i| = #{t : m_{i,t} != 0}`` first, so
    ``loss = (1/B) sum_i sum_t m_{i,t} (l^surr + kl_coef * kl)_{i,t} / |y_i|``: the mean per-token log-prob of
    an action instead of its sum (the later official DPA-GRPO, commit e68b47). A float mask's weight stays a
    weight (``seq-mean-token-mean`` would divide it out); an empty row is 0 and counts in B.

    Metrics (python floats, one device sync): ``loss/total`` (the returned loss), ``loss/policy``
    (the surrogate alone, same aggregation), ``loss/kl`` (token mean of the KL estimate over masked-in
    tokens; present whenever ``ref_logp`` is given, also with ``kl_coef = 0``), and the surrogate's
    ``loss/clip_frac``, ``loss/clip_frac_low``, ``loss/clip_frac_high``, ``loss/ratio_mean``,
    ``loss/ratio_min``, ``loss/ratio_max``, ``loss/ppo_kl`` (and ``loss/clip_frac_dual`` with dual-clip,
    ``clip_ratio_c``).

    Shape:
        logp: [B, T] log-probs of the sampled tokens under the policy being trained (requires grad).
        old_logp: [B, T] behaviour-policy log-probs. advantages: [B, T]. mask: [B, T].
        ref_logp: [B, T] reference-policy log-probs, or None.
        denominator: 0-dim, the aggregation's normaliser to use instead of this batch's (several processes:
            the whole minibatch's over the number of processes, ``losses.aggregation_denominator``), or None.
        output: (loss, a 0-dim tensor; metrics, dict[str, float]).

    Raises:
        ValueError: unknown ``aggregation`` / ``kl_estimator``, ``kl_coef < 0``, ``norm_length <= 0``,
            ``length_normalize`` with another aggregation than ``seq-mean-token-sum``, or (at call time)
            ``kl_coef > 0`` without ``ref_logp``, or mismatched shapes.
    """

    def __init__(
        self,
        surrogate: Surrogate,
        aggregation: AggregationMode = "token-mean",
        kl_coef: float = 0.0,
        kl_estimator: KLEstimator = "k3",
        norm_length: int | None = None,
        length_normalize: bool = False,
    ) -> None:
        if aggregation not in AGGREGATION_MODES:
            raise ValueError(
                f"unknown aggregation mode {aggregation!r}; valid modes: {', '.join(AGGREGATION_MODES)}"
            )
        if kl_estimator not in KL_ESTIMATORS:
            raise ValueError(
                f"unknown KL estimator {kl_estimator!r}; valid estimators: {', '.join(KL_ESTIMATORS)}"
            )
        if kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
        if norm_length is not None and norm_length <= 0:
            raise ValueError(f"norm_length must be a positive int or None, got {norm_length}")
        if length_normalize and aggregation != "seq-mean-token-sum":
            raise ValueError(f"length_normalize=True divides each row by its length, so it needs aggregation="
                             f"'seq-mean-token-sum', got {aggregation!r}")
        self.surrogate = surrogate
        self.aggregation = aggregation
        self.kl_coef = float(kl_coef)
        self.kl_estimator = kl_estimator
        self.norm_length = norm_length
        self.length_normalize = bool(length_normalize)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(surrogate={self.surrogate!r}, aggregation={self.aggregation!r}, "
            f"kl_coef={self.kl_coef}, kl_estimator={self.kl_estimator!r}, norm_length={self.norm_length}, "
            f"length_normalize={self.length_normalize})"
        )

    def __call__(
        self,
        logp: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        mask: Tensor,
        ref_logp: Tensor | None = None,
        denominator: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, float]]:
        if self.kl_coef > 0 and ref_logp is None:
            raise ValueError(f"kl_coef={self.kl_coef} > 0 needs `ref_logp` (reference-policy log-probs)")
        per_token, surrogate_metrics = self.surrogate(logp, old_logp, advantages, mask)
        stats: dict[str, Tensor] = {}
        total = per_token
        if ref_logp is not None:
            if ref_logp.shape != logp.shape:
                raise ValueError(
                    f"ref_logp {tuple(ref_logp.shape)} must have the shape of logp {tuple(logp.shape)}"
                )
            valid = mask != 0
            zeros = torch.zeros_like(logp)
            policy_logp = logp if self.kl_coef > 0 else logp.detach()
            kl = kl_penalty(
                torch.where(valid, policy_logp, zeros), torch.where(valid, ref_logp, zeros), self.kl_estimator
            )
            if self.kl_coef > 0:
                total = per_token + self.kl_coef * kl
            stats["loss/kl"] = masked_mean(kl.detach(), valid)
        if self.length_normalize:
            lengths = (mask != 0).sum(-1, keepdim=True).clamp(min=1).to(per_token.dtype)  # |y_i|, 1 if empty
            per_token, total = per_token / lengths, total / lengths
        loss = aggregate(total, mask, self.aggregation, norm_length=self.norm_length, denominator=denominator)
        stats["loss/total"] = loss.detach()
        stats["loss/policy"] = aggregate(
            per_token.detach(), mask, self.aggregation, norm_length=self.norm_length, denominator=denominator
        )
        stats.update({f"loss/{name}": value for name, value in surrogate_metrics.items()})
        dtype = torch.float32 if logp.device.type == "mps" else torch.float64  # MPS has no float64
        values = torch.stack([v.detach().reshape(()).to(dtype) for v in stats.values()]).tolist()
        return loss, dict(zip(stats, values, strict=True))
