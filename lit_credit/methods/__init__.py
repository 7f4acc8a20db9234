from lit_credit.methods.base import PolicyModule
from lit_credit.methods.dpa_grpo import DPAGRPOModule
from lit_credit.methods.grpo import GRPOModule
from lit_credit.methods.named import SLCAGRPOModule, SLCATCPOModule, TCPOModule

__all__ = ["DPAGRPOModule", "GRPOModule", "PolicyModule", "SLCAGRPOModule", "SLCATCPOModule", "TCPOModule"]
