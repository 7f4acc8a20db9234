"""``lit-credit-compare SWEEP_DIR [SWEEP_DIR ...]``: the comparison protocol. Each method against its baseline, paired by seed,
with a 95 % Student-t interval of the mean paired difference, the per-seed differences and the smallest effect
the design could detect.

    lit-credit-compare SWEEP_DIR --baseline credit=grpo --metric val/tool/exact_match \\
        [--control method.optimizer.lr=0] [--start] [--step last|final|N] [--family] [--interval t|bootstrap] \\
        [--out table.md] [--plot fig.png]

A sweep is a directory of runs (a Hydra multirun; sub-sweeps below it count too); several sweep directories are
read as one (an arm run later, into its own directory, beside the arms it is compared with). A run is a directory with
``.hydra/overrides.yaml`` and TensorBoard event files. The runs are read by :func:`load_runs` and grouped into
**arms** by their overrides minus ``seed`` (:func:`arms`). An arm's **baseline** is the arm that matches
``--baseline`` and agrees with it on every other override, apart from the keys of ``--baseline`` and
``--control`` (:func:`baseline_of`). So ``credit=grpo,slca x reward.judge.noise=0.5,1.0`` compares SLCA at noise
0.5 with GRPO at noise 0.5. A frozen control (``--control method.optimizer.lr=0``: the same prompt stream per
seed, no learning) is one more arm, marked in the table and plot. Its difference to the baseline says whether
the baseline learned at all. ``--start`` adds the **frozen start** instead of (or besides) a control run: the
baseline's own runs read at their first logged step. For a held-out metric this is exactly what a frozen
control would read at every step with the HF engine (validation is seeded per run and isolated from training,
so unchanged weights give the step-0 value again; vLLM's sampler state is outside that guarantee), at no
cost; for a training-side metric it is not (the stream moves on), and a control run is needed.

Each arm's runs are paired with its baseline's by seed. Let ``x_s`` be the metric of the arm's seed-``s`` run
at the step and ``y_s`` the baseline's. The differences ``d_s = x_s - y_s`` give the mean paired difference
``mean(d)`` and its 95 % interval (:func:`paired_interval`: Student t by default, which holds its level at 3-10
seeds; an expanded percentile bootstrap from 10 seeds on as an option), the paired t-test's p-value, and the
smallest true difference the design detects with 80 % power (:func:`detectable_effect`). ``--family`` treats the
call's comparisons as one family: Holm-adjusted p-values decide the verdicts and the intervals are simultaneous
(Bonferroni, level ``1 - (1 - level) / m`` for ``m`` comparisons). The step is ``last`` (the last
step every run logged the metric at, default), ``final`` (each run's own last value, for arms that count steps
differently, as DPA-GRPO counts two optimiser steps per round) or a number. :func:`compare` does this, and
:func:`table` and :func:`plot` render it. ``lit-credit-report`` and the notebook call these same functions.
"""
from __future__ import annotations

import argparse
import difflib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from lit_credit.analysis.load import run_overrides

SEED = "seed"
__all__ = [
    "INTERVALS",
    "ArmResult",
    "CompareError",
    "Comparison",
    "Run",
    "arms",
    "baseline_of",
    "compare",
    "detectable_effect",
    "holm",
    "load_runs",
    "main",
    "paired_bootstrap",
    "paired_interval",
    "paired_t",
    "parse_spec",
    "plot",
    "run_scalars",
    "t_test",
    "table",
]


class CompareError(ValueError):
    """A sweep that cannot be compared as asked. The message names the runs concerned and the fix."""


