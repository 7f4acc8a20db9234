"""The standard credit plots of a records DataFrame (:func:`~lit_credit.analysis.load.load_records`).

Every function takes the DataFrame (rows = rollout x turn) and the column that names a method (``by``:
``method``, or a sweep override such as ``credit``), and returns a matplotlib Figure, or None when the
records hold nothing to draw (e.g. no DPA cases in a GRPO run).
"""
from __future__ import annotations

import math

import pandas as pd

TURN_TYPE_ORDER = ("improve", "maintain", "flat", "regress")


def _figure(n: int = 1, width: float = 5.5):
    """A pyplot-free Figure (no global state, any backend; ``display(fig)`` in a notebook, ``fig.savefig``)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * n, 3.8), dpi=110)
    return fig, list(fig.subplots(1, n, squeeze=False)[0])


def _boxes(ax, groups: dict[str, pd.Series], ylabel: str = "advantage (mean over the turn's tokens)") -> None:
    names = list(groups)
    ax.boxplot([groups[n].to_numpy() for n in names], showfliers=False)
    ax.set_xticks(range(1, len(names) + 1), names, rotation=20, ha="right", fontsize=8)
    ax.axhline(0.0, color="grey", lw=0.6)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.grid(alpha=0.3)


def by_segment(df: pd.DataFrame, by: str = "method"):
    """Advantage distribution per (method, segment): tool vs summary credit side by side."""
    data = df[df["segment"].isin(["tool", "summary"])]
    if data.empty:
        return None
    fig, (ax,) = _figure(width=6.5)
    _boxes(ax, {f"{m} / {s}": g["advantage"] for (m, s), g in data.groupby([by, "segment"])})
    ax.set_title("credit by segment")
    fig.tight_layout()
    return fig


def methods_on_segment(df: pd.DataFrame, segment: str = "tool", by: str = "method"):
    """Histogram of one segment's advantages, one overlaid curve per method (e.g. GRPO vs SLCA on tool
    turns: GRPO's tool credit follows the whole score, SLCA's only the process score)."""
    data = df[df["segment"] == segment]
    if data.empty:
        return None
    fig, (ax,) = _figure()
    for name, g in data.groupby(by):
        ax.hist(g["advantage"], bins=30, histtype="step", density=True, label=f"{name} (n={len(g)})")
    ax.set_xlabel(f"advantage of {segment} turns")
    ax.set_ylabel("density")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title(f"{segment} credit by method")
    fig.tight_layout()
    return fig


def by_turn(df: pd.DataFrame, by: str = "method"):
    """Mean advantage (+- std) by turn index, one line per method; and by turn type (TCPO)."""
    typed = df[df["turn_type"] != ""]
    fig, axes = _figure(2 if not typed.empty else 1)
    ax = axes[0]
    for name, g in df.groupby(by):
        stats = g.groupby("turn")["advantage"].agg(["mean", "std"]).fillna(0.0)
        ax.errorbar(stats.index, stats["mean"], yerr=stats["std"], capsize=3, marker="o", label=str(name))
    ax.axhline(0.0, color="grey", lw=0.6)
    ax.set_xlabel("turn index")
    ax.set_ylabel("advantage (mean +- std)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title("credit by turn index")
    if not typed.empty:
        order = [t for t in TURN_TYPE_ORDER if t in set(typed["turn_type"])]
        _boxes(axes[1], {f"{m} / {t}": g["advantage"] for m, mg in typed.groupby(by) for t in order
                         if not (g := mg[mg["turn_type"] == t]).empty})
        axes[1].set_title("credit by turn type")
    fig.tight_layout()
    return fig


def by_case(df: pd.DataFrame):
    """DPA-GRPO: the share of each decision case over steps, and the mean advantage per case and role."""
    data = df[df["case"] != ""]
    if data.empty:
        return None
    fig, (left, right) = _figure(2)
    decisions = data[data["source"] == "proposals"] if (data["source"] == "proposals").any() else data
    share = decisions.groupby(["step", "case"]).size().unstack(fill_value=0)
    share = share.div(share.sum(1), axis=0)
    for case in share.columns:
        left.plot(share.index, share[case], marker=".", label=f"case {case}")
    left.set_xlabel("step")
    left.set_ylabel("share of decisions")
    left.legend(fontsize=7, ncol=2)
    left.grid(alpha=0.3)
    left.set_title("DPA cases over steps")
    _boxes(right, {f"{s} / {c}": g["advantage"] for (s, c), g in data[data["source"] != "proposals"]
                   .groupby(["source", "case"])})
    right.set_title("credit by case and role")
    fig.tight_layout()
    return fig


def leakage_by_step(df: pd.DataFrame, by: str = "method") -> pd.DataFrame:
    """Per (method, run, step): the correlation over rollouts between the summary score and the rollout's
    mean tool-turn advantage (token-weighted), the records' version of the ``credit/leakage`` scalar."""
    tool = df[df["segment"] == "tool"] if "reward/summary" in df else df.iloc[:0]
    if tool.empty:
        return pd.DataFrame(columns=[by, "run", "step", "leakage"])
    keys = [by, "run", "step", "rollout"] if "run" in df else [by, "step", "rollout"]
    weighted = tool.assign(w=tool["advantage"] * tool["tokens"])
    per_rollout = weighted.groupby(keys).agg(w=("w", "sum"), tokens=("tokens", "sum"),
                                             summary=("reward/summary", "first"))
    per_rollout["tool_adv"] = per_rollout["w"] / per_rollout["tokens"]

    def corr(g: pd.DataFrame) -> float:
        value = g["summary"].corr(g["tool_adv"]) if len(g) >= 3 else math.nan
        return float(value) if value == value else math.nan

    out = per_rollout.groupby(keys[:-1])[["summary", "tool_adv"]].apply(corr).rename("leakage").reset_index()
    return out
