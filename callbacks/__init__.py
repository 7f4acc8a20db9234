from callbacks.credit_records import CreditRecords
from callbacks.hf_export import HFExport, save_pretrained_atomic

__all__ = ["CreditRecords", "HFExport", "save_pretrained_atomic"]
