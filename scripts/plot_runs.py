"""Compare the runs of a Hydra multirun: a metric against steps, mean and spread over seeds, per method.

    python scripts/plot_runs.py SWEEP_DIR --metric val/tool/exact_match --by experiment --out plot.png

Each run directory holds ``.hydra/overrides.yaml`` and ``tensorboard/``. Runs are grouped by the value of
the override ``--by`` (e.g. ``experiment``, ``credit``, ``method``); the other overrides (seeds) are pooled.
Prints a markdown table of the final value per group (mean +- std over runs, and n).
"""
from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path

import yaml

try:
    from scripts.tb_scalars import scalars
except ModuleNotFoundError:  # run as `python scripts/plot_runs.py`: scripts/ itself is on sys.path
    from tb_scalars import scalars


def load_sweep(sweep_dir: str | Path, metric: str, by: str) -> dict[str, list[dict[int, float]]]:
    """group value -> one {step: value} series per run that logged ``metric``."""
    groups: dict[str, list[dict[int, float]]] = defaultdict(list)
    for overrides_file in sorted(Path(sweep_dir).rglob(".hydra/overrides.yaml")):
        run = overrides_file.parent.parent
        overrides = dict(o.split("=", 1) for o in yaml.safe_load(overrides_file.read_text()) or [] if "=" in o)
        series = scalars(run).get(metric)
        if series:
            groups[overrides.get(by, "default")].append(dict(series))
    return dict(groups)


def summarise(groups: dict[str, list[dict[int, float]]]) -> str:
    lines = ["| group | final (mean +- std) | runs |", "|---|---|---|"]
    for name, runs in sorted(groups.items()):
        finals = [run[max(run)] for run in runs]
        spread = statistics.stdev(finals) if len(finals) > 1 else 0.0
        lines.append(f"| {name} | {statistics.mean(finals):.3f} +- {spread:.3f} | {len(finals)} |")
    return "\n".join(lines)


def band(ax, steps: list[int], values: list[list[float]], label: str, **style) -> None:
    """Mean over runs at each step, with a +- one (sample) std band."""
    mean = [statistics.mean(v) for v in values]
    std = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in values]
    ax.plot(steps, mean, label=label, **style)
    ax.fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], alpha=0.2)


def save(fig, axes, out: str | Path) -> None:
    import matplotlib.pyplot as plt

    for ax in axes:
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def plot(groups: dict[str, list[dict[int, float]]], metric: str, out: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for name, runs in sorted(groups.items()):
        steps = sorted(set.intersection(*(set(r) for r in runs)))
        band(ax, steps, [[r[s] for r in runs] for s in steps], f"{name} (n={len(runs)})")
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    save(fig, [ax], out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir")
    parser.add_argument("--metric", default="val/reward/mean")
    parser.add_argument("--by", default="experiment")
    parser.add_argument("--out", default=None, help="PNG path (default: <sweep_dir>/<metric>.png)")
    args = parser.parse_args()
    groups = load_sweep(args.sweep_dir, args.metric, args.by)
    if not groups:
        raise SystemExit(f"no run under {args.sweep_dir} logged {args.metric!r}")
    out = args.out or Path(args.sweep_dir) / (args.metric.replace("/", "_") + ".png")
    plot(groups, args.metric, out)
    print(summarise(groups))
    print(f"plot: {out}")


if __name__ == "__main__":
    main()
