"""A quiet run: `lit-credit` prints its progress bar (steps out of max_steps), its run directory and its final
metrics, without the dependencies' messages that :func:`lit_credit.quiet.quiet` drops, each by its text."""
from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import lightning as L
import math_verify
import math_verify.grader
import math_verify.parser
import pytest
from hydra.utils import instantiate
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities import _pytree
from transformers.utils import logging as hf_logging

from lit_credit.quiet import LOG_MESSAGES, DropMessages, StepProgressBar, default_progress_bar, quiet
from lit_credit.train import held_out_summary
from tests.conftest import FAST_MODEL, FAST_TASK

TIP = "💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]"
TIP_MODELS = "💡 Tip: For seamless cloud uploads and versioning, try installing [litmodels]"
LEAF_SPEC = "`isinstance(treespec, LeafSpec)` is deprecated"
NO_TIMEOUT = "Timeout is disabled as"
BARS = ("Loading weights", "Writing model shards")


@pytest.mark.slow  # a lit-credit subprocess, as the other end-to-end runs (about 15 s with a warm cache)
def test_a_run_prints_its_steps_run_directory_and_metrics_and_no_dependency_noise(make_cfg, cache_dir, tmp_path):
    instantiate(make_cfg("experiment=grpo_arith").model).prepare()  # a warm cache: this run's output only
    run_dir = tmp_path / "quiet"
    cmd = [str(Path(sys.executable).with_name("lit-credit")), "experiment=grpo_arith", *FAST_TASK, *FAST_MODEL,
           "trainer.max_steps=2", "trainer.val_check_interval=2", "data.prompts_per_step=4", "data.sampling.n=4",
           "data.val_prompts=4", f"paths.cache_dir={cache_dir}", f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout + done.stderr
    for noise in (TIP, TIP_MODELS, LEAF_SPEC, NO_TIMEOUT, *BARS):
        assert noise not in printed, noise
    bar = done.stdout.replace("\r", "\n")
    assert "train: 100%" in bar and "| 2/2 [" in bar and "/-2" not in printed and "Epoch" not in bar, bar[-2000:]
    assert "Validation" in bar  # validation still has its bar
    assert f"run directory: {run_dir}" in printed and "final metrics: {" in printed
    assert "`Trainer.fit` stopped: `max_steps=2` reached." in printed  # Lightning's own lines about the run stay
    # The last line a newcomer reads: held-out reward at the start and at the end, greedy and sampled.
    logged = done.stdout if "final metrics: {" in done.stdout else done.stderr  # the stream Hydra logs to
    last = logged.strip().splitlines()[-1]
    assert re.search(r"held-out reward: greedy \d\.\d{3} -> \d\.\d{3}, sampled \d\.\d{3} -> \d\.\d{3}$", last), last


def test_the_held_out_summary_reads_the_start_and_the_end():
    start = {"val/reward/mean": 0.25, "val/sampled/reward/mean": 0.2, "train/loss": 1.0}
    end = {"val/reward/mean": 0.275, "val/sampled/reward/mean": 0.26875}
    assert held_out_summary(start, end) == "held-out reward: greedy 0.250 -> 0.275, sampled 0.200 -> 0.269"
    # resumed (no validation before training): the end only; nothing validated: no line
    assert held_out_summary({}, end) == "held-out reward: greedy 0.275 at the end, sampled 0.269 at the end"
    assert held_out_summary(start, {"train/loss": 0.5}) is None


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def records(name: str, filtered: bool) -> Iterator[list[str]]:
    """The messages logger ``name`` passes on, with the quiet filters (``filtered``) or without any."""
    logger, handler = logging.getLogger(name), Records()
    level, kept = logger.level, [f for f in logger.filters if isinstance(f, DropMessages)]
    for f in kept:
        logger.removeFilter(f)
    if filtered:
        quiet()
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        for f in [f for f in logger.filters if isinstance(f, DropMessages)]:
            logger.removeFilter(f)
        for f in kept:
            logger.addFilter(f)


def test_the_lightning_tips_are_dropped_and_lightnings_other_lines_kept(tmp_path):
    name = "lightning.pytorch.utilities.rank_zero"
    assert name in LOG_MESSAGES

    def trainer() -> None:  # without a LitLogger, and fitting with its own ModelCheckpoint: both tips
        L.Trainer(logger=False, accelerator="cpu", devices=1, max_steps=1, limit_val_batches=0,
                  enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path).fit(BoringModel())

    with records(name, filtered=False) as printed:
        trainer()
    assert [any(m.startswith(tip) for m in printed) for tip in (TIP, TIP_MODELS)] == [True, True]
    with records(name, filtered=True) as printed:
        trainer()
    assert not any("💡 Tip" in m for m in printed)
    assert any(m.startswith("GPU available:") for m in printed)  # the same logger's other lines pass


def test_the_leafspec_deprecation_is_ignored_and_other_warnings_of_the_module_kept():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _pytree._tree_flatten(1)  # Lightning's LeafSpec(): torch's deprecation, at lightning's _pytree.py
        leaf = [w for w in caught if str(w.message).startswith(LEAF_SPEC)]
        assert leaf and leaf[0].category is FutureWarning and leaf[0].filename == _pytree.__file__
        caught.clear()
        quiet()
        _pytree._tree_flatten(1)
        warnings.warn_explicit("another FutureWarning", FutureWarning, _pytree.__file__, 21,
                               module="lightning.pytorch.utilities._pytree")
        warnings.warn_explicit(LEAF_SPEC.replace("LeafSpec", "OtherSpec"), FutureWarning, _pytree.__file__, 21,
                               module="lightning.pytorch.utilities._pytree")
        warnings.warn_explicit(LEAF_SPEC, FutureWarning, "elsewhere.py", 1, module="elsewhere")
    assert [str(w.message) for w in caught] == ["another FutureWarning", "`isinstance(treespec, OtherSpec)` is "
                                                "deprecated", LEAF_SPEC]


def test_math_verify_timeout_off_notice_is_dropped_and_its_timeouts_kept(monkeypatch):
    for filtered in (False, True):
        monkeypatch.setattr(math_verify.parser, "TIMEOUT_WARNING_SHOWN", False)
        monkeypatch.setattr(math_verify.grader, "TIMEOUT_WARNING_SHOWN", False)
        with records("math_verify.parser", filtered) as parsed, records("math_verify.grader", filtered) as graded:
            gold = math_verify.parse("$x+1$", parsing_timeout=None)
            assert math_verify.verify(gold, math_verify.parse("$1+x$", parsing_timeout=None), timeout_seconds=None)
            logging.getLogger("math_verify.parser").warning("Timeout during parsing: $x$")
            logging.getLogger("math_verify.grader").warning("Timeout during comparison")
        notices = [m for m in parsed + graded if m.startswith(NO_TIMEOUT)]
        assert len(notices) == (0 if filtered else 2)
        assert "Timeout during parsing: $x$" in parsed and "Timeout during comparison" in graded


def test_transformers_load_and_save_bars_are_off_and_its_other_bars_on(monkeypatch):
    monkeypatch.setattr(hf_logging, "_tqdm_active", True)  # transformers' bars on (HF_HUB_DISABLE_PROGRESS_BARS)
    quiet()
    with open(os.devnull, "w") as devnull:
        assert all(hf_logging.tqdm(range(1), desc=desc, file=devnull).disable for desc in BARS)
        assert not hf_logging.tqdm(range(1), desc="Downloading", file=devnull).disable


def test_step_progress_bar_is_the_default_unless_one_is_given_or_bars_are_off():
    assert [type(c) for c in default_progress_bar([])] == [StepProgressBar]
    assert [type(c) for c in default_progress_bar([], None)] == [StepProgressBar]
    assert default_progress_bar([], False) == []
    assert default_progress_bar([TQDMProgressBar()]) == []
