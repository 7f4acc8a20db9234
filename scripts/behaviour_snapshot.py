"""Behaviour snapshot of short training runs, to check that a refactor changes no number.

``python scripts/behaviour_snapshot.py OUT.json [JOB ...]`` runs each job (below) with the CSV logger into a
temporary directory and writes, per job, every logged metric except wall-clock ones (``perf/*``) and a SHA-256
of the final checkpoint's policy tensors. Two snapshots of the same jobs compare with ``--compare A B``: any
difference is printed and the exit status is 1.
"""
from __future__ import annotations

import csv
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

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


def run(name: str, workdir: Path) -> dict:
    out = workdir / name
    cmd = [sys.executable, "-m", "lit_credit.train", *JOBS[name], "logger=csv", f"hydra.run.dir={out}",
           "~callbacks.credit_records"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    metrics: dict[str, list] = {}
    with open(out / "csv" / "metrics.csv") as f:
        for row in csv.DictReader(f):
            for key, value in row.items():
                if value != "" and not key.startswith("perf/"):
                    metrics.setdefault(key, []).append(value)
    state = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    digest = hashlib.sha256()
    for key in sorted(state):
        if key.startswith("policy."):
            digest.update(key.encode())
            digest.update(state[key].float().numpy().tobytes())
    return {"metrics": metrics, "policy_sha256": digest.hexdigest()}


def compare(a: str, b: str) -> int:
    left, right = json.loads(Path(a).read_text()), json.loads(Path(b).read_text())
    bad = 0
    for job in sorted(left.keys() & right.keys()):
        for key in sorted(left[job]["metrics"].keys() | right[job]["metrics"].keys()):
            x, y = left[job]["metrics"].get(key), right[job]["metrics"].get(key)
            if x != y:
                bad += 1
                print(f"{job} {key}: {x} != {y}")
        if left[job]["policy_sha256"] != right[job]["policy_sha256"]:
            bad += 1
            print(f"{job}: final policy weights differ")
    print(f"{bad} differences over {sorted(left.keys() & right.keys())}")
    return int(bad > 0)


def main() -> None:
    if sys.argv[1] == "--compare":
        raise SystemExit(compare(sys.argv[2], sys.argv[3]))
    path, names = Path(sys.argv[1]), sys.argv[2:] or list(JOBS)
    with tempfile.TemporaryDirectory() as tmp:
        snapshot = {name: run(name, Path(tmp)) for name in names}
    path.write_text(json.dumps(snapshot, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
