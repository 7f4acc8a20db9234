"""Compare the runs of a Hydra multirun: metrics against steps, mean and spread over seeds, per method.

    python scripts/plot_runs.py SWEEP_DIR --metric val/tool/exact_match --by experiment --out plot.png
    python scripts/plot_runs.py SWEEP_DIR --metric val/step1/exact_match val/step2/exact_match --by credit

Each run directory holds ``.hydra/overrides.yaml`` and ``tensorboard/``. Runs are grouped by the value of
the override ``--by`` (e.g. ``experiment``, ``credit``, ``method``); the other overrides (seeds) are pooled.
Several metrics give one panel each, side by side. Prints, per metric, a markdown table of the final value
per group (mean +- std over runs, and n).
"""
from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path

from lit_credit.analysis.load import run_overrides

try:
    from scripts.tb_scalars import scalars
except ModuleNotFoundError:  # run as `python scripts/plot_runs.py`: scripts/ itself is on sys.path
    from tb_scalars import scalars


def load_sweep(sweep_dir: str | Path, metric: str, by: str) -> dict[str, list[dict[int, float]]]:
    """group value -> one {step: value} series per run that logged ``metric``."""
    groups: dict[str, list[dict[int, float]]] = defaultdict(list)
    for overrides_file in sorted(Path(sweep_dir).rglob(".hydra/overrides.yaml")):
        run = overrides_file.parent.parent
        series = scalars(run).get(metric)
        if series:
            groups[run_overrides(run).get(by, "default")].append(dict(series))
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


def plot(panels: dict[str, dict[str, list[dict[int, float]]]], out: str | Path) -> None:
    """One panel per metric (``{metric: groups}``), each group's mean over runs with a +- std band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels) + 1, 4), dpi=120, squeeze=False)
    for ax, (metric, groups) in zip(axes[0], panels.items()):
        for name, runs in sorted(groups.items()):
            steps = sorted(set.intersection(*(set(r) for r in runs)))
            band(ax, steps, [[r[s] for r in runs] for s in steps], f"{name} (n={len(runs)})")
        ax.set_xlabel("step")
        ax.set_ylabel(metric)
    save(fig, list(axes[0]), out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir")
    parser.add_argument("--metric", nargs="+", default=["val/reward/mean"])
    parser.add_argument("--by", default="experiment")
    parser.add_argument("--out", default=None, help="PNG path (default: <sweep_dir>/<first metric>.png)")
    args = parser.parse_args()
    panels = {m: load_sweep(args.sweep_dir, m, args.by) for m in args.metric}
    missing = [m for m, groups in panels.items() if not groups]
    if missing:
        raise SystemExit(f"no run under {args.sweep_dir} logged {', '.join(map(repr, missing))}")
    out = args.out or Path(args.sweep_dir) / (args.metric[0].replace("/", "_") + ".png")
    plot(panels, out)
    for metric, groups in panels.items():
        print(f"\n{metric}\n{summarise(groups)}")
    print(f"plot: {out}")


if __name__ == "__main__":
    main()
