"""Behaviour snapshot of short training runs, to check that a refactor changes no number.

``python scripts/behaviour_snapshot.py OUT.json [JOB ...]`` runs each job (below) with the CSV logger into a
temporary directory and writes, per job, every logged metric except wall-clock ones (``perf/*``, ``time/*``) and
a SHA-256 of the final checkpoint's policy tensors. Two snapshots of the same jobs compare with
``--compare A B``: any difference is printed and the exit status is 1.

Two job sets: ``JOBS`` (longer runs, the refactor of the interfaces) and ``STANDARD``, the standard short jobs of
``tests/test_gpu_emulation.py`` for 2 steps on CPU (``trainer=cpu``, no ``emulate_gpu``, ``seed=0``), which
``tests/test_behaviour_snapshot.py`` runs with this tree's code and with the code of the commit before issue 51's
episode contract and compares (both on the machine that checks: CPU floats differ between CPUs). ``--standard`` selects them; ``--root DIR`` runs the
code of another checkout (its ``lit_credit``, cwd there); ``--cache-dir DIR`` holds the embedded policies built.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

JOBS = {
    "grpo_arith": ["experiment=grpo_arith", "trainer.max_steps=20"],
    "dapo_arith": ["experiment=grpo_arith", "loss=dapo", "method.dynamic_sampling=true", "trainer.max_steps=4", "trainer.val_check_interval=4"],
    "tcpo_math": ["experiment=tcpo_math", "trainer.max_steps=3", "trainer.val_check_interval=3",
                  "data.val_prompts=8"],
    "slca_toolcall": ["experiment=slca_toolcall", "trainer.max_steps=3", "trainer.val_check_interval=3",
                      "data.val_prompts=6"],
    "slca_tcpo_cf": ["experiment=slca_tcpo_toolcall", "credit.preset=tcpo", "trainer.max_steps=3",
                     "trainer.val_check_interval=3", "data.val_prompts=6"],
    "dpa_form": ["experiment=dpa_form", "trainer.max_steps=6", "trainer.val_check_interval=3",
                 "data.val_prompts=8"],
}

# tests/test_gpu_emulation.py's SMALL and JOBS (issue 50), frozen here so the fingerprint stays comparable
_SMALL = ["model.embedded.sft_lr=1e-2", "model.embedded.hidden_size=64", "model.embedded.intermediate_size=128",
          "model.embedded.num_layers=2", "data.prompts_per_step=4", "data.sampling.n=2", "data.val_prompts=4",
          "trainer.max_steps=2", "trainer.val_check_interval=1", "callbacks.checkpoint.every_n_train_steps=1",
          "callbacks.hf_export.every_n_steps=1", "callbacks.credit_records.every_n_steps=1",
          "+trainer.enable_progress_bar=false", "trainer=cpu", "seed=0"]
_ARITH = ["task.max_operand=9", "task.num_test=20", "model.embedded.sft_target=0", "model.embedded.sft_steps=120",
          "data.sampling.max_new_tokens=8"]
_TOOLS = ["model.embedded.sft_steps=2", "task.num_train=40", "task.num_test=8", "data.max_turns=2",
          "data.sampling.max_new_tokens=16"]
STANDARD = {
    "grpo": [*_SMALL, "experiment=grpo_arith", *_ARITH],
    "dapo": [*_SMALL, "experiment=dapo_arith", *_ARITH],
    "slca": [*_SMALL, "experiment=slca_toolcall", *_TOOLS],
    "slca_tcpo": [*_SMALL, "experiment=slca_tcpo_toolcall", *_TOOLS],
    "tcpo": [*_SMALL, "experiment=tcpo_math", "task.max_operand=4", "task.num_test=20", "model.embedded.sft_steps=20",
             "data.sampling.n=4", "data.val_samples=0", "augment.top_l=2", "augment.samples=2",
             "data.sampling.max_new_tokens=8"],
    "dpa_grpo": [*_SMALL, "experiment=dpa_form", "model.embedded.sft_steps=0", "task.num_train=1", "task.num_test=2",
                 "task.lines=[1a,15]", "task.rl_lines=null", "data.val_samples=0", "data.prompts_per_step=2",
                 "method.roles=shared"],
}
SKIP = ("perf/", "time/")  # wall-clock metrics


def run(args: list[str], out: Path, root: Path = ROOT, cache_dir: Path | None = None) -> dict:
    """One job's metrics (every logged value but the wall-clock ones, as logged) and its policy's hash."""
    cmd = [sys.executable, "-m", "lit_credit.train", *args, "logger=csv", f"hydra.run.dir={out}"]
    if cache_dir is not None:
        cmd.append(f"paths.cache_dir={cache_dir}")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(root)}
    for key in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "LIT_CREDIT_RUN_ID"):
        env.pop(key, None)
    done = subprocess.run(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(args)} failed:\n{done.stderr[-4000:]}")
    metrics: dict[str, list] = {}
    with open(out / "csv" / "metrics.csv") as f:
        for row in csv.DictReader(f):
            for key, value in row.items():
                if value != "" and not key.startswith(SKIP):
                    metrics.setdefault(key, []).append(value)
    state = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    digest = hashlib.sha256()
    for key in sorted(state):
        if key.startswith("policy."):
            digest.update(key.encode())
            digest.update(state[key].float().numpy().tobytes())
    return {"metrics": metrics, "policy_sha256": digest.hexdigest()}


def differences(left: dict, right: dict) -> list[str]:
    """Every difference between two snapshots of the same jobs, one line each."""
    out = []
    for job in sorted(left.keys() | right.keys()):
        if job not in left or job not in right:
            out.append(f"{job}: only in {'right' if job in right else 'left'}")
            continue
        for key in sorted(left[job]["metrics"].keys() | right[job]["metrics"].keys()):
            x, y = left[job]["metrics"].get(key), right[job]["metrics"].get(key)
            if x != y:
                out.append(f"{job} {key}: {x} != {y}")
        if left[job]["policy_sha256"] != right[job]["policy_sha256"]:
            out.append(f"{job}: final policy weights differ")
    return out


def compare(a: str, b: str) -> int:
    left, right = json.loads(Path(a).read_text()), json.loads(Path(b).read_text())
    bad = differences(left, right)
    print("\n".join(bad))
    print(f"{len(bad)} differences over {sorted(left.keys() & right.keys())}")
    return int(bool(bad))


def snapshot(jobs: dict[str, list[str]], names: list[str], root: Path = ROOT, cache_dir: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        return {name: run(jobs[name], Path(tmp) / name, root, cache_dir) for name in names}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--compare":
        raise SystemExit(compare(sys.argv[2], sys.argv[3]))
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("names", nargs="*")
    parser.add_argument("--standard", action="store_true")
    parser.add_argument("--root", type=Path, default=ROOT)
    parser.add_argument("--cache-dir", type=Path, default=None)
    a = parser.parse_args()
    jobs = STANDARD if a.standard else JOBS
    result = snapshot(jobs, a.names or list(jobs), a.root.resolve(), a.cache_dir)
    a.out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
