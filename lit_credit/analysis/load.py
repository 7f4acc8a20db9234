"""Load credit records of one run or of a whole Hydra multirun sweep into one pandas DataFrame."""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import yaml


def run_overrides(run: str | os.PathLike) -> dict[str, str]:
    """``{key: value}`` of a Hydra run's command-line overrides (``<run>/.hydra/overrides.yaml``); {} without."""
    file = Path(run) / ".hydra" / "overrides.yaml"
    if not file.exists():
        return {}
    return dict(o.split("=", 1) for o in yaml.safe_load(file.read_text()) or [] if "=" in o)


def record_dirs(path: str | os.PathLike) -> list[Path]:
    """The ``records/`` directories of the run at ``path`` or of every run under it (a sweep), sorted."""
    path = Path(path)
    if path.name == "records" and path.is_dir():
        return [path]
    return sorted(p for p in path.rglob("records") if p.is_dir() and any(p.glob("*.parquet")))


def load_records(path: str | os.PathLike) -> pd.DataFrame:
    """Every credit record (see :mod:`lit_credit.analysis.records`) under ``path``: a run directory, its
    ``records/`` directory, or a sweep directory of runs.

    Adds ``run`` (the run directory relative to ``path``, "." for a single run) and one column per Hydra
    override of the run (``credit``, ``seed``, ``experiment``, ...; from ``.hydra/overrides.yaml``). Raises
    FileNotFoundError naming ``path`` when it holds no records.
    """
    root = Path(path)
    frames = []
    for records in record_dirs(root):
        run = records.parent
        frame = pd.concat([pd.read_parquet(f) for f in sorted(records.glob("*.parquet"))], ignore_index=True)
        frame["run"] = str(run.relative_to(root)) if run != root and root in run.parents else "."
        for key, value in run_overrides(run).items():
            if key not in frame.columns:
                frame[key] = value
        frames.append(frame)
    if not frames:
        raise FileNotFoundError(f"no credit records under {root}: a run writes them to <run>/records/ with "
                                "callbacks=default (callbacks.credit_records.every_n_steps sets how often)")
    return pd.concat(frames, ignore_index=True)
