"""scripts/plot_runs.py on a sweep directory of real TensorBoard event files."""
from __future__ import annotations

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
    plot(groups, "val/acc", tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
