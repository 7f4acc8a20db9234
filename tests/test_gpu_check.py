"""scripts/gpu_check.py's CPU dry run (``--cpu``), run the way the GPU machine runs the check (from source on
PYTHONPATH; hydra, omegaconf, datasets, vllm, jsonargparse, math_verify and lightning hidden, as none is
installed there or needed), writes every figure for every case, and the chunked head's log-probs equal the
full head's."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MISSING = ("hydra", "omegaconf", "datasets", "vllm", "jsonargparse", "math_verify", "lightning")
# A None in sys.modules makes `import name` (and of its submodules) raise ModuleNotFoundError, and
# importlib.util.find_spec(name) return None, as for a package that is not installed.
RUN = ("import runpy, sys\n"
       f"sys.modules.update(dict.fromkeys({MISSING!r}))\n"
       "runpy.run_path('scripts/gpu_check.py', run_name='__main__')\n")


def test_cpu_dry_run_needs_none_of_the_missing_packages(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("OUT", None)
    proc = subprocess.run([sys.executable, "-c", RUN, "--cpu", "--out", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    report = json.loads((tmp_path / "gpu_check.json").read_text())

    assert set(report["rollout"]) == set(report["agreement"]) == {"none", "fsdp2"}
    assert set(report["train"]) == {"none/full", "none/chunked", "fsdp2/full", "fsdp2/chunked"}
    for figures in report["rollout"].values():
        assert figures["tokens"] == report["settings"]["rollouts"] * report["settings"]["new_tokens"]
        for key in ("tokens_per_s", "seconds", "peak_mem_gib"):
            assert math.isfinite(figures[key]) and figures[key] > 0, (key, figures)
    seq = report["settings"]["prompt_len"] + report["settings"]["new_tokens"]
    for figures in report["train"].values():
        assert figures["tokens"] == report["settings"]["rollouts"] * seq
        for key in ("tokens_per_s", "seconds", "mfu", "peak_mem_gib"):
            assert math.isfinite(figures[key]) and figures[key] > 0, (key, figures)
    for diffs in report["agreement"].values():
        assert diffs["max_abs_logp_diff"] < 1e-4 and diffs["max_abs_entropy_diff"] < 1e-4
        assert diffs["engine_vs_trainer_mean_abs_logp"] < 1e-4  # float32: engine and trainer agree
    assert report["micro_batch_tokens"] == report["settings"]["micro_rows"] * seq
    assert report["full_head_logits_gib"] > 0 and report["model"]["architecture"] == "Qwen2ForCausalLM"
