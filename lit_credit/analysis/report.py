"""``lit-credit-report RUN_DIR``: the standard credit plots of a run or sweep as PNG files, and a summary; with
``--baseline`` and ``--metric``, also the comparison of :mod:`lit_credit.analysis.compare` (its table and plot)."""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from lit_credit.analysis import compare, plots
from lit_credit.analysis.load import load_records


def _table(df: pd.DataFrame, keys: list[str]) -> str:
    stats = df.groupby(keys)["advantage"].agg(["count", "mean", "std"]).reset_index()
    head = "| " + " | ".join([*keys, "turns", "mean advantage", "std"]) + " |"
    rule = "|" + "---|" * (len(keys) + 3)
    rows = [f"| {' | '.join(str(r[k]) for k in keys)} | {int(r['count'])} | {r['mean']:.3f} | "
            f"{0.0 if r['std'] != r['std'] else r['std']:.3f} |" for _, r in stats.iterrows()]
    return "\n".join([head, rule, *rows])


def report(path: str | Path, out: str | Path | None = None, by: str = "method", baseline: str | None = None,
           metric: str | None = None, control: str | None = None, step: str | int = "last") -> list[Path]:
    """Write the plots of :mod:`lit_credit.analysis.plots` that the records support, as PNG files, and
    ``summary.md`` (record counts; mean and std of the advantage by segment, turn type and DPA case; the
    leakage by method) to ``out`` (default ``<path>/credit_report``). With ``baseline`` and ``metric``, the
    summary ends with the comparison table (:func:`~lit_credit.analysis.compare.compare`, the same as
    ``lit-credit-compare``) and ``comparison.png`` is its plot. Returns the written paths."""
    if (baseline is None) != (metric is None):
        raise compare.CompareError("a comparison needs both --baseline (e.g. credit=grpo) and --metric (e.g. val/reward/mean)")
    df = load_records(path)
    out = Path(out) if out is not None else Path(path) / "credit_report"
    out.mkdir(parents=True, exist_ok=True)
    figures = {
        "by_segment": plots.by_segment(df, by),
        "tool_by_method": plots.methods_on_segment(df, "tool", by),
        "by_turn": plots.by_turn(df, by),
        "by_case": plots.by_case(df),
    }
    written = []
    for name, fig in figures.items():
        if fig is not None:
            fig.savefig(out / f"{name}.png")
            written.append(out / f"{name}.png")
    lines = [f"# Credit report: {path}", "",
             f"{len(df)} records (rollout x turn) from {df['run'].nunique()} run(s), steps "
             f"{df['step'].min()}-{df['step'].max()}, methods: {', '.join(sorted(map(str, df[by].unique())))}.", ""]
    for title, keys, rows in [("By segment", [by, "segment"], df),
                              ("By turn type", [by, "turn_type"], df[df["turn_type"] != ""]),
                              ("By DPA case", [by, "source", "case"], df[df["case"] != ""])]:
        if not rows.empty:
            lines += [f"## {title}", "", _table(rows, keys), ""]
    leak = plots.leakage_by_step(df, by)
    if not leak.empty:
        mean = leak.groupby(by)["leakage"].mean()
        lines += ["## Leakage (corr. of summary score and tool-turn advantage, mean over steps)", "",
                  *[f"- {m}: {v:.3f}" for m, v in mean.items()], ""]
    if metric is not None:
        result = compare.compare(path, baseline, metric, step, control)
        compare.plot(result).savefig(out / "comparison.png")
        written.append(out / "comparison.png")
        lines += ["## Comparison", "", compare.table(result), ""]
    lines += ["Figures: " + ", ".join(p.name for p in written), ""]
    (out / "summary.md").write_text("\n".join(lines))
    return [*written, out / "summary.md"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="a run directory, its records/ directory, or a sweep directory")
    parser.add_argument("--out", default=None, help="output directory (default: RUN_DIR/credit_report)")
    parser.add_argument("--by", default="method", help="the column that names a method (e.g. credit, experiment)")
    parser.add_argument("--baseline", nargs="+", default=None, help="compare arms with this baseline arm's "
                                                                     "overrides (e.g. credit=grpo); needs --metric")
    parser.add_argument("--metric", default=None, help="the scalar tag to compare (e.g. val/tool/exact_match)")
    parser.add_argument("--control", nargs="+", default=None, help="the frozen control's overrides")
    parser.add_argument("--step", default="last", help="last, final or a step number (see lit-credit-compare)")
    args = parser.parse_args()
    try:
        paths = report(args.run_dir, args.out, args.by, args.baseline, args.metric, args.control, args.step)
    except compare.CompareError as err:
        raise SystemExit(f"lit-credit-report: {err}") from None
    for path in paths:
        print(path)


if __name__ == "__main__":
    main()
