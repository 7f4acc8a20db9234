"""Credit analysis: per-(rollout, turn) credit records, their loader and the standard plots; the comparison
protocol (:mod:`lit_credit.analysis.compare`: arms paired by seed, Student-t intervals)."""

from lit_credit.analysis.compare import CompareError, load_runs, paired_t
from lit_credit.analysis.records import credit_records, write_shard
from lit_credit.credit.slca import credit_leakage

__all__ = ["CompareError", "credit_leakage", "credit_records", "load_runs", "paired_t", "write_shard"]
