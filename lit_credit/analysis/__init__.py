"""Credit analysis: per-(rollout, turn) credit records, their loader and the standard plots."""

from lit_credit.analysis.records import credit_records, write_shard
from lit_credit.credit.slca import credit_leakage

__all__ = ["credit_leakage", "credit_records", "write_shard"]
