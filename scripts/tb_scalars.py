"""Print first-10 / last-10 means of TensorBoard scalars: ``python scripts/tb_scalars.py RUN_DIR [TAG ...]``."""
from __future__ import annotations

import sys
from pathlib import Path

from lit_credit.analysis.compare import run_scalars


def scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of the TensorBoard event files under ``run_dir``: tag -> [(step, value)], by step
    (:func:`lit_credit.analysis.compare.run_scalars`, the one reader)."""
    return {tag: sorted(series.items()) for tag, series in run_scalars(run_dir).items()}


def main() -> None:
    run_dir, *tags = sys.argv[1:]
    series = scalars(run_dir)
    for tag in tags or ["train/reward/mean", "val/reward/mean"]:
        values = [v for _, v in series.get(tag, [])]
        if values:
            head, tail = values[:10], values[-10:]
            print(f"{tag}: n={len(values)} first10={sum(head) / len(head):.4f} last10={sum(tail) / len(tail):.4f} "
                  f"all={[round(v, 3) for v in values] if len(values) <= 12 else ''}")


if __name__ == "__main__":
    main()
