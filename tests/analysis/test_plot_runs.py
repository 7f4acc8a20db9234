"""scripts/plot_runs.py on a sweep directory of real TensorBoard event files."""
from __future__ import annotations

import pytest
import yaml
from torch.utils.tensorboard import SummaryWriter

from scripts.plot_runs import load_sweep, plot, summarise


def fake_sweep(root, runs):
    for i, (overrides, values) in enumerate(runs):
        run = root / str(i)
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
        with SummaryWriter(run / "tensorboard") as writer:
            for step, value in enumerate(values):
                writer.add_scalar("val/acc", value, step)


def test_groups_by_override_and_summarises_final_values(tmp_path):
    fake_sweep(tmp_path, [(["credit=grpo", "seed=0"], [0.1, 0.2]), (["credit=grpo", "seed=1"], [0.1, 0.4]),
                          (["credit=slca", "seed=0"], [0.1, 0.5])])
    groups = load_sweep(tmp_path, "val/acc", "credit")
    assert sorted(groups) == ["grpo", "slca"] and len(groups["grpo"]) == 2
    table = summarise(groups)
    # grpo finals 0.2 and 0.4: mean 0.3, sample std sqrt(((0.1)^2 + (0.1)^2) / 1) = 0.1414
    assert "| grpo | 0.300 +- 0.141 | 2 |" in table
    assert "| slca | 0.500 +- 0.000 | 1 |" in table
    plot({"val/acc": groups, "val/acc again": groups}, tmp_path / "p.png")  # two panels
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_dpa_report_table_aligns_game_and_generator_runs(tmp_path):
    from scripts.dpa_report import collect, table
    from scripts.dpa_report import plot as plot_dpa

    def run(name, overrides, series):
        path = tmp_path / name
        (path / ".hydra").mkdir(parents=True)
        (path / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
        with SummaryWriter(path / "tensorboard") as writer:
            for tag, values in series.items():
                for step, value in values:
                    writer.add_scalar(tag, value, step)

    # GRPO logs validations at global steps 0, 20; DPA at 0, 40 (two optimiser steps per round): both are
    # "validation 0, validation 1".
    run("g0", ["experiment=grpo_form", "seed=0"], {"val/reward/strict": [(0, 0.4), (20, 0.5)],
                                                   "val/reward/lenient": [(0, 0.45), (20, 0.55)]})
    run("g1", ["experiment=grpo_form", "seed=1"], {"val/reward/strict": [(0, 0.4), (20, 0.7)],
                                                   "val/reward/lenient": [(0, 0.45), (20, 0.75)]})
    run("d0", ["experiment=dpa_form", "seed=0"], {
        "val/reward/strict": [(0, 0.4), (40, 0.45)], "val/reward/lenient": [(0, 0.45), (40, 0.5)],
        "val/final/strict": [(0, 0.38), (40, 0.6)], "val/final/lenient": [(0, 0.4), (40, 0.62)],
        "val/dpa/case/1": [(0, 0.3), (40, 0.4)], "val/dpa/case/4": [(0, 0.5), (40, 0.3)],
        "val/dpa/case/6a": [(0, 0.1), (40, 0.2)]})
    data = collect(tmp_path)
    assert data["dpa_form"]["strict"] == [[pytest.approx(0.38)], [pytest.approx(0.6)]]  # float32 event values
    assert data["dpa_form"]["proposal_strict"][1] == [pytest.approx(0.45)]
    text = table(data)
    assert "| SFT only (generator) | 0.400 +- 0.000 | 0.450 +- 0.000 | - | - | - | 2 |" in text
    assert "| SFT only (game) | 0.380 +- 0.000 | 0.400 +- 0.000 | 0.300 +- 0.000 | 0.500 +- 0.000 | 0.100" in text
    # GRPO final: 0.5 and 0.7 -> mean 0.6, sample std sqrt(2 * 0.1^2 / 1) = 0.141
    assert "| GRPO | 0.600 +- 0.141 | 0.650 +- 0.141 | - | - | - | 2 |" in text
    assert "| DPA-GRPO | 0.600 +- 0.000 | 0.620 +- 0.000 | 0.400 +- 0.000 | 0.300 +- 0.000 | 0.200 +- 0.000 | 1 |" in text
    plot_dpa(data, 20, tmp_path / "dpa.png")
    assert (tmp_path / "dpa.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
