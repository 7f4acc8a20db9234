"""What a benchmark ran on: CPU model, cores, load, versions (stored with every result file)."""
from __future__ import annotations

import os
import platform
from pathlib import Path

import torch


def machine() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown") if Path("/proc/cpuinfo").exists() else "unknown"
    return {
        "cpu_model": model,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_avg": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
