"""Data-parallel scaling on CPU: the same job on 1 process and on 2 (trainer=ddp_cpu, trainer=fsdp2_cpu), one
thread each, through the `lit-credit` command.

Weak scaling (the default, ``--mode weak``): every process samples and trains ``--prompts`` groups of
``data.sampling.n`` a step, so 2 processes train a step twice the size. Strong scaling (``--mode strong``): the
step is ``--prompts`` groups whatever the number of processes, each rank half of it with 2. Read from each run's TensorBoard file, over the steps after
``--warmup``: the median step time and the median tokens/s of one process (``perf/tokens_per_s``: a rank's own
prompt + completion tokens over its step time). Scaling efficiency at N processes = per-process tokens/s at N /
tokens/s of the 1-process run (1.0: N processes do N times the work per second). The row ``2 x cpu
(independent)`` runs two unrelated 1-process jobs at once: the machine's own ceiling for two processes, which a
data-parallel run cannot beat; ``vs independent`` is a run's efficiency over that ceiling's. Each trainer runs
``--repeats`` times, round-robin, and the medians over the repeats are reported with every repeat's value::

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
# Two unrelated 1-process runs at once, one per core: no communication at all, so their per-process rate is what
# the machine allows two processes (shared memory bandwidth, caches, the hypervisor); the ceiling of the others.
INDEPENDENT = "2 x cpu (independent)"


def run(trainer: str, setting: str, steps: int, cache: str, prompts: int, copies: int = 1) -> dict[str, list[float]]:
    """One run of ``trainer`` (or, with ``copies`` > 1, that many independent runs at once, each on its own
    process): the per-step ``perf/step_s`` and ``perf/tokens_per_s`` of the (first) run and the wall time."""
    outs = [Path(tempfile.mkdtemp(prefix=f"scaling-{trainer}-")) for _ in range(copies)]
    cmds = [[str(Path(sys.executable).with_name("lit-credit")), "experiment=grpo_arith", f"trainer={trainer}",
             *SETTINGS[setting], f"data.prompts_per_step={prompts}", f"trainer.max_steps={steps}",
             "validate_first=false", "+trainer.limit_val_batches=0", "callbacks=none",
             "+trainer.enable_progress_bar=false", f"hydra.run.dir={out}", *([f"paths.cache_dir={cache}"] if cache else [])]
            for out in outs]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
             for cmd in cmds]
    for cmd, proc in zip(cmds, procs):
        _, stderr = proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{stderr[-3000:]}")
    (events,) = (outs[0] / "tensorboard").rglob("events.out.tfevents.*")
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
    parser.add_argument("--repeats", type=int, default=3, help="runs of each trainer, round-robin; medians over them")
    parser.add_argument("--out", default="benchmarks/results/scaling.json")
    args = parser.parse_args()
    report: dict = {"steps": args.steps, "warmup": args.warmup, "mode": args.mode, "prompts": args.prompts,
                    "repeats": args.repeats, "settings": {}}
    print("| setting | trainer | processes | step s | tokens/s per process (per repeat) | efficiency | vs independent |\n"
          "|---|---|---|---|---|---|---|")
    for setting in args.settings:
        trainers = (*TRAINERS, INDEPENDENT)
        runs: dict[str, list[dict]] = {t: [] for t in trainers}
        for _ in range(args.repeats):  # round-robin, so a slow spell of the machine hits every trainer alike
            for trainer in trainers:
                processes = 1 if trainer == "cpu" else 2
                prompts = args.prompts * (processes if args.mode == "weak" and trainer != INDEPENDENT else 1)
                values = run("cpu" if trainer == INDEPENDENT else trainer, setting, args.steps, args.cache, prompts,
                             copies=2 if trainer == INDEPENDENT else 1)
                kept = {k: v[args.warmup:] for k, v in values.items() if k != "wall_s"}
                runs[trainer].append({"processes": processes, "prompts_per_step": prompts,
                                      "step_s": statistics.median(kept["perf/step_s"]),
                                      "tokens_per_s_per_process": statistics.median(kept["perf/tokens_per_s"]),
                                      "wall_s": values["wall_s"][0], "per_step": values})
        rows = {t: {"processes": r[0]["processes"], "prompts_per_step": r[0]["prompts_per_step"],
                    "step_s": statistics.median(x["step_s"] for x in r),
                    "tokens_per_s_per_process": statistics.median(x["tokens_per_s_per_process"] for x in r),
                    "tokens_per_s_per_repeat": [x["tokens_per_s_per_process"] for x in r], "repeats": r}
                for t, r in runs.items()}
        one = rows["cpu"]["tokens_per_s_per_process"]
        ceiling = rows[INDEPENDENT]["tokens_per_s_per_process"]
        for trainer, row in rows.items():
            row["efficiency"] = row["tokens_per_s_per_process"] / one
            row["vs_independent"] = row["tokens_per_s_per_process"] / ceiling
            spread = "/".join(f"{v:.0f}" for v in row["tokens_per_s_per_repeat"])
            print(f"| {setting} | {trainer} | {row['processes']} | {row['step_s']:.3f} | "
                  f"{row['tokens_per_s_per_process']:.0f} ({spread}) | {row['efficiency']:.2f} | "
                  f"{row['vs_independent']:.2f} |")
        report["settings"][setting] = {"overrides": SETTINGS[setting], "runs": rows}
    write_results(args.out, report)


if __name__ == "__main__":
    main()
