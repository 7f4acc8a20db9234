from callbacks.hf_export import HFExport, save_pretrained_atomic

__all__ = ["HFExport", "save_pretrained_atomic"]
