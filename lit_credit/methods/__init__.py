from lit_credit.methods.dpa_grpo import DPAGRPOModule
from lit_credit.methods.grpo import GRPOModule
from lit_credit.methods.slca_grpo import SLCAGRPOModule, SLCATCPOModule
from lit_credit.methods.tcpo import TCPOModule

__all__ = ["DPAGRPOModule", "GRPOModule", "SLCAGRPOModule", "SLCATCPOModule", "TCPOModule"]
