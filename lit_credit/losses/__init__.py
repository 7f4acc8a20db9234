"""Policy losses for GRPO-family RL: PPO / GSPO surrogates, KL estimators, loss aggregation modes.

Pure tensor code (any device, vectorised); see each object's docstring for its formula and shapes.
"""

from lit_credit.losses.aggregate import (
    AGGREGATION_MODES,
    AggregationMode,
    aggregate,
    aggregation_denominator,
    masked_mean,
)
from lit_credit.losses.kl import KL_ESTIMATORS, KLEstimator, kl_penalty
from lit_credit.losses.policy import PolicyLoss
from lit_credit.losses.surrogates import ClippedSurrogate, GSPOSurrogate, ReinforceSurrogate, Surrogate

__all__ = [
    "AGGREGATION_MODES",
    "KL_ESTIMATORS",
    "AggregationMode",
    "ClippedSurrogate",
    "GSPOSurrogate",
    "KLEstimator",
    "PolicyLoss",
    "ReinforceSurrogate",
    "Surrogate",
    "aggregate",
    "aggregation_denominator",
    "kl_penalty",
    "masked_mean",
]
