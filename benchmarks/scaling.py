"""Data-parallel scaling on CPU: the same job on 1 process and on 2 (trainer=ddp_cpu, trainer=fsdp2_cpu), one
thread each, through the `lit-credit` command.

Weak scaling (the default, ``--mode weak``): every process samples and trains ``--prompts`` groups of
``data.sampling.n`` a step, so 2 processes train a step twice the size. Strong scaling (``--mode strong``): the
step is ``--prompts`` groups whatever the number of processes, each rank half of it with 2. Read from each run's TensorBoard file, over the steps after
``--warmup``: the median step time and the median tokens/s of one process (``perf/tokens_per_s``: a rank's own
prompt + completion tokens over its step time). Scaling efficiency at N processes = per-process tokens/s at N /
tokens/s of the 1-process run (1.0: N processes do N times the work per second)::

    python -m benchmarks.scaling                       # default job and a longer-completion setting
    python -m benchmarks.scaling --steps 8 --settings default
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from benchmarks.machine import ROOT, write_results

SETTINGS = {  # the default job (arithmetic, short answers), and completions of about 128 tokens: the embedded
    # policy without its SFT warm start rarely samples eos (1 of 512 tokens), so its replies run to the cap
    "default": [],
    "long128": ["model.embedded.sft_steps=0", "data.sampling.max_new_tokens=128"],
}
TRAINERS = ("cpu", "ddp_cpu", "fsdp2_cpu")


def run(trainer: str, setting: str, steps: int, cache: str, prompts: int) -> dict[str, list[float]]:
    out = Path(tempfile.mkdtemp(prefix=f"scaling-{trainer}-"))
    cmd = [str(Path(sys.executable).with_name("lit-credit")), "experiment=grpo_arith", f"trainer={trainer}",
           *SETTINGS[setting], f"data.prompts_per_step={prompts}", f"trainer.max_steps={steps}", "validate_first=false", "+trainer.limit_val_batches=0",
           "callbacks=none", "+trainer.enable_progress_bar=false", f"hydra.run.dir={out}",
           *([f"paths.cache_dir={cache}"] if cache else [])]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    (events,) = (out / "tensorboard").rglob("events.out.tfevents.*")
    acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
    acc.Reload()
    values = {tag: [e.value for e in acc.Scalars(tag)] for tag in ("perf/step_s", "perf/tokens_per_s")}
    return values | {"wall_s": [time.perf_counter() - start]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians")
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--mode", choices=["weak", "strong"], default="weak")
    parser.add_argument("--prompts", type=int, default=16, help="prompt groups per process (weak) or per step (strong)")
    parser.add_argument("--cache", default="", help="paths.cache_dir (default: the project's cache)")
    parser.add_argument("--out", default="benchmarks/results/scaling.json")
    args = parser.parse_args()
    report: dict = {"steps": args.steps, "warmup": args.warmup, "mode": args.mode, "prompts": args.prompts,
                    "settings": {}}
    print("| setting | trainer | processes | step s | tokens/s per process | efficiency |\n|---|---|---|---|---|---|")
    for setting in args.settings:
        rows = {}
        for trainer in TRAINERS:
            processes = 1 if trainer == "cpu" else 2
            prompts = args.prompts * (processes if args.mode == "weak" else 1)
            values = run(trainer, setting, args.steps, args.cache, prompts)
            kept = {k: v[args.warmup:] for k, v in values.items() if k != "wall_s"}
            rows[trainer] = {"processes": processes, "prompts_per_step": prompts,
                             "step_s": statistics.median(kept["perf/step_s"]),
                             "tokens_per_s_per_process": statistics.median(kept["perf/tokens_per_s"]),
                             "wall_s": values["wall_s"][0], "per_step": values}
        one = rows["cpu"]["tokens_per_s_per_process"]
        for trainer, row in rows.items():
            row["efficiency"] = row["tokens_per_s_per_process"] / one
            print(f"| {setting} | {trainer} | {row['processes']} | {row['step_s']:.3f} | "
                  f"{row['tokens_per_s_per_process']:.0f} | {row['efficiency']:.2f} |")
        report["settings"][setting] = {"overrides": SETTINGS[setting], "runs": rows}
    write_results(args.out, report)


if __name__ == "__main__":
    main()
