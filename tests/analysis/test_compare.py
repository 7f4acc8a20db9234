"""The comparison protocol (lit_credit.analysis.compare): the paired t interval, test, detectable effect,
Holm and the expanded bootstrap by hand (their coverage: tests/analysis/test_coverage.py), arms from overrides,
pairing by seed, baselines per context, the table, the errors, and the command on real TensorBoard event files
in the sweep layout (and, slow, on a real `lit-credit -m` sweep)."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from torch.utils.tensorboard import SummaryWriter

from lit_credit.analysis.compare import (
    CompareError,
    Run,
    arms,
    baseline_of,
    compare,
    detectable_effect,
    holm,
    load_runs,
    main,
    paired_bootstrap,
    paired_t,
    parse_spec,
    plot,
    t_test,
    table,
)
from lit_credit.analysis.records import write_shard
from lit_credit.analysis.report import report
from tests.conftest import FAST_MODEL, FAST_TASK

ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"


def write_run(root: Path, name: str, overrides: list[str], series: dict[str, dict[int, float]]) -> Path:
    """A run directory as `lit-credit -m` leaves it: .hydra/overrides.yaml and TensorBoard events written by
    the real SummaryWriter."""
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    with SummaryWriter(run / "tensorboard") as writer:
        for tag, values in series.items():
            for step, value in values.items():
                writer.add_scalar(tag, value, step)
    return run


def run(overrides: dict[str, str], seed: str, values: dict[int, float], metric: str = "val/acc") -> Run:
    return Run(Path(f"/sweep/{'-'.join(overrides.values())}-{seed}"), dict(overrides), seed, {metric: values})


# Values exactly representable in float32 (TensorBoard stores float32), at steps 0 and 10.
# baseline credit=grpo    seeds 0, 1, 2 at step 10: 0.5, 0.25, 0.75
# credit=slca:            0.75, 0.5, 0.75  -> d = 0.25, 0.25, 0     (mean 1/6)
# credit=rloo:            0.75, 0.5, 1.0   -> d = 0.25, 0.25, 0.25  (mean 0.25)
# control lr=0:           0.5, 0.25, 0.5   -> d = 0, 0, -0.25       (mean -1/12)
SWEEP = {
    "credit=grpo": [0.5, 0.25, 0.75],
    "credit=slca": [0.75, 0.5, 0.75],
    "credit=rloo": [0.75, 0.5, 1.0],
    "credit=grpo method.optimizer.lr=0": [0.5, 0.25, 0.5],
}


@pytest.fixture
def sweep(tmp_path):
    i = 0
    for arm, finals in SWEEP.items():
        for seed in range(len(finals)):
            # job numbers as Hydra gives them; seeds in reverse order so pairing by order would be wrong
            write_run(tmp_path, str(i), ["experiment=grpo_arith", *arm.split(), f"seed={2 - seed}"],
                      {"val/acc": {0: 0.25, 10: finals[2 - seed]}, "train/reward/mean": {0: 0.0, 1: 0.5}})
            i += 1
    return tmp_path


# ---------------------------------------------------------------------------------------------- statistics
# The SWEEP's SLCA differences d = 0.25, 0.25, 0 by hand: mean 1/6; deviations 1/12, 1/12, -1/6, so
# s^2 = (1 + 1 + 4) / 144 / 2 = 3 / 144, s = sqrt(3) / 12, s / sqrt(3) = 1/12. t_{2, 0.975} = 4.302653 (tables),
# half-width 4.302653 / 12 = 0.358554: [1/6 - 0.358554, 1/6 + 0.358554] = [-0.191888, +0.525221].
# The t statistic is (1/6) / (1/12) = 2; with 2 degrees of freedom P(T > t) = (1 - t / sqrt(t^2 + 2)) / 2, so
# p = 1 - 2 / sqrt(6) = 0.183503.
T975_DF2 = 4.302653


def test_the_t_interval_and_test_by_hand():
    mean, low, high = paired_t([0.25, 0.25, 0.0])
    assert mean == pytest.approx(1 / 6)
    assert (low, high) == (pytest.approx(1 / 6 - T975_DF2 / 12, abs=1e-6), pytest.approx(1 / 6 + T975_DF2 / 12, abs=1e-6))
    assert t_test([0.25, 0.25, 0.0]) == pytest.approx(1 - 2 / math.sqrt(6))
    # two seeds {0, 1}: mean 0.5, s = sqrt(0.5), s / sqrt(2) = 0.5, t_{1, 0.975} = 12.706205: 0.5 +- 6.353103
    assert paired_t([0.0, 1.0])[1:] == (pytest.approx(0.5 - 6.353103, abs=1e-5), pytest.approx(0.5 + 6.353103, abs=1e-5))
    # with 1 degree of freedom P(T > t) = 1/2 - atan(t) / pi: t = 1 gives p = 2 (1/2 - 1/4) = 0.5
    assert t_test([0.0, 1.0]) == pytest.approx(0.5)


def test_equal_differences_give_a_zero_width_interval_at_that_value():
    assert paired_t([0.3] * 5) == (pytest.approx(0.3), pytest.approx(0.3), pytest.approx(0.3))
    assert paired_t([-1.5]) == (-1.5, -1.5, -1.5)
    assert t_test([0.3] * 5) == 0.0 and t_test([0.0] * 5) == 1.0 and t_test([-1.5]) is None


def test_the_detectable_effect_has_its_power():
    """delta / sd for 80 % power at alpha 0.05 from the noncentral t: 3.264 at 3 seeds, 1.682 at 5, 0.996 at 10;
    the normal approximation (z_0.975 + z_0.8) / sqrt(n) = 2.8016 / sqrt(n) is its large-n limit. Checked by
    simulation: 20 000 normal designs at that delta reject 80 % +- 1 % of the time (binomial sd 0.28 %)."""
    import numpy as np
    from scipy import stats

    assert [round(detectable_effect(1.0, n), 3) for n in (3, 5, 10)] == [3.264, 1.682, 0.996]
    assert detectable_effect(1.0, 400) == pytest.approx(2.8016 / 20, rel=0.01)
    assert detectable_effect(0.5, 5) == pytest.approx(0.5 * detectable_effect(1.0, 5))
    assert detectable_effect(0.0, 5) == 0.0 and detectable_effect(1.0, 1) is None
    rng = np.random.default_rng(0)
    for n in (2, 3, 5, 10):
        d = rng.normal(detectable_effect(1.0, n), 1.0, size=(20_000, n))
        t = d.mean(1) / (d.std(1, ddof=1) / np.sqrt(n))
        assert abs((np.abs(t) > stats.t.ppf(0.975, n - 1)).mean() - 0.8) < 0.01, n


def test_holm_by_hand():
    # sorted 0.01, 0.03, 0.04 (m = 3): 3 x 0.01 = 0.03, max(0.03, 2 x 0.03) = 0.06, max(0.06, 1 x 0.04) = 0.06
    assert holm([0.01, 0.04, None, 0.03]) == [pytest.approx(0.03), pytest.approx(0.06), None, pytest.approx(0.06)]
    assert holm([0.5, 0.9]) == [pytest.approx(1.0), pytest.approx(1.0)]  # min(1, 2 x 0.5), then max with 0.9
    assert holm([]) == []


def test_the_expanded_bootstrap_is_refused_below_ten_seeds_and_widens_the_percentile():
    with pytest.raises(CompareError, match=r"needs at least 10 seeds.*fix: --interval t"):
        paired_bootstrap([0.1, -0.2, 0.3, 0.05, 0.15])
    d = [0.1, -0.2, 0.3, 0.05, 0.15, 0.0, 0.2, -0.1, 0.12, 0.08]
    mean, low, high = paired_bootstrap(d)
    assert mean == pytest.approx(0.07) and paired_bootstrap(d) == paired_bootstrap(d)  # seeded
    # at 10 seeds a' = 2 Phi(sqrt(10/9) t_{9, 0.025}) = 0.0171: wider than the plain 95 % percentile, and close to t
    import numpy as np
    means = np.asarray(d)[np.random.default_rng(0).integers(0, 10, size=(10_000, 10))].mean(1)
    plain = np.percentile(means, [2.5, 97.5])
    assert low < plain[0] and high > plain[1]
    t_low, t_high = paired_t(d)[1:]
    assert abs((high - low) / (t_high - t_low) - 1) < 0.1
    with pytest.raises(CompareError, match="no paired differences"):
        paired_t([])
    with pytest.raises(CompareError, match="NaN/inf"):
        paired_t([0.1, float("nan")])


# ---------------------------------------------------------------------------------------------- arms, pairing
def test_arms_group_by_overrides_minus_seed_and_are_labelled_by_what_varies():
    runs = [run({"experiment": "x", "credit": c, "reward.judge.noise": n}, s, {0: 0.0})
            for c in ("grpo", "slca") for n in ("0.5", "1") for s in ("1", "0")]
    grouped = arms(runs)
    # experiment=x is common to all: not in a label; the seeds are pooled and sorted
    assert list(grouped) == ["credit=grpo reward.judge.noise=0.5", "credit=grpo reward.judge.noise=1",
                             "credit=slca reward.judge.noise=0.5", "credit=slca reward.judge.noise=1"]
    assert all([r.seed for r in members] == ["0", "1"] for members in grouped.values())
    assert list(arms([run({"credit": "grpo"}, "0", {0: 0.0})])) == ["(defaults)"]
    with pytest.raises(CompareError, match=r"arm '\(defaults\)' has several runs with seed 0"):
        arms([run({"credit": "grpo"}, "0", {0: 0.0}), run({"credit": "grpo"}, "0", {0: 1.0})])


def test_numbers_are_one_value_however_spelled():
    assert parse_spec("method.optimizer.lr=0 credit=grpo") == parse_spec(["method.optimizer.lr=0.0", "credit=grpo"])
    assert parse_spec({"lr": 1e-4}) == parse_spec("lr=0.0001") == {"lr": "0.0001"}
    # what a user types (credit.unbiased=false) names the arm Hydra's multirun wrote as credit.unbiased=False
    assert parse_spec("unbiased=false eps=1e-8") == parse_spec({"unbiased": False, "eps": "1e-08"}) \
        == {"unbiased": "false", "eps": "1e-08"}
    assert parse_spec("tag=False_run") == {"tag": "False_run"}
    with pytest.raises(CompareError, match="KEY=VALUE"):
        parse_spec("grpo")


def test_each_arm_is_compared_with_the_baseline_of_its_other_overrides():
    bases = {"grpo@0.5": {"credit": "grpo", "noise": "0.5", "lr": "0.0001"},
             "grpo@1": {"credit": "grpo", "noise": "1", "lr": "0.0001"}}
    base, control = {"credit": "grpo"}, {"lr": "0"}
    assert baseline_of({"credit": "slca", "noise": "1", "lr": "0.0001"}, bases, base, control) == "grpo@1"
    # the frozen control at noise 0.5 (lr 0, any credit) is compared with GRPO at noise 0.5 (lr 1e-4)
    assert baseline_of({"credit": "slca", "noise": "0.5", "lr": "0"}, bases, base, control) == "grpo@0.5"
    with pytest.raises(CompareError, match=r"no baseline arm \(credit=grpo\) with the same other overrides as this "
                                           r"arm \(noise=0.25\)"):
        baseline_of({"credit": "slca", "noise": "0.25", "lr": "0.0001"}, bases, base, control)


def test_runs_are_paired_by_seed(sweep):
    result = compare(sweep, "credit=grpo", "val/acc", control="method.optimizer.lr=0")
    rows = {r.label: r for r in result.rows}
    assert [r.role for r in result.rows] == ["baseline", "arm", "arm", "control"]
    slca = rows["credit=slca"]
    # the runs were written with seeds 2, 1, 0: paired by seed, not by job number
    assert slca.seeds == ["0", "1", "2"] and slca.values == [0.75, 0.5, 0.75] and slca.baseline_values == [0.5, 0.25, 0.75]
    assert slca.difference == pytest.approx(1 / 6) and slca.excludes_zero is False
    assert (slca.low, slca.high) == (pytest.approx(-0.191888, abs=1e-6), pytest.approx(0.525221, abs=1e-6))
    assert slca.p_value == pytest.approx(1 - 2 / math.sqrt(6)) and slca.p_holm is None
    assert (rows["credit=rloo"].low, rows["credit=rloo"].high, rows["credit=rloo"].excludes_zero) == (0.25, 0.25, True)
    control = rows["credit=grpo method.optimizer.lr=0"]
    # d = 0, 0, -0.25: the same spread as SLCA's, centred at -1/12; t = -1, p = 1 - 1 / sqrt(3)
    assert (control.difference, control.low, control.high) == (
        pytest.approx(-1 / 12), pytest.approx(-1 / 12 - T975_DF2 / 12, abs=1e-6), pytest.approx(-1 / 12 + T975_DF2 / 12, abs=1e-6))
    assert control.p_value == pytest.approx(1 - 1 / math.sqrt(3))
    assert result.step == "10"  # the last step every run logged val/acc


def test_the_table(sweep):
    text = table(compare(sweep, "credit=grpo", "val/acc", control="method.optimizer.lr=0"))
    lines = text.splitlines()
    assert lines[0].startswith("`val/acc` at step 10 (the last step every run logged); baseline credit=grpo, frozen "
                               "control method.optimizer.lr=0; paired by seed; 95 % Student-t interval")
    assert "detectable: the smallest true difference found with 80% power at alpha 0.05" in lines[0]
    # detectable = 3.264044 sd (3 seeds) x sqrt(3) / 12 = 0.471124 for SLCA and the control; RLOO has no spread (sd 0): n/a
    assert lines[2:] == [
        "| arm | seeds | arm mean | baseline mean | difference | 95 % interval | per-seed differences | p | "
        "detectable | verdict |",
        "|---|---:|---:|---:|---:|---|---|---:|---:|---|",
        # baseline mean (0.5 + 0.25 + 0.75) / 3 = 0.5
        "| credit=grpo (baseline) | 3 | 0.5000 | | | | | | | |",
        # slca mean (0.75 + 0.5 + 0.75) / 3 = 0.6667; d mean 1/6; interval and p as derived above
        "| credit=slca | 3 | 0.6667 | 0.5000 | +0.1667 | [-0.1919, +0.5252] | 0:+0.2500 1:+0.2500 2:+0.0000 | "
        "0.184 | 0.4711 | no difference larger than 0.5252 |",
        "| credit=rloo | 3 | 0.7500 | 0.5000 | +0.2500 | [+0.2500, +0.2500] | 0:+0.2500 1:+0.2500 2:+0.2500 | "
        "<0.001 | n/a (no spread) | higher (by 0.2500) |",
        # control mean (0.5 + 0.25 + 0.5) / 3 = 0.4167; d = 0, 0, -0.25
        "| credit=grpo method.optimizer.lr=0 (control) | 3 | 0.4167 | 0.5000 | -0.0833 | [-0.4419, +0.2752] | "
        "0:+0.0000 1:+0.0000 2:-0.2500 | 0.423 | 0.4711 | no difference larger than 0.4419 |",
    ]


def test_a_family_gets_holm_verdicts_and_simultaneous_intervals(sweep):
    """Three comparisons (SLCA, RLOO, the control): p = 0.1835, 0, 0.4226; Holm: 3 x 0 = 0, max(0, 2 x 0.1835) =
    0.3670, max(0.3670, 0.4226) = 0.4226. The intervals are at 1 - 0.05 / 3 = 98.33 %: t_{2, 0.99167} = 7.6488
    (scipy), SLCA 1/6 +- 7.6488 / 12."""
    from scipy import stats

    result = compare(sweep, "credit=grpo", "val/acc", control="method.optimizer.lr=0", family=True)
    rows = {r.label: r for r in result.rows}
    assert result.interval_level == pytest.approx(1 - 0.05 / 3)
    slca = rows["credit=slca"]
    assert slca.p_holm == pytest.approx(2 * (1 - 2 / math.sqrt(6)))
    assert rows["credit=rloo"].p_holm == 0.0
    assert rows["credit=grpo method.optimizer.lr=0"].p_holm == pytest.approx(1 - 1 / math.sqrt(3))
    half = stats.t.ppf(1 - 0.05 / 6, 2) / 12
    assert half == pytest.approx(7.6488 / 12, abs=1e-4) and slca.high == pytest.approx(1 / 6 + half)
    text = table(result)
    assert "Family of 3 comparisons: simultaneous (Bonferroni) intervals, verdicts by Holm-adjusted p < 0.05." in text
    assert "| 98.33 % interval |" in text and "| p | Holm p | detectable | verdict |" in text
    # detectable at Bonferroni's alpha 0.05 / 3 (what Holm's strictest step needs): the same sd 0.1443 of SLCA's
    # differences, 5.67 sd at 3 seeds instead of the 3.26 sd (0.4711) at alpha 0.05
    assert "power at alpha 0.017 (Bonferroni's, what Holm's strictest step needs)" in text
    assert "| 0.184 | 0.367 | 0.8180 | no difference larger than" in text
    assert slca.detectable / 0.4711 == pytest.approx(5.67 / 3.26, rel=2e-3)


def test_the_frozen_start_is_the_baselines_runs_at_their_first_step(sweep):
    """Every run logged val/acc = 0.25 at step 0; the baseline's seeds read 0.5, 0.25, 0.75 at step 10, so the
    start's paired differences are -0.25, 0, -0.5: mean -0.25, s = 0.25, s / sqrt(3) = 0.144338, half-width
    4.302653 x 0.144338 = 0.621034."""
    result = compare(sweep, "credit=grpo", "val/acc", control="method.optimizer.lr=0", start=True)
    start = result.rows[-1]
    assert (start.label, start.role, start.baseline) == ("credit=grpo at step 0", "start", "credit=grpo")
    assert result.start == {"credit=grpo": 0}
    assert start.values == [0.25, 0.25, 0.25] and start.baseline_values == [0.5, 0.25, 0.75]
    assert start.difference == pytest.approx(-0.25)
    assert (start.low, start.high) == (pytest.approx(-0.871034, abs=1e-6), pytest.approx(0.371034, abs=1e-6))
    text = table(result)
    assert "frozen start = the baseline's runs at step 0" in text.splitlines()[0]
    assert "| credit=grpo at step 0 (frozen start) | 3 | 0.2500 | 0.5000 | -0.2500 |" in text
    assert compare(sweep, "credit=grpo", "val/acc").start is None


def test_the_frozen_start_is_read_at_the_baselines_own_first_step():
    """The baseline validated at steps 0 and 10, the arm at 5 and 10: the start is the baseline's step 0
    (0.25 - 0.5 = -0.25 for both seeds), not the first step all runs share (10, which would give 0)."""
    base = [run({"credit": "grpo"}, s, {0: 0.25, 10: 0.5}) for s in ("0", "1")]
    arm = [run({"credit": "slca"}, s, {5: 0.25, 10: 0.75}) for s in ("0", "1")]
    result = compare(base + arm, "credit=grpo", "val/acc", start=True)
    start = result.rows[-1]
    assert result.start == {"credit=grpo": 0} and start.label == "credit=grpo at step 0"
    assert (start.difference, start.low, start.high) == (-0.25, -0.25, -0.25)
    uneven = [run({"credit": "grpo"}, "0", {0: 0.25, 10: 0.5}), run({"credit": "grpo"}, "1", {5: 0.25, 15: 0.5})]
    with pytest.raises(CompareError, match=r"share no logged step.*fix: drop --start"):
        compare(uneven, "credit=grpo", "val/acc", step="final", start=True)


def test_a_metric_alternative_reads_each_runs_first_logged_tag():
    """``val/final|val/acc``: the DPA arm logged val/final (0.75, 1.0) and val/acc (0.5, 0.5); the baseline only
    val/acc (0.5, 0.75). The arm reads val/final: d = 0.75 - 0.5, 1.0 - 0.75 = 0.25 both; with val/acc alone
    d = 0, -0.25."""
    base = [run({"method": "grpo"}, s, {10: v}) for s, v in (("0", 0.5), ("1", 0.75))]
    arm = [Run(Path(f"/sweep/dpa-{s}"), {"method": "dpa"}, s, {"val/final": {10: f}, "val/acc": {10: 0.5}})
           for s, f in (("0", 0.75), ("1", 1.0))]
    either = compare(base + arm, "method=grpo", "val/final|val/acc").rows[1]
    assert (either.difference, either.low, either.high) == (0.25, 0.25, 0.25)
    assert compare(base + arm, "method=grpo", "val/acc").rows[1].difference == -0.125
    with pytest.raises(CompareError, match=r"did not log val/final\|val/nothing"):
        compare(base + arm, "method=grpo", "val/final|val/nothing")

def test_step_choices(sweep):
    lr0 = "method.optimizer.lr=0"
    assert compare(sweep, "credit=grpo", "val/acc", step=0, control=lr0).rows[1].difference == 0.0  # all 0.25
    final = compare(sweep, "credit=grpo", "val/acc", step="final", control=lr0)
    assert final.step == "final" and final.rows[1].difference == pytest.approx(1 / 6)
    # Without --control the lr=0 arm matches credit=grpo too: a second baseline (of the arms with lr=0)
    assert [r.role for r in compare(sweep, "credit=grpo", "val/acc").rows] == ["baseline", "baseline", "arm", "arm"]
    assert compare(sweep, "credit=grpo", "train/reward/mean").step == "1"


# ---------------------------------------------------------------------------------------------- errors
def test_errors_name_the_fix(sweep, tmp_path_factory):
    empty = tmp_path_factory.mktemp("empty")
    with pytest.raises(CompareError, match=r"no runs under .*fix: give the sweep directory"):
        compare(empty, "credit=grpo", "val/acc")
    with pytest.raises(CompareError, match=r"no arm matches the baseline credit=dr_grpo; arms: credit=grpo, "
                                           r"credit=slca, credit=rloo, credit=grpo method.optimizer.lr=0; fix: --baseline KEY=VALUE"):
        compare(sweep, "credit=dr_grpo", "val/acc")
    with pytest.raises(CompareError, match=r"no run logged val/ac\. Close tags: \['val/acc'\]"):
        compare(sweep, "credit=grpo", "val/ac")
    with pytest.raises(CompareError, match=r"did not log val/acc at step 5: .*fix: --step last"):
        compare(sweep, "credit=grpo", "val/acc", step=5)
    with pytest.raises(CompareError, match=r"no arm matches the control method.optimizer.lr=1"):
        compare(sweep, "credit=grpo", "val/acc", control="method.optimizer.lr=1")


def test_a_run_without_the_metric_and_unpaired_seeds_are_listed(sweep):
    write_run(sweep, "12", ["experiment=grpo_arith", "credit=slca", "seed=3"], {"train/reward/mean": {0: 0.0, 1: 0.5}})
    with pytest.raises(CompareError, match=r"1 of 13 runs did not log val/acc: \['.*/12'\]\. .*Fix: rerun them"):
        compare(sweep, "credit=grpo", "val/acc")
    # with the metric, seed 3 of credit=slca has no baseline partner
    with pytest.raises(CompareError, match=r"unpaired seeds: seeds \['3'\] of arm 'credit=slca' have no run of its "
                                           r"baseline 'credit=grpo' \(runs: \['.*/12'\]\); fix: run the missing seeds"):
        compare(sweep, "credit=grpo", "train/reward/mean")


def test_no_common_step_suggests_final(tmp_path):
    write_run(tmp_path, "0", ["credit=grpo", "seed=0"], {"val/acc": {0: 0.25, 20: 0.5}})
    write_run(tmp_path, "1", ["credit=dpa", "seed=0"], {"val/acc": {1: 0.25, 41: 0.75}})
    with pytest.raises(CompareError, match=r"no step at which every run logged val/acc .*fix: --step final"):
        compare(tmp_path, "credit=grpo", "val/acc")
    assert compare(tmp_path, "credit=grpo", "val/acc", step="final").rows[1].difference == 0.25


# ---------------------------------------------------------------------------------------------- the command
def test_the_command_prints_the_table_and_writes_it_and_the_plot(sweep, tmp_path_factory, capsys):
    out = tmp_path_factory.mktemp("out")
    args = [str(sweep), "--baseline", "credit=grpo", "--metric", "val/acc"]
    main([*args, "--control", "method.optimizer.lr=0", "--out", str(out / "t.md"), "--plot", str(out / "f.png")])
    printed = capsys.readouterr().out
    assert "| credit=rloo | 3 | 0.7500 | 0.5000 | +0.2500 | [+0.2500, +0.2500] |" in printed
    assert (out / "t.md").read_text() == table(compare(sweep, "credit=grpo", "val/acc",
                                                       control="method.optimizer.lr=0")) + "\n"
    assert (out / "f.png").read_bytes()[:8] == PNG
    # defaults: SWEEP_DIR/compare/<metric>.{md,png}; and the compare/ folder is not mistaken for a run
    main(args)
    assert (sweep / "compare" / "val_acc.png").read_bytes()[:8] == PNG and (sweep / "compare" / "val_acc.md").exists()
    assert len(load_runs(sweep)) == 12
    with pytest.raises(SystemExit, match="lit-credit-compare: no arm matches the baseline credit=nope"):
        main([str(sweep), "--baseline", "credit=nope", "--metric", "val/acc"])
    with pytest.raises(SystemExit, match="lit-credit-compare: --interval bootstrap needs at least 10 seeds"):
        main([*args, "--interval", "bootstrap"])
    main([*args, "--family", "--out", str(out / "family.md"), "--plot", str(out / "family.png")])
    assert "Holm p" in (out / "family.md").read_text()


def test_several_sweep_directories_are_read_as_one(sweep, tmp_path_factory, capsys):
    # A baseline run later into its own directory, beside the first sweep's arms: GRPO with a boolean as Hydra's
    # multirun writes it (credit.unbiased=False), named by the user as typed (false). Its finals 0.5, 0.5, 0.5;
    # the first sweep's credit=grpo (0.5, 0.25, 0.75) is now an arm: d = 0, -0.25, +0.25, mean 0; credit=rloo
    # (0.75, 0.5, 1.0): d = 0.25, 0, 0.5, mean 0.25.
    later = tmp_path_factory.mktemp("later")
    for seed in range(3):
        write_run(later, str(seed), ["experiment=grpo_arith", "credit=grpo", "credit.unbiased=False", f"seed={seed}"],
                  {"val/acc": {0: 0.25, 10: 0.5}})
    out = tmp_path_factory.mktemp("out")
    main([str(sweep), str(later), "--baseline", "credit=grpo", "credit.unbiased=false", "--metric", "val/acc",
          "--control", "method.optimizer.lr=0", "--out", str(out / "t.md"), "--plot", str(out / "f.png")])
    printed = capsys.readouterr().out
    assert "| credit=grpo credit.unbiased=false (baseline) | 3 | 0.5000 |" in printed
    assert "| credit=grpo | 3 | 0.5000 | 0.5000 | +0.0000 |" in printed
    assert "| credit=rloo | 3 | 0.7500 | 0.5000 | +0.2500 |" in printed
    assert len(load_runs([sweep, later])) == 15
    assert len(load_runs([sweep, sweep / "0", later])) == 15  # a run under two given directories counts once
    with pytest.raises(SystemExit, match=r"lit-credit-compare: no runs under .*empty"):
        main([str(sweep), str(tmp_path_factory.mktemp("empty")), "--baseline", "credit=grpo", "--metric", "val/acc"])


def test_the_plot_has_both_panels(sweep):
    fig = plot(compare(sweep, "credit=grpo", "val/acc", control="method.optimizer.lr=0"))
    curves, diffs = fig.axes
    assert len(curves.get_lines()) >= 4  # one curve per arm (plus the step marker)
    assert [t.get_text() for t in diffs.get_yticklabels()] == ["credit=slca", "credit=rloo",
                                                               "credit=grpo method.optimizer.lr=0 (control)"]


def test_the_report_adds_the_same_comparison(sweep, tmp_path_factory):
    # lit-credit-report on a sweep with credit records: its summary ends with compare()'s table, its plot beside
    for i in range(12):
        frame = pd.DataFrame({"step": [1, 1], "method": "grpo", "source": "policy", "group": [0, 0], "rollout": [0, 1],
                              "turn": [0, 0], "segment": "turn", "turn_type": "", "case": "", "turn_score": math.nan,
                              "score": [1.0, 0.0], "advantage": [0.5, -0.5], "advantage_min": [0.5, -0.5],
                              "advantage_max": [0.5, -0.5], "tokens": [3, 3], "excerpt": ""})
        write_shard(frame, sweep / str(i) / "records", "step-0000001")
    out = tmp_path_factory.mktemp("report")
    written = report(sweep, out, by="credit", baseline="credit=grpo", metric="val/acc", control="method.optimizer.lr=0")
    assert out / "comparison.png" in written and (out / "comparison.png").read_bytes()[:8] == PNG
    summary = (out / "summary.md").read_text()
    expected = table(compare(sweep, "credit=grpo", "val/acc", control="method.optimizer.lr=0"))
    assert f"## Comparison\n\n{expected}\n" in summary
    with pytest.raises(CompareError, match="needs both --baseline"):
        report(sweep, out, by="credit", metric="val/acc")


def test_the_console_script_is_declared():
    scripts = (ROOT / "pyproject.toml").read_text().split("[project.scripts]\n")[1].split("\n[")[0]
    assert 'lit-credit-compare = "lit_credit.analysis.compare:main"' in scripts.splitlines()


@pytest.mark.slow
def test_a_real_sweep_end_to_end(tmp_path, cache_dir):
    # 2 arms (GRPO, RLOO) x 2 seeds x 2 steps on the tiny model, validated greedy and with 2 samples per prompt,
    # then lit-credit-compare on the sampled pass@2.
    sweep = tmp_path / "sweep"
    bin_dir = Path(sys.executable).parent
    cmd = [str(bin_dir / "lit-credit"), "-m", "experiment=grpo_arith", "credit=grpo,rloo", "seed=0,1", *FAST_TASK,
           *FAST_MODEL, "trainer.max_steps=2", "trainer.val_check_interval=2", "data.prompts_per_step=4",
           "data.sampling.n=4", "data.val_prompts=4", "data.val_samples=2", "callbacks=none",
           f"paths.cache_dir={cache_dir}", f"hydra.sweep.dir={sweep}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    compare_cmd = bin_dir / "lit-credit-compare"
    head = [str(compare_cmd)] if compare_cmd.exists() else [sys.executable, "-m", "lit_credit.analysis.compare"]
    shown = subprocess.run([*head, str(sweep), "--baseline", "credit=grpo", "--metric", "val/sampled/pass@2"],
                           capture_output=True, text=True, env=env, timeout=300)
    assert shown.returncode == 0, shown.stderr[-3000:]
    # validations before training (index 0) and after step 2 (Lightning's index 1, as step 2's training metrics)
    assert "`val/sampled/pass@2` at step 1 (the last step every run logged); baseline credit=grpo" in shown.stdout
    assert "| credit=grpo (baseline) | 2 |" in shown.stdout and "| credit=rloo | 2 |" in shown.stdout
    assert (sweep / "compare" / "val_sampled_passat2.png").read_bytes()[:8] == PNG
    # the same seed sees the same stream: at step 0 (before any update) both arms are the same policy, so the
    # paired differences are exactly 0
    result = compare(sweep, "credit=grpo", "val/sampled/pass@2", step=0)
    assert result.rows[1].difference == 0.0 and result.rows[1].low == result.rows[1].high == 0.0
