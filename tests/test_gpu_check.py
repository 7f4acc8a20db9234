"""scripts/gpu_check.py's CPU dry run (``--cpu``), run the way the GPU machine runs the check (from source on
PYTHONPATH; hydra, omegaconf, datasets, vllm, jsonargparse, math_verify and lightning hidden, as none is
installed there or needed), writes every figure for every case, and the chunked head's log-probs equal the
full head's. Then scripts/gpu_day_one.sh, the first call on a GPU machine: its import-trace check, and its
CPU dry run (slow: about 50 CPU seconds, two minutes on a shared 2-core machine)."""
from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


# scripts/gpu_day_one.sh: the prepared first call on a GPU machine (lit-credit on trainer=gpu and trainer=fsdp,
# then gpu_check.sh), dry-run on CPU.
def day_one():
    spec = importlib.util.spec_from_file_location("gpu_day_one", ROOT / "scripts" / "gpu_day_one.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_import_trace_is_read_and_checked_against_the_machine_and_the_wheels(tmp_path):
    """``-X importtime`` lines (children first) give each top-level module its first importer; a project
    import from a distribution neither on the GPU machine nor carried fails the check, an optional import of a
    machine package does not."""
    d = day_one()
    log = tmp_path / "run.log"
    log.write_text("a line of the run\n"
                   "import time: self [us] | cumulative | imported package\n"
                   "import time:        10 |         10 |       jsonargparse\n"
                   "import time:        10 |         20 |     lightning.pytorch.cli\n"
                   "import time:        10 |         30 |   lit_credit.methods.base\n"
                   "import time:        10 |         10 |     pyarrow\n"
                   "import time:        10 |         20 |   datasets\n"
                   "import time:        10 |         70 | lit_credit.methods\n"
                   "another line\n")
    importer, modules = d.strip_import_times(log)
    assert log.read_text() == "a line of the run\nanother line\n"
    assert importer == {"lit_credit": "", "datasets": "lit_credit", "pyarrow": "datasets",
                        "lightning": "lit_credit", "jsonargparse": "lightning"}
    assert "lit_credit.methods.base" in modules
    carried = {"datasets", "dill"}
    checked = d.check_imports(importer, ["lit_credit.methods.base"], carried)
    assert checked["missing"] == {} and "jsonargparse" in checked["not_on_machine_imported_by_machine_packages"]
    assert "dill" in checked["reason"]  # carried, never imported
    checked = d.check_imports(importer, ["lit_credit.methods.base"], set())
    assert checked["missing"] == {"datasets": ["datasets"]} and "gpu_wheels.sh" in checked["reason"]
    assert {w.split("==")[0] for w in d.wheel_list()} >= {"hydra-core", "omegaconf", "datasets"}


@pytest.mark.slow
def test_gpu_day_one_cpu_dry_run(tmp_path):
    """`scripts/gpu_day_one.sh --cpu`: lit-credit for 3 steps with validation before training and after step 2, a
    checkpoint and the HF export, on trainer=cpu and trainer=fsdp2_cpu (devices=1) with a tiny Qwen2 written as
    model=hf, then gpu_check.sh --cpu; every phase passes, every import is on the GPU machine or carried, and
    what comes back fits the device tool's limits on $OUT (8 files at most, plain names)."""
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("OUT", None)
    proc = subprocess.run(["bash", "scripts/gpu_day_one.sh", "--cpu", "--out", str(out), "--work", str(work),
                           "--budget", "1500"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1600)
    summary = json.loads((out / "summary.json").read_text())
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{summary['phases']}"
    assert summary["passed"] and set(summary["phases"]) == {
        "install", "preflight", "model", "lit_credit_gpu", "lit_credit_fsdp", "imports", "gpu_check"}
    assert summary["phases"]["model"]["config"] == "TINY"
    assert summary["phases"]["model"]["tokenizer_ids"] <= summary["phases"]["model"]["vocab_size"]
    for phase, trainer in (("lit_credit_gpu", "trainer=cpu"), ("lit_credit_fsdp", "trainer=fsdp2_cpu")):
        result = summary["phases"][phase]
        assert trainer in result["command"] and "trainer.precision=bf16-mixed" in result["command"]
        assert [i for i, _ in result["run"]["train_reward_mean"]] == [0, 1, 2]
        assert [i for i, _ in result["run"]["val_reward_mean"]] == [0, 1]
        assert result["run"]["checkpoints"]["last.ckpt"] > 0 and result["run"]["hf_export"] == ["hf/last"]
        assert result["final_metrics"] and all(math.isfinite(v) for v in result["final_metrics"].values())
        assert not list((work / phase / "checkpoints").glob("*.ckpt"))  # the weights are deleted after
    assert summary["phases"]["imports"]["missing"] == {}
    assert {"datasets", "hydra-core", "omegaconf"} <= set(summary["phases"]["imports"]["distributions"])
    assert summary["phases"]["gpu_check"]["exit"] == 0 and (out / "gpu_check.json").exists()
    files = sorted(p.name for p in out.rglob("*") if p.is_file())
    assert len(files) <= 8 and all(re.fullmatch(r"[A-Za-z0-9._-]+", f) for f in files), files
    assert {"summary.json", "console.log", "lit_credit_gpu.log", "lit_credit_fsdp.log", "gpu_check.json",
            "gpu_check.log", "runs.tar.gz"} == set(files)
