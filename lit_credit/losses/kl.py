"""Per-token estimators of ``KL(pi || pi_ref)`` from log-probs of tokens sampled from ``pi``."""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

KLEstimator = Literal["k1", "k2", "k3"]
KL_ESTIMATORS: tuple[str, ...] = get_args(KLEstimator)


def kl_penalty(logp: Tensor, ref_logp: Tensor, estimator: KLEstimator = "k3") -> Tensor:
    r"""Per-token KL estimate (Schulman, "Approximating KL divergence", 2020).

    With ``d = ref_logp - logp = log(pi_ref(y_t) / pi(y_t))`` and ``y_t ~ pi``:

    - ``k1 = logp - ref_logp = -d``                      (unbiased, can be negative, high variance)
    - ``k2 = 0.5 * (logp - ref_logp)^2 = 0.5 d^2``       (biased, >= 0, low variance)
    - ``k3 = exp(d) - d - 1``                            (unbiased, >= 0, low variance; GRPO's choice)

    ``k3`` is computed as ``expm1(d) - d`` (same value, exact near ``d = 0``). No clamping: ``k3``
    overflows only when ``ref_logp - logp`` exceeds ~88 (float32).
    Example: ``logp = -1, ref_logp = -2`` gives ``k1 = 1``, ``k2 = 0.5``, ``k3 = e^-1 = 0.3679``.

    Shape:
        logp, ref_logp: [B, T] (any shape, the same).
        output: same shape, elementwise; no masking here (callers aggregate with a mask).

    Raises:
        ValueError: unknown ``estimator`` (the message lists the valid ones) or shape mismatch.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; valid estimators: {', '.join(KL_ESTIMATORS)}")
    if logp.shape != ref_logp.shape:
        raise ValueError(f"kl_penalty: logp {tuple(logp.shape)} and ref_logp {tuple(ref_logp.shape)} differ")
    d = ref_logp - logp
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d.square()
    return torch.expm1(d) - d
