"""Pure, vectorised credit estimators and their registry (see docs/methods.md)."""

from lit_credit.credit.dpa import DPACredit, dpa_pair_advantages
from lit_credit.credit.groups import group_normalize, group_stats
from lit_credit.credit.grpo import DrGRPOCredit, GRPOCredit, OverlongPenalty, grpo_advantages
from lit_credit.credit.mt_grpo import MTGRPOCredit, mt_grpo_advantages
from lit_credit.credit.registry import CreditEstimator, available, get, register
from lit_credit.credit.rloo import RLOOCredit, rloo_advantages
from lit_credit.credit.slca import (
    SLCACredit,
    ToolPOCredit,
    ToolPOProcessCredit,
    credit_leakage,
    segment_masks,
    slca_advantages,
    toolpo_advantages,
    toolpo_process_advantages,
)
from lit_credit.credit.slca_tcpo import SLCATCPOCredit, slca_tcpo_advantages
from lit_credit.credit.tcpo import (
    TCPOCredit,
    counterfactual_credit,
    hindsight_credit,
    retrospective_credit,
    select_counterfactual_turns,
    tcpo_turn_advantages,
    turn_types,
    turns_to_tokens,
)

__all__ = [
    "CreditEstimator",
    "DPACredit",
    "DrGRPOCredit",
    "GRPOCredit",
    "MTGRPOCredit",
    "OverlongPenalty",
    "RLOOCredit",
    "SLCACredit",
    "SLCATCPOCredit",
    "TCPOCredit",
    "ToolPOCredit",
    "ToolPOProcessCredit",
    "available",
    "counterfactual_credit",
    "credit_leakage",
    "dpa_pair_advantages",
    "get",
    "group_normalize",
    "group_stats",
    "grpo_advantages",
    "hindsight_credit",
    "mt_grpo_advantages",
    "register",
    "retrospective_credit",
    "rloo_advantages",
    "segment_masks",
    "select_counterfactual_turns",
    "slca_advantages",
    "slca_tcpo_advantages",
    "tcpo_turn_advantages",
    "toolpo_advantages",
    "toolpo_process_advantages",
    "turn_types",
    "turns_to_tokens",
]
