"""Credit analysis end to end (issue #7): real tiny runs write credit records and TensorBoard histograms; the
loader, the report command and the notebook read them."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import nbformat
import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lit_credit.analysis import plots
from lit_credit.analysis.load import load_records
from lit_credit.train import build
from scripts.tb_scalars import scalars
from tests.analysis.notebook import NOTEBOOK, run_notebook
from tests.conftest import FAST_MODEL, FAST_TASK, compose_train
from tests.methods.test_dpa_module import SMALL as DPA_SMALL
from tests.methods.test_dpa_module import ScriptedEngine
from tests.methods.test_slca_module import ScriptedToolEngine
from tests.methods.test_tcpo_module import MATH_SMALL
from tests.test_configs import TOOLCALL_SMALL

RECORDS = ["callbacks.credit_records.every_n_steps=1", "~callbacks.checkpoint", "~callbacks.hf_export",
           "validate_first=false", "+trainer.limit_val_batches=0"]
TOOL = ["experiment=slca_tcpo_toolcall", *TOOLCALL_SMALL, "reward.judge.noise=0.5", "data.prompts_per_step=2",
        "data.sampling.n=4", "trainer.max_steps=2"]
RUNS = {  # label -> (overrides, scripted engine or None, fast task keys)
    "grpo": ([*TOOL, "credit=grpo"], ScriptedToolEngine, False),
    "slca": ([*TOOL, "credit=slca"], ScriptedToolEngine, False),
    "slca_tcpo": ([*TOOL, "credit=slca_tcpo"], ScriptedToolEngine, False),
    "tcpo": (["experiment=tcpo_math", *MATH_SMALL, "data.prompts_per_step=2", "data.sampling.n=4",
              "trainer.max_steps=2"], None, True),
    "dpa": ([*[o for o in DPA_SMALL if not o.startswith(("trainer.max_steps", "logger", "+trainer", "validate"))],
             "trainer.max_steps=2"], ScriptedEngine, False),
}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, cache_dir):
    root = tmp_path_factory.mktemp("sweep")
    for i, (label, (overrides, engine, fast_task)) in enumerate(RUNS.items()):
        run = root / str(i)
        cfg = compose_train([*(FAST_TASK if fast_task else []), *FAST_MODEL, *overrides, *RECORDS], run, cache_dir)
        module, datamodule, trainer = build(cfg)
        if engine is not None:
            datamodule.setup("fit")
            datamodule.experience.engine = engine([*datamodule.train_set, *datamodule.val_set])
        trainer.fit(module, datamodule=datamodule)
        (run / ".hydra").mkdir(exist_ok=True)
        (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"credit={label}", "seed=0"]))
    return root


@pytest.mark.slow
def test_runs_write_bounded_atomic_records_histograms_and_leakage(sweep):
    df = load_records(sweep)
    assert sorted(df["credit"].unique()) == sorted(RUNS)
    for i in range(len(RUNS)):
        shards = sorted(p.name for p in (sweep / str(i) / "records").iterdir())
        assert shards and all(s.startswith("step-") and s.endswith(".parquet") for s in shards)  # no temp files
    by = df.groupby("credit")
    # Tool runs: every rollout makes one call per gold step then summarises: tool and summary turns.
    assert set(by.get_group("grpo")["segment"]) == {"tool", "summary"}
    assert (by.get_group("slca_tcpo").query("segment == 'tool'")["turn_type"] != "").all()
    assert (by.get_group("tcpo")["turn_type"] != "").all() and set(by.get_group("dpa")["case"]) - {""}
    assert set(by.get_group("dpa")["source"]) <= {"verifier", "approver", "revisions", "proposals"}
    # Under GRPO a rollout's turns share one advantage; SLCA splits tool and summary.
    grpo = by.get_group("grpo")
    spread = grpo.groupby(["step", "rollout"])["advantage"].agg(lambda a: a.max() - a.min())
    assert (spread < 1e-6).all()
    slca = by.get_group("slca")
    assert (slca.groupby(["step", "rollout"])["advantage"].agg(lambda a: a.max() - a.min()) > 1e-3).any()
    # TensorBoard: histograms by segment and turn index, and the leakage scalar that the records reproduce.
    events = EventAccumulator(str(sweep / "0" / "tensorboard"), size_guidance={"histograms": 0})
    events.Reload()
    tags = set(events.Tags()["histograms"])
    assert {"credit_hist/segment/tool", "credit_hist/segment/summary", "credit_hist/turn/0"} <= tags
    dpa = EventAccumulator(str(sweep / str(list(RUNS).index("dpa")) / "tensorboard"), size_guidance={"histograms": 0})
    dpa.Reload()
    assert any(t.startswith("credit_hist/case/") for t in dpa.Tags()["histograms"])
    tb = dict(scalars(sweep / "0").get("credit/leakage", []))
    leak = plots.leakage_by_step(grpo.assign(run="."), "credit").set_index("step")["leakage"]
    assert tb, "GRPO on a tool task logs credit/leakage"
    for value in tb.values():
        assert -1 <= value <= 1
    # the callback writes after the update (global_step = step index + 1), TensorBoard logs at the batch index
    for step, value in leak.items():
        if not math.isnan(value) and step - 1 in tb:
            assert value == pytest.approx(tb[step - 1], abs=1e-5)


@pytest.mark.slow
def test_report_command_writes_plots_and_summary(sweep, tmp_path):
    out = tmp_path / "report"
    printed = subprocess.run([sys.executable, "-m", "lit_credit.analysis.report", str(sweep), "--out", str(out),
                              "--by", "credit"], check=True, capture_output=True, text=True).stdout
    names = {"by_segment.png", "tool_by_method.png", "by_turn.png", "by_case.png", "summary.md"}
    assert names <= {p.name for p in out.iterdir()} and "summary.md" in printed
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = (out / "summary.md").read_text()
    assert "## By segment" in summary and "## By turn type" in summary and "## By DPA case" in summary
    assert "## Leakage" in summary


@pytest.mark.slow
def test_notebook_runs_on_the_sweep_and_is_stored_without_outputs(sweep):
    stored = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") and not c.get("execution_count") for c in stored.cells if c.cell_type == "code")
    outputs = run_notebook({"LIT_CREDIT_SWEEP": str(sweep), "LIT_CREDIT_BY": "credit"})
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 4  # tool credit by method, by segment, by turn (+ type), DPA cases
    text = json.dumps([o.get("text", "") for o in outputs])
    assert "no DPA-GRPO records" not in text and "no tool turns" not in text
