"""DPA-GRPO vs SFT only and the generator-only baselines on Form 1040 lines: the table and figure of docs/experiments/dpa_form.md.

    python scripts/dpa_report.py outputs/multirun/dpa_form --out docs/figures/dpa_form.png

Runs (``.hydra/overrides.yaml`` + ``tensorboard/``) are grouped by their ``experiment`` override. Line accuracy
is that of the submitted values: ``val/final/*`` for runs that play the game (DPA-GRPO), ``val/reward/*`` (the
proposal) for generator-only runs. "SFT only" is the validation before training (``validate_first``): the
generator alone, and the game with every role at its SFT weights. Case shares come from game runs. The x axis
counts training batches (``--val-every`` per validation), the same prompts for every method (Lightning's
``global_step`` counts two optimiser steps per DPA round).
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

try:
    from scripts.plot_runs import band, load_sweep, save
except ModuleNotFoundError:  # run as `python scripts/dpa_report.py`
    from plot_runs import band, load_sweep, save

NAMES = {"dpa_form": "DPA-GRPO", "grpo_form": "GRPO", "grpo_form_ppo": "GRPO (PPO clip)", "dapo_form": "DAPO",
         "gspo_form": "GSPO"}
CASES = ("1", "4", "6a")


def _by_validation(runs: list[dict[int, float]]) -> list[list[float]]:
    """Per validation index (step order), the value of every run that has it."""
    ordered = [[run[s] for s in sorted(run)] for run in runs]
    return [[r[i] for r in ordered if i < len(r)] for i in range(max(map(len, ordered)))]


def _cell(values: list[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} +- {spread:.3f}"


def collect(sweep_dir: str | Path) -> dict[str, dict[str, list[list[float]]]]:
    """experiment -> metric name -> per validation index, the values over seeds."""
    out: dict[str, dict[str, list[list[float]]]] = {}
    game = load_sweep(sweep_dir, "val/final/strict", "experiment")
    for kind in ("strict", "lenient"):
        for name, runs in load_sweep(sweep_dir, f"val/reward/{kind}", "experiment").items():
            out.setdefault(name, {})[f"proposal_{kind}"] = _by_validation(runs)
            final = load_sweep(sweep_dir, f"val/final/{kind}", "experiment").get(name) if name in game else None
            out[name][kind] = _by_validation(final or runs)
    for case in CASES:
        for name, runs in load_sweep(sweep_dir, f"val/dpa/case/{case}", "experiment").items():
            out[name][f"case {case}"] = _by_validation(runs)
    return out


def table(data: dict[str, dict[str, list[list[float]]]]) -> str:
    head = ["method", "line acc. strict", "lenient (+-$5)", *(f"case {c}" for c in CASES), "runs"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    generators = [n for n in data if "case 1" not in data[n]]
    games = [n for n in data if "case 1" in data[n]]
    if generators:  # every generator-only run starts from the same SFT weights and greedy validation
        first = data[generators[0]]
        lines.append(f"| SFT only (generator) | {_cell(first['strict'][0])} | {_cell(first['lenient'][0])} | "
                     f"- | - | - | {len(first['strict'][0])} |")
    for name in games:
        d = data[name]
        lines.append(f"| SFT only (game) | {_cell(d['strict'][0])} | {_cell(d['lenient'][0])} | "
                     + " | ".join(_cell(d[f"case {c}"][0]) for c in CASES) + f" | {len(d['strict'][0])} |")
    for name in sorted(data, key=lambda n: (n in games, NAMES.get(n, n))):
        d = data[name]
        cases = [_cell(d[f"case {c}"][-1]) if f"case {c}" in d else "-" for c in CASES]
        lines.append(f"| {NAMES.get(name, name)} | {_cell(d['strict'][-1])} | {_cell(d['lenient'][-1])} | "
                     + " | ".join(cases) + f" | {len(d['strict'][-1])} |")
    return "\n".join(lines)


def plot(data: dict[str, dict[str, list[list[float]]]], val_every: int, out: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc, cases) = plt.subplots(1, 2, figsize=(11, 4), dpi=120)
    for name, d in sorted(data.items()):
        steps = [i * val_every for i in range(len(d["strict"]))]
        band(acc, steps, d["strict"], f"{NAMES.get(name, name)} (n={len(d['strict'][-1])})", marker="o")
        for case in CASES:
            if f"case {case}" in d:
                band(cases, steps, d[f"case {case}"], f"{NAMES.get(name, name)}: case {case}", marker="o")
    acc.set(xlabel="training batches", ylabel="held-out line accuracy (strict)", title="Form 1040 lines", ylim=(0, 1))
    cases.set(xlabel="training batches", ylabel="share of decisions", title="DPA case taxonomy (held out)")
    save(fig, [acc, cases], out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir")
    parser.add_argument("--val-every", type=int, default=20, help="training batches between validations")
    parser.add_argument("--out", default=None, help="PNG path (default: <sweep_dir>/dpa_form.png)")
    args = parser.parse_args()
    data = collect(args.sweep_dir)
    if not data:
        raise SystemExit(f"no run under {args.sweep_dir} logged val/reward/strict")
    out = args.out or Path(args.sweep_dir) / "dpa_form.png"
    plot(data, args.val_every, out)
    print(table(data))
    print(f"plot: {out}")


if __name__ == "__main__":
    main()
