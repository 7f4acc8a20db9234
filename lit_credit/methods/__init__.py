from lit_credit.methods.grpo import GRPOModule
from lit_credit.methods.slca_grpo import SLCAGRPOModule

__all__ = ["GRPOModule", "SLCAGRPOModule"]
