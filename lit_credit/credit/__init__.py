"""Pure, vectorised credit estimators and their registry (see docs/methods.md).

Every module of this package is imported with it (:func:`_import_every_module`), so an estimator file dropped
here registers itself (``@register``) without an edit to this file; the names below are the public API of the
shipped ones."""

import importlib
import pkgutil

from lit_credit.credit.dpa import DPACredit, dpa_pair_advantages
from lit_credit.credit.groups import group_normalize, group_stats
from lit_credit.credit.grpo import DrGRPOCredit, GRPOCredit, OverlongPenalty, grpo_advantages
from lit_credit.credit.mt_grpo import MTGRPOCredit, mt_grpo_advantages
from lit_credit.credit.registry import CreditEstimator, available, get, name_of, register, registration
from lit_credit.credit.rloo import RLOOCredit, rloo_advantages
from lit_credit.credit.slca import (
    SLCACredit,
    SLCASettings,
    ToolPOCredit,
    ToolPOProcessCredit,
    credit_leakage,
    segment_masks,
    slca_advantages,
    toolpo_advantages,
    toolpo_process_advantages,
)
from lit_credit.credit.slca_tcpo import SLCATCPOCredit, SLCATCPOSettings, slca_tcpo_advantages
from lit_credit.credit.tcpo import (
    TCPOCredit,
    TCPOSettings,
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
    "SLCASettings",
    "SLCATCPOCredit",
    "SLCATCPOSettings",
    "TCPOCredit",
    "TCPOSettings",
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
    "name_of",
    "register",
    "registration",
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


def _import_every_module() -> None:
    """Import each module of this package (the shipped ones are imported above already; a new one registers
    its estimators here)."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")


_import_every_module()
