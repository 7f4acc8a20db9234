"""A real Hydra multirun over two losses through the `lit-credit` console script (slow)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.tb_scalars import scalars
from tests.conftest import FAST_MODEL, FAST_TASK


@pytest.mark.slow
def test_multirun_sweep_over_two_losses(tmp_path, cache_dir):
    script = Path(sys.executable).with_name("lit-credit")
    cmd = [str(script), "-m", "experiment=grpo_arith", "loss=grpo,dr_grpo", *FAST_TASK, *FAST_MODEL,
           "trainer.max_steps=3", "trainer.val_check_interval=3", "data.prompts_per_step=4", "data.sampling.n=4",
           "data.val_prompts=4", "callbacks=none", f"paths.cache_dir={cache_dir}", f"hydra.sweep.dir={tmp_path}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = sorted(p for p in tmp_path.iterdir() if p.is_dir() and p.name.isdigit())
    assert [r.name for r in runs] == ["0", "1"]
    for run, loss in zip(runs, ["grpo", "dr_grpo"]):
        series = scalars(run / "tensorboard")
        assert len(series["train/reward/mean"]) == 3
        assert f"- loss={loss}\n" in (run / ".hydra" / "overrides.yaml").read_text()
    # The two runs really used different loss aggregations (token-mean vs Dr.GRPO's), with the same credit.
    configs = [(run / ".hydra" / "config.yaml").read_text() for run in runs]
    assert all("GRPOCredit" in c and "DrGRPOCredit" not in c for c in configs)
    assert "aggregation: token-mean" in configs[0]
    assert "seq-mean-token-sum-norm" in configs[1] and "seq-mean-token-sum-norm" not in configs[0]
