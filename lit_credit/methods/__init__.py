from lit_credit.methods.grpo import GRPOModule
from lit_credit.methods.slca_grpo import SLCAGRPOModule
from lit_credit.methods.tcpo import TCPOModule

__all__ = ["GRPOModule", "SLCAGRPOModule", "TCPOModule"]