# ---------------------------------------------------------------------------------------------- loading
def run_scalars(run: str | os.PathLike) -> dict[str, dict[int, float]]:
    """Every scalar series of the TensorBoard event files under ``run``, as tag -> {step: value}. The files
    are read in name order (a resumed run's later file wins a step both logged)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, dict[int, float]] = {}
    for events in sorted(Path(run).rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0, "histograms": 1, "tensors": 1,
                                                           "images": 1, "audio": 1, "compressedHistograms": 1})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, {}).update((e.step, float(e.value)) for e in acc.Scalars(tag))
    return out


def _norm(value: str) -> str:
    """One spelling per value: ``0``, ``0.0`` and ``0e0`` are one number, ``false`` and ``False`` one boolean (Hydra
    parses both alike and writes a swept job's as ``False``); other text is kept as it is."""
    if str(value).lower() in ("true", "false"):
        return str(value).lower()
    try:
        number = float(value)
    except ValueError:
        return str(value)
    return repr(int(number)) if number.is_integer() and abs(number) < 2**53 else repr(number)


@dataclass
class Run:
    """One run of a sweep: its directory, its overrides without ``seed`` (normalised values), its seed and its
    scalars (tag -> {step: value})."""

    path: Path
    overrides: dict[str, str]
    seed: str
    scalars: dict[str, dict[int, float]] = field(repr=False)

    @property
    def arm(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(self.overrides.items()))


def _seed(run: Path, overrides: Mapping[str, str]) -> str:
    if SEED in overrides:
        return overrides[SEED]
    config = run / ".hydra" / "config.yaml"
    seed = (yaml.safe_load(config.read_text()) or {}).get(SEED) if config.exists() else None
    if seed is None:
        raise CompareError(f"run {run} has no seed: its .hydra/overrides.yaml has no seed=... and its "
                           ".hydra/config.yaml none; fix: sweep the seeds explicitly (lit-credit -m ... seed=0,1,2,3,4)")
    return str(seed)


def _natural(path: Path) -> list[tuple[int, int, str]]:
    """Sort key of a path with its numbers as numbers (Hydra's job 2 before job 10)."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in path.parts]


def load_runs(sweep_dirs: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Run]:
    """Every run under the sweep directory (or directories, read as one), a run being a directory holding
    ``.hydra/overrides.yaml``, in job order (each directory's paths with numbers compared as numbers), with its
    scalars; a run under two of the directories (one nested in another) counts once. Raises :class:`CompareError`
    naming the fix when a directory is missing or holds no run."""
    roots = [Path(sweep_dirs)] if isinstance(sweep_dirs, (str, os.PathLike)) else [Path(d) for d in sweep_dirs]
    runs, seen = [], set()
    for root in roots:
        if not root.is_dir():
            raise CompareError(f"{root} is not a directory: give the sweep directory of a multirun "
                               "(lit-credit -m ... hydra.sweep.dir=DIR)")
        found = sorted(root.rglob(".hydra/overrides.yaml"), key=_natural)
        if not found:
            raise CompareError(f"no runs under {root}: a run directory holds .hydra/overrides.yaml and tensorboard/ "
                               "(written by lit-credit -m ... hydra.sweep.dir=DIR); fix: give the sweep directory")
        for file in found:
            path = file.parent.parent
            if path.resolve() in seen:
                continue
            seen.add(path.resolve())
            overrides = {k: _norm(v) for k, v in run_overrides(path).items()}
            seed = _seed(path, overrides)
            overrides.pop(SEED, None)
            runs.append(Run(path, overrides, seed, run_scalars(path)))
    return runs


# ---------------------------------------------------------------------------------------------- arms
def parse_spec(spec: str | Iterable[str] | Mapping[str, str] | None) -> dict[str, str]:
    """``"credit=grpo loss=grpo"`` (or a list of such tokens, or a mapping) as {key: normalised value}."""
    if spec is None:
        return {}
    if isinstance(spec, Mapping):
        return {k: _norm(str(v)) for k, v in spec.items()}
    tokens = spec.split() if isinstance(spec, str) else [t for s in spec for t in str(s).split()]
    bad = [t for t in tokens if "=" not in t]
    if bad:
        raise CompareError(f"{bad}: an arm is named by KEY=VALUE overrides, e.g. --baseline credit=grpo")
    return {k: _norm(v) for k, v in (t.split("=", 1) for t in tokens)}


def _matches(overrides: Mapping[str, str], spec: Mapping[str, str]) -> bool:
    return bool(spec) and all(overrides.get(k) == v for k, v in spec.items())


def arms(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """The runs grouped by their overrides minus ``seed``, as label -> runs (sorted by seed). The label is the
    overrides that vary across arms, ``key=value`` in the order they appear (``(defaults)`` when none do).
    Raises :class:`CompareError` when two runs of an arm share a seed."""
    grouped: dict[tuple, list[Run]] = {}
    for run in runs:
        grouped.setdefault(run.arm, []).append(run)
    keys = list(dict.fromkeys(k for run in runs for k in run.overrides))
    varying = [k for k in keys if len({dict(a).get(k) for a in grouped}) > 1]
    out: dict[str, list[Run]] = {}
    for arm, members in grouped.items():
        values = dict(arm)
        label = " ".join(f"{k}={values[k]}" for k in varying if k in values) or "(defaults)"
        seeds = [r.seed for r in members]
        twice = sorted({s for s in seeds if seeds.count(s) > 1})
        if twice:
            paths = [str(r.path) for r in members if r.seed in twice]
            raise CompareError(f"arm {label!r} has several runs with seed {', '.join(twice)}: {paths}; fix: remove "
                               "the duplicates (e.g. a run restarted into another directory of the sweep)")
        out[label] = sorted(members, key=lambda r: _seed_key(r.seed))
    return out


def _seed_key(seed: str) -> tuple[int, float, str]:
    try:
        return (0, float(seed), "")
    except ValueError:
        return (1, 0.0, seed)


def baseline_of(arm: Mapping[str, str], candidates: Mapping[str, Mapping[str, str]], baseline: Mapping[str, str],
                control: Mapping[str, str]) -> str:
    """The label of ``arm``'s baseline among ``candidates`` (label -> overrides of the baseline arms). The
    baseline agrees with ``arm`` on every override that is not a key of ``baseline`` or ``control``."""
    free = set(baseline) | set(control)

    def context(overrides: Mapping[str, str]) -> dict[str, str]:
        return {k: v for k, v in overrides.items() if k not in free}

    found = [label for label, overrides in candidates.items() if context(overrides) == context(arm)]
    if len(found) != 1:
        spec = " ".join(f"{k}={v}" for k, v in baseline.items())
        shown = " ".join(f"{k}={v}" for k, v in context(arm).items()) or "(no other override)"
        raise CompareError(
            f"{'no' if not found else 'several'} baseline arm{'s' if found else ''} ({spec}) with the same other "
            f"overrides as this arm ({shown}){': ' + ', '.join(found) if found else ''}; baseline arms: "
            f"{', '.join(candidates)}; fix: run the baseline with these overrides too, or name it fully in "
            "--baseline")
    return found[0]


# ---------------------------------------------------------------------------------------------- statistics
INTERVALS = ("t", "bootstrap")
BOOTSTRAP_MIN_SEEDS = 10  # below this no percentile-type bootstrap holds its level (tests/analysis/test_coverage.py)
POWER = 0.8


def _differences(differences: Sequence[float]) -> np.ndarray:
    d = np.asarray(differences, dtype=np.float64)
    if d.ndim != 1 or len(d) == 0:
        raise CompareError("no paired differences: each arm needs at least one seed that its baseline also ran")
    if not np.isfinite(d).all():
        raise CompareError(f"non-finite paired differences {d.tolist()}: a run logged NaN/inf for the metric")
    return d


def paired_t(differences: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """``(mean(d), low, high)``: the Student-t interval of the mean paired difference,
    ``mean(d) +- t_{n-1, (1 + level) / 2} * s / sqrt(n)`` with ``s`` the sample standard deviation (ddof 1).
    Exact for normal differences at any ``n >= 2`` (simulated: 95 % at 3, 5 and 10 seeds; 89-90 % for
    exponential-skewed differences). One seed, or all differences equal, gives the zero-width interval at the
    mean (it says nothing; :attr:`ArmResult.excludes_zero` is None with one seed)."""
    from scipy import stats

    d = _differences(differences)
    mean = float(d.mean())
    if len(d) < 2:
        return mean, mean, mean
    half = float(stats.t.ppf((1 + level) / 2, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d)))
    return mean, mean - half, mean + half


def paired_bootstrap(differences: Sequence[float], resamples: int = 10_000, seed: int = 0,
                     level: float = 0.95) -> tuple[float, float, float]:
    """``(mean(d), low, high)``: the expanded percentile bootstrap interval of the mean paired difference
    (Hesterberg 2015). Each of ``resamples`` resamples draws ``n`` seeds with replacement (one index array from
    ``numpy.random.default_rng(seed)``) and takes their mean; the interval is that distribution's
    ``a' / 2`` and ``1 - a' / 2`` quantiles (``numpy.percentile``, linear), where the plain percentile's
    ``a = 1 - level`` is widened to ``a' = 2 * Phi(sqrt(n / (n - 1)) * t_{n-1, a / 2})`` to undo the plain
    percentile's narrowness at small ``n`` (a nominal 95 % plain percentile covers 84 % at 5 seeds). Refused
    below :data:`BOOTSTRAP_MIN_SEEDS` seeds: resampled means never leave ``[min(d), max(d)]``, which caps the
    widening, and there the interval covers well under its level (simulated, normal differences: 75 % at 3
    seeds, 91 % at 5); use :func:`paired_t`."""
    from scipy import stats

    d = _differences(differences)
    n = len(d)
    if n < BOOTSTRAP_MIN_SEEDS:
        raise CompareError(f"--interval bootstrap needs at least {BOOTSTRAP_MIN_SEEDS} seeds (this arm has {n}): "
                           "below that a bootstrap interval covers well under its level; fix: --interval t "
                           "(the default)")
    alpha = 2 * stats.norm.cdf(np.sqrt(n / (n - 1)) * stats.t.ppf((1 - level) / 2, n - 1))
    means = d[np.random.default_rng(seed).integers(0, n, size=(resamples, n))].mean(1)
    low, high = np.percentile(means, [50 * alpha, 100 - 50 * alpha])
    return float(d.mean()), float(low), float(high)


def paired_interval(differences: Sequence[float], interval: str = "t", level: float = 0.95,
                    resamples: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """The mean paired difference and its interval by ``interval`` (``t``: :func:`paired_t`, ``bootstrap``:
    :func:`paired_bootstrap`)."""
    if interval == "t":
        return paired_t(differences, level)
    if interval == "bootstrap":
        return paired_bootstrap(differences, resamples, seed, level)
    raise CompareError(f"--interval {interval!r}: use one of {', '.join(INTERVALS)}")


def t_test(differences: Sequence[float]) -> float | None:
    """The two-sided p-value of the paired t-test of ``mean(d) = 0``: ``2 * P(T_{n-1} > |mean(d)| / (s /
    sqrt(n)))``. None with one seed; with ``s = 0``, 0 if the mean is not 0, else 1."""
    from scipy import stats

    d = _differences(differences)
    if len(d) < 2:
        return None
    sd = d.std(ddof=1)
    if sd == 0:
        return 0.0 if d.mean() != 0 else 1.0
    return float(2 * stats.t.sf(abs(d.mean()) / (sd / np.sqrt(len(d))), len(d) - 1))


def detectable_effect(sd: float, n: int, level: float = 0.95, power: float = POWER) -> float | None:
    """The smallest true mean difference ``delta`` that the two-sided paired t-test at ``1 - level`` detects
    with probability ``power`` given ``n`` seeds and differences of standard deviation ``sd``: the root of
    ``P(|T'| > t_{n-1, (1 + level) / 2}) = power`` with ``T'`` noncentral t (``n - 1`` degrees of freedom,
    noncentrality ``delta * sqrt(n) / sd``): 3.26 sd at 3 seeds, 1.68 sd at 5, 1.00 sd at 10 (95 %, 80 %
    power). None with fewer than 2 seeds."""
    from scipy import optimize, stats

    if n < 2 or not np.isfinite(sd):
        return None
    if sd == 0:
        return 0.0
    df, crit = n - 1, stats.t.ppf((1 + level) / 2, n - 1)
    # T' = (Z + nc) / sqrt(V / df), V ~ chi2(df): P(|T'| > c) = E_V[Phi(nc - c sqrt(V/df)) + Phi(-nc - c sqrt(V/df))],
    # the expectation over 4000 equal-probability quantiles of V (scipy's nct is NaN at some nc for df = 1)
    scale = crit * np.sqrt(stats.chi2.ppf((np.arange(4000) + 0.5) / 4000, df) / df)

    def shortfall(nc: float) -> float:
        return float((stats.norm.cdf(nc - scale) + stats.norm.cdf(-nc - scale)).mean()) - power

    nc = optimize.brentq(shortfall, 0.0, 200.0)
    return float(nc * sd / np.sqrt(n))


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment: with the ``m`` p-values sorted ``p_(1) <= ... <= p_(m)``, the adjusted
    ``p~_(i) = max_{j <= i} min(1, (m - j + 1) * p_(j))``, returned in the input order (None stays None and does
    not count in ``m``). Rejecting where ``p~ < alpha`` controls the family-wise error at ``alpha``."""
    index = [i for i, p in enumerate(p_values) if p is not None]
    out: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, i in enumerate(sorted(index, key=lambda i: p_values[i])):
        running = max(running, min(1.0, (len(index) - rank) * p_values[i]))
        out[i] = running
    return out


@dataclass
class ArmResult:
    """One arm of a comparison. ``role`` is ``baseline``, ``control``, ``start`` (a baseline's runs at their
    first logged step) or ``arm``. ``values`` and ``baseline_values`` are the metric per seed, paired.
    ``difference``, ``low`` and ``high`` come from :func:`paired_interval` (simultaneous under ``--family``),
    ``p_value`` from :func:`t_test`, ``p_holm`` is Holm's adjustment over the call's comparisons (under
    ``--family``), ``detectable`` is :func:`detectable_effect` at the observed spread (all None for a baseline
    arm)."""

    label: str
    role: str
    baseline: str
    seeds: list[str]
    values: list[float]
    baseline_values: list[float]
    difference: float | None = None
    low: float | None = None
    high: float | None = None
    p_value: float | None = None
    p_holm: float | None = None
    detectable: float | None = None

    @property
    def differences(self) -> list[float]:
        return [a - b for a, b in zip(self.values, self.baseline_values)]

    @property
    def excludes_zero(self) -> bool | None:
        """Whether the interval excludes 0 (None for a baseline, or with fewer than 2 seeds, where the
        interval has zero width and says nothing). Under ``--family`` the interval is simultaneous, so a
        simultaneous interval that excludes 0 implies a Holm rejection (Holm is never stricter than Bonferroni)."""
        if self.difference is None or len(self.seeds) < 2:
            return None
        return self.low > 0 or self.high < 0

    def verdict(self, alpha: float) -> str:
        """What was detected, in words: the direction and interval when the test rejects (Holm's adjusted p
        under ``--family``, else the interval excluding 0), otherwise ``no difference larger than X`` with ``X``
        the interval's larger end in absolute value."""
        if self.excludes_zero is None:
            return "n/a (1 seed)"
        detected = self.p_holm < alpha if self.p_holm is not None else self.excludes_zero
        if detected:
            return f"{'higher' if self.difference > 0 else 'lower'} (by {abs(self.difference):.4f})"
        return f"no difference larger than {max(abs(self.low), abs(self.high)):.4f}"


@dataclass
class Comparison:
    """The result of :func:`compare`: the rows (the baselines first, then the arms in sweep order), the
    per-arm runs and the settings the table states (``level`` per comparison; under ``family`` the intervals
    are at ``interval_level``)."""

    metric: str
    step: str
    step_note: str
    baseline: dict[str, str]
    control: dict[str, str]
    resamples: int
    seed: int
    level: float
    rows: list[ArmResult]
    runs: dict[str, list[Run]] = field(repr=False)
    start: dict[str, int] | None = None  # baseline label -> the step of its frozen start
    interval: str = "t"
    family: bool = False

    @property
    def compared(self) -> list[ArmResult]:
        return [r for r in self.rows if r.role != "baseline"]

    @property
    def interval_level(self) -> float:
        """The level of each interval: ``level``, or Bonferroni's ``1 - (1 - level) / m`` under ``family``."""
        m = len(self.compared)
        return 1 - (1 - self.level) / m if self.family and m > 1 else self.level


def _estimate(result: Comparison) -> Comparison:
    """Fill each compared row's interval, p-value, Holm adjustment and detectable effect."""
    for row in result.compared:
        d = row.differences
        row.difference, row.low, row.high = paired_interval(d, result.interval, result.interval_level,
                                                            result.resamples, result.seed)
        row.p_value = t_test(d)
        row.detectable = detectable_effect(float(np.std(d, ddof=1)) if len(d) > 1 else float("nan"), len(d),
                                           result.interval_level)
    if result.family:
        for row, adjusted in zip(result.compared, holm([r.p_value for r in result.compared])):
            row.p_holm = adjusted
    return result


def _value_at(run: Run, metric: str, step: int | None) -> float:
    series = run.scalars[metric]
    return series[max(series) if step is None else step]


def _resolve_step(runs: Sequence[Run], metric: str, step: str | int) -> tuple[int | None, str]:
    """The step to read (None: each run's last) and how the table names it."""
    if str(step) == "final":
        return None, "each run's last logged step"
    logged = {r.path: set(r.scalars[metric]) for r in runs}
    if str(step) == "last":
        common = set.intersection(*logged.values())
        if not common:
            spans = sorted({(min(s), max(s)) for s in logged.values()})
            raise CompareError(f"no step at which every run logged {metric} (first/last steps per run: {spans}); "
                               "fix: --step final (each run's own last value) or --step N")
        return max(common), "the last step every run logged"
    try:
        wanted = int(step)
    except ValueError:
        raise CompareError(f"--step {step!r}: use last, final or a step number") from None
    missing = [str(p) for p, s in logged.items() if wanted not in s]
    if missing:
        common = sorted(set.intersection(*logged.values()))
        raise CompareError(f"{len(missing)} run(s) did not log {metric} at step {wanted}: {missing}; steps every run "
                           f"logged: {common[-10:]}; fix: --step last or one of those")
    return wanted, "the step asked for"


def _check_metric(runs: Sequence[Run], metric: str) -> None:
    missing = [r for r in runs if not r.scalars.get(metric)]
    if not missing:
        return
    tags = sorted({t for r in runs for t in r.scalars})
    near = difflib.get_close_matches(metric, tags, n=5, cutoff=0.5)
    hint = f" Close tags: {near}." if near else ""
    if len(missing) == len(runs):
        raise CompareError(f"no run logged {metric}.{hint} Fix: --metric one of the logged tags (val/reward/mean; "
                           "val/sampled/... needs data.val_samples > 0; validation needs trainer.val_check_interval "
                           "and validate_first=true for step 0)")
    raise CompareError(f"{len(missing)} of {len(runs)} runs did not log {metric}: "
                       f"{[str(r.path) for r in missing]}.{hint} Fix: rerun them (a crashed or unfinished run), "
                       "or remove them from the sweep directory")


def _first_logged(runs: Sequence[Run], metric: str) -> list[Run]:
    """For ``metric = "A|B|..."``: each run with ``metric`` standing for the first of the tags it logged (the
    DPA game's submitted line ``val/final/strict`` against the generator-only proposal ``val/reward/strict``)."""
    tags = metric.split("|")
    return [Run(r.path, r.overrides, r.seed, {**r.scalars, metric: next(
        (r.scalars[t] for t in tags if r.scalars.get(t)), {})}) for r in runs]


def compare(runs: Sequence[Run] | str | os.PathLike | Sequence[str | os.PathLike], baseline: str | Iterable[str] | Mapping[str, str], metric: str,
            step: str | int = "last", control: str | Iterable[str] | Mapping[str, str] | None = None,
            resamples: int = 10_000, seed: int = 0, level: float = 0.95, start: bool = False,
            interval: str = "t", family: bool = False) -> Comparison:
    """Each arm of ``runs`` (or of the sweep directories) against its baseline on ``metric`` at ``step``,
    paired by seed (module docstring; ``metric`` may be ``A|B``: per run the first tag it logged); with
    ``start``, each baseline's frozen start too (its runs at the first step all of them logged, minus the same
    runs at ``step``); ``interval`` and ``family`` as in the module docstring. Raises :class:`CompareError`, naming the fix,
    when there are no runs, no baseline arm, a run without the metric or the step, or seeds without a partner
    (or, with ``start``, a baseline whose runs share no step)."""
    if interval not in INTERVALS:
        raise CompareError(f"--interval {interval!r}: use one of {', '.join(INTERVALS)}")
    items = [runs] if isinstance(runs, (str, os.PathLike)) else list(runs)
    runs = items if all(isinstance(r, Run) for r in items) else load_runs(items)
    if not runs:
        raise CompareError("no runs to compare; fix: give the sweep directory of a multirun")
    base_spec, control_spec = parse_spec(baseline), parse_spec(control)
    if not base_spec:
        raise CompareError("no baseline: name the baseline arm by its overrides, e.g. --baseline credit=grpo")
    if "|" in metric:
        runs = _first_logged(runs, metric)
    _check_metric(runs, metric)
    at, note = _resolve_step(runs, metric, step)
    grouped = arms(runs)
    overrides = {label: members[0].overrides for label, members in grouped.items()}
    bases = {label: o for label, o in overrides.items() if _matches(o, base_spec) and not _matches(o, control_spec)}
    if not bases:
        spec = " ".join(f"{k}={v}" for k, v in base_spec.items())
        raise CompareError(f"no arm matches the baseline {spec}; arms: {', '.join(grouped)}; fix: --baseline "
                           "KEY=VALUE naming one of these arms (or run the baseline into this sweep directory)")
    if control_spec and not any(_matches(o, control_spec) for o in overrides.values()):
        shown = " ".join(f"{k}={v}" for k, v in control_spec.items())
        raise CompareError(f"no arm matches the control {shown}; arms: {', '.join(grouped)}; fix: run the frozen "
                           "control into this sweep (e.g. method.optimizer.lr=0 with the same seeds) or drop --control")
    rows = [ArmResult(label, "baseline", label, [r.seed for r in grouped[label]],
                      [_value_at(r, metric, at) for r in grouped[label]], []) for label in bases]
    for label, members in grouped.items():
        if label in bases:
            continue
        base = baseline_of(overrides[label], bases, base_spec, control_spec)
        mine = {r.seed: r for r in members}
        theirs = {r.seed: r for r in grouped[base]}
        if set(mine) != set(theirs):
            only_arm = sorted(set(mine) - set(theirs), key=_seed_key)
            only_base = sorted(set(theirs) - set(mine), key=_seed_key)
            unpaired = [str(mine[s].path) for s in only_arm] + [str(theirs[s].path) for s in only_base]
            what = [f"seeds {only_arm} of arm {label!r} have no run of its baseline {base!r}"] if only_arm else []
            what += [f"seeds {only_base} of the baseline {base!r} have no run of arm {label!r}"] if only_base else []
            raise CompareError(f"unpaired seeds: {'; '.join(what)} (runs: {unpaired}); fix: run the missing seeds "
                               "(seed=...), or remove the unpaired runs")
        seeds = sorted(mine, key=_seed_key)
        x = [_value_at(mine[s], metric, at) for s in seeds]
        y = [_value_at(theirs[s], metric, at) for s in seeds]
        role = "control" if _matches(overrides[label], control_spec) else "arm"
        rows.append(ArmResult(label, role, base, seeds, x, y))
    starts: dict[str, int] = {}
    for label in bases if start else ():
        members = grouped[label]
        common = set.intersection(*(set(r.scalars[metric]) for r in members))
        if not common:
            raise CompareError(f"the runs of the baseline {label!r} share no logged step of {metric}, so it has no "
                               "frozen start; fix: drop --start, or rerun them with the same validation steps")
        first = starts[label] = min(common)
        x = [_value_at(r, metric, first) for r in members]
        y = [_value_at(r, metric, at) for r in members]
        rows.append(ArmResult(f"{label} at step {first}", "start", label, [r.seed for r in members], x, y))
    step_label = "final" if at is None else str(at)
    return _estimate(Comparison(metric, step_label, note, base_spec, control_spec, resamples, seed, level, rows,
                                grouped, starts or None, interval, family))


# ---------------------------------------------------------------------------------------------- output
def _steps(start: Mapping[str, int]) -> str:
    steps = sorted(set(start.values()))
    return str(steps[0]) if len(steps) == 1 else "/".join(f"{step} ({label})" for label, step in start.items())


def _name(row: ArmResult) -> str:
    """A row's label as the table and the plot show it: the control and the frozen start marked."""
    return {"control": f"{row.label} (control)", "start": f"{row.label} (frozen start)"}.get(row.role, row.label)


def _interval_name(result: Comparison) -> str:
    level = f"{100 * result.interval_level:.4g} %"
    if result.interval == "t":
        return f"{level} Student-t interval"
    return f"{level} expanded percentile bootstrap interval ({result.resamples} resamples of the seeds, seed {result.seed})"


def _p(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}" if value >= 0.001 else "<0.001"


def table(result: Comparison) -> str:
    """The comparison as a markdown table with a header line stating the metric, step, baseline, pairing,
    interval and family, one row per arm with its per-seed differences, p-value(s), the smallest effect the
    design detects and the verdict in words, and a closing line on what the design could detect."""
    spec = " ".join(f"{k}={v}" for k, v in result.baseline.items())
    control = " ".join(f"{k}={v}" for k, v in result.control.items())
    step = "final" if result.step == "final" else f"step {result.step}"
    alpha = 1 - result.level
    family = (f" Family of {len(result.compared)} comparisons: simultaneous (Bonferroni) intervals, verdicts by "
              f"Holm-adjusted p < {alpha:.2g}." if result.family else "")
    lines = [f"`{result.metric}` at {step} ({result.step_note}); baseline {spec}"
             + (f", frozen control {control}" if control else "")
             + (f", frozen start = the baseline's runs at step {_steps(result.start)}" if result.start else "")
             + f"; paired by seed; {_interval_name(result)} of the mean paired difference; p: paired t-test; "
             f"detectable: the smallest true difference found with {POWER:.0%} power at alpha "
             f"{1 - result.interval_level:.2g}" + (" (Bonferroni's, what Holm's strictest step needs)" if
                                                   result.family else "") + f", at the observed spread.{family}", "",
             f"| arm | seeds | arm mean | baseline mean | difference | {100 * result.interval_level:.4g} % interval "
             f"| per-seed differences | p |{' Holm p |' if result.family else ''} detectable | verdict |",
             f"|---|---:|---:|---:|---:|---|---|---:|{'---:|' if result.family else ''}---:|---|"]
    for row in result.rows:
        mean = sum(row.values) / len(row.values)
        if row.role == "baseline":
            blanks = " |" * (8 if result.family else 7)
            lines.append(f"| {row.label} (baseline) | {len(row.seeds)} | {mean:.4f} |{blanks}")
            continue
        base = sum(row.baseline_values) / len(row.baseline_values)
        name = _name(row) + (f" vs {row.baseline}" if sum(r.role == "baseline" for r in result.rows) > 1 else "")
        seeds = " ".join(f"{s}:{d:+.4f}" for s, d in zip(row.seeds, row.differences))
        holm_cell = f" {_p(row.p_holm)} |" if result.family else ""
        detect = ("" if row.detectable is None else "n/a (no spread)" if row.detectable == 0
                  else f"{row.detectable:.4f}")
        lines.append(f"| {name} | {len(row.seeds)} | {mean:.4f} | {base:.4f} | {row.difference:+.4f} | "
                     f"[{row.low:+.4f}, {row.high:+.4f}] | {seeds} | {_p(row.p_value)} |{holm_cell} {detect} | "
                     f"{row.verdict(alpha)} |")
    few = min(len(r.seeds) for r in result.rows)
    if few < 2:
        lines += ["", "One seed: no interval, no test; the row says nothing about a difference."]
    return "\n".join(lines)


def plot(result: Comparison):
    """Two panels: each arm's curve of the metric over steps (the mean over seeds at the steps all its runs
    logged, with a min-max band; the control dashed) and each arm's mean paired difference to its baseline
    with its interval. Returns a matplotlib Figure (no pyplot state)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.2), dpi=110)
    curves, diffs = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    roles = {r.label: r.role for r in result.rows}
    colors = {label: f"C{i % 10}" for i, label in enumerate(result.runs)}  # one colour per arm in both panels
    for label, members in result.runs.items():
        series = [r.scalars[result.metric] for r in members]
        steps = sorted(set.intersection(*(set(s) for s in series)))
        if not steps:  # its runs share no logged step (different step counts): no mean curve
            continue
        values = np.array([[s[t] for t in steps] for s in series])
        style = {"baseline": {"lw": 2.2, "color": colors[label]}, "control": {"ls": "--", "color": "grey"}}.get(
            roles[label], {"color": colors[label]})
        tag = {"baseline": " (baseline)", "control": " (control)"}.get(roles[label], "")
        (line,) = curves.plot(steps, values.mean(0), marker=".", label=f"{label}{tag} (n={len(members)})", **style)
        curves.fill_between(steps, values.min(0), values.max(0), alpha=0.15, color=line.get_color())
    if result.step != "final":
        curves.axvline(int(result.step), color="black", lw=0.6, ls=":")
    curves.set_xlabel("step")
    curves.set_ylabel(result.metric)
    curves.set_title("mean over seeds, band: min-max", fontsize=9)
    curves.legend(fontsize=7)
    curves.grid(alpha=0.3)
    compared = [r for r in result.rows if r.role != "baseline"]
    for y, row in enumerate(compared):
        frozen = row.role in ("control", "start")
        color = "grey" if frozen else colors.get(row.label, f"C{y % 10}")
        diffs.errorbar([row.difference], [y], xerr=[[row.difference - row.low], [row.high - row.difference]],
                       fmt="s" if frozen else "o", color=color, capsize=4)
        diffs.scatter([a - b for a, b in zip(row.values, row.baseline_values)], [y] * len(row.seeds), s=10,
                      color=color, alpha=0.4)
    diffs.axvline(0.0, color="black", lw=0.8)
    diffs.set_yticks(range(len(compared)), [_name(r) for r in compared], fontsize=8)
    diffs.set_ylim(-0.6, max(len(compared) - 0.4, 0.6))
    step = "final" if result.step == "final" else f"step {result.step}"
    diffs.set_xlabel(f"{result.metric} - baseline at {step}")
    diffs.set_title(f"paired difference, {_interval_name(result).split(' (')[0]} (dots: seeds)", fontsize=9)
    diffs.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def slug(metric: str) -> str:
    return metric.replace("/", "_").replace("@", "at").replace("|", "_or_")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="lit-credit-compare", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dirs", nargs="+", metavar="SWEEP_DIR", help="the sweep directory (runs with "
                        ".hydra/overrides.yaml and tensorboard/); several are read as one")
    parser.add_argument("--baseline", nargs="+", required=True, help="the baseline arm's overrides, e.g. credit=grpo")
    parser.add_argument("--metric", default="val/reward/mean", help="a logged scalar tag (default val/reward/mean); "
                        "A|B: per run the first of these tags it logged")
    parser.add_argument("--step", default="last", help="last (default: the last step every run logged), final "
                                                       "(each run's last value) or a step number")
    parser.add_argument("--control", nargs="+", default=None, help="the frozen control's overrides, e.g. "
                                                                    "method.optimizer.lr=0")
    parser.add_argument("--start", action="store_true", help="add each baseline's frozen start: its runs at their "
                        "first logged step (for held-out metrics, what a frozen control reads at every step)")
    parser.add_argument("--out", default=None, help="write the table here (default: the first "
                        "SWEEP_DIR/compare/<metric>.md)")
    parser.add_argument("--plot", default=None, help="write the figure here (default: the first "
                        "SWEEP_DIR/compare/<metric>.png)")
    parser.add_argument("--interval", choices=INTERVALS, default="t", help="t (default: Student t on the paired "
                        "differences, holds its level at 3-10 seeds) or bootstrap (expanded percentile, 10+ seeds)")
    parser.add_argument("--family", action="store_true", help="the call's comparisons are one family: Holm-adjusted "
                        "p-values decide the verdicts, the intervals are simultaneous (Bonferroni)")
    parser.add_argument("--level", type=float, default=0.95, help="the confidence level (default 0.95)")
    parser.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples (--interval bootstrap)")
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (--interval bootstrap)")
    args = parser.parse_args(argv)
    try:
        result = compare(args.sweep_dirs, args.baseline, args.metric, args.step, args.control, args.resamples,
                         args.seed, args.level, start=args.start, interval=args.interval, family=args.family)
    except CompareError as err:
        raise SystemExit(f"lit-credit-compare: {err}") from None
    text = table(result)
    default = Path(args.sweep_dirs[0]) / "compare" / slug(args.metric)
    out, png = Path(args.out or default.with_suffix(".md")), Path(args.plot or default.with_suffix(".png"))
    for path in (out, png):
        path.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    plot(result).savefig(png)
    print(text)
    print(f"\ntable: {out}\nplot: {png}")


if __name__ == "__main__":
    main()

