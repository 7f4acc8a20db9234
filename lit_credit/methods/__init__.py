from lit_credit.methods.grpo import GRPOModule

__all__ = ["GRPOModule"]
