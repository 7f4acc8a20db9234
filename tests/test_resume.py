"""Exact resume: a run SIGKILLed part-way and resumed from its last checkpoint matches the uninterrupted run
bitwise on CPU, and a run directory that holds a run is never reused unless resuming (subprocesses, slow)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.conftest import FAST_MODEL, FAST_TASK

STEPS, EVERY, KILL_AT = 6, 2, 5
# Sampling and minibatch order (torch RNG), KL to a reference, a warm-up LR schedule, validation at steps 3
# and 6, checkpoints at steps 2, 4, 6: everything a resumed run must restore.
ARGS = ["experiment=grpo_arith", *FAST_TASK, *FAST_MODEL, f"trainer.max_steps={STEPS}", "trainer.val_check_interval=3",
        "data.prompts_per_step=4", "data.sampling.n=4", "data.val_prompts=4",
        f"callbacks.checkpoint.every_n_train_steps={EVERY}", "callbacks.hf_export=null",
        "callbacks.credit_records=null"]


def lit_credit(run_dir: Path, cache_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name("lit-credit")
    cmd = [str(script), *ARGS, f"paths.cache_dir={cache_dir}", f"hydra.run.dir={run_dir}", *extra]
    # PYTHONPATH: the repo root, so the crash callback in tests/ can be imported by the console script.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)


def event_scalars(*files: Path) -> dict[tuple[str, int], float]:
    """(tag, step) -> value in TensorBoard event files; ``perf/*`` (wall-clock timings) left out."""
    out = {}
    for events in files:
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        out.update({(tag, e.step): e.value for tag in acc.Tags()["scalars"] if not tag.startswith("perf/")
                    for e in acc.Scalars(tag)})
    return out


# DAPO's dynamic sampling: refills draw further prompt batches of the same stream inside a step.
DYNAMIC = ["method.dynamic_sampling=true", "method.max_sampling_draws=3"]


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [[], DYNAMIC], ids=["plain", "dynamic_sampling"])
def test_sigkill_then_resume_matches_the_uninterrupted_run_bitwise(sampling, tmp_path, cache_dir):
    whole, crashed = tmp_path / "whole", tmp_path / "crashed"
    done = lit_credit(whole, cache_dir, *sampling)
    assert done.returncode == 0, done.stderr[-3000:]

    killed = lit_credit(crashed, cache_dir, *sampling, "+callbacks.crash._target_=tests.crash.KillAfterStep",
                        f"+callbacks.crash.step={KILL_AT}")
    assert killed.returncode == -9, killed.stderr[-3000:]  # SIGKILL: no cleanup ran
    last = crashed / "checkpoints" / "last.ckpt"
    state = torch.load(last, map_location="cpu", weights_only=False)
    assert state["global_step"] == 4  # the step-4 checkpoint; steps 5 and 6 must be replayed
    assert any(k.startswith("policy.") for k in state["state_dict"])
    assert any(k.startswith("reference.") for k in state["state_dict"])
    assert state["optimizer_states"][0]["state"] and state["lr_schedulers"][0]["last_epoch"] == 4
    position = state["RolloutDataModule"]
    if not sampling:
        # 4 steps drew prompt batches 0-3 and Lightning prefetched batch 4 (pending: step 5 gets it after resume);
        # 4 groups a step and the 4 validation prompts at steps 0 and 3 took the group ids.
        assert position == {"next_batch": 5, "pending": [4], "next_group": 4 * 4 + 2 * 4}
    else:  # the refills took batches too: each drawn batch is 4 groups, the prefetched one not yet
        used = position["next_batch"] - 1
        assert used > 4 and len(position["pending"]) == 1 and position["next_group"] == 4 * used + 2 * 4
    assert set(state["rng_states"]) == {"torch", "python", "numpy", "cuda", "private"}
    assert not list((crashed / "checkpoints").glob(".*.tmp"))  # no temporary left beside the checkpoints

    before = set((crashed / "tensorboard").glob("events.out.tfevents.*"))
    resumed = lit_credit(crashed, cache_dir, *sampling, f"ckpt_path={last}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (events,) = set((crashed / "tensorboard").glob("events.out.tfevents.*")) - before

    uninterrupted = event_scalars(*(whole / "tensorboard").glob("events.out.tfevents.*"))
    got = event_scalars(events)
    # Lightning logs step k's metrics at index k - 1: indices 4 and 5 are steps 5 and 6 (validation included).
    expected = {key: value for key, value in uninterrupted.items() if key[1] >= 4}
    assert {tag for tag, _ in expected} >= {"train/reward/mean", "val/reward/mean", "loss/total", "loss/kl",
                                           "train/lr", "train/grad_norm", "train/entropy"}
    if sampling:  # the replayed steps refilled too (else this case would not test the refills' resume)
        assert {tag for tag, _ in expected} >= {"train/sampling_draws", "train/kept_frac"}
        assert max(v for (tag, _), v in expected.items() if tag == "train/sampling_draws") > 1
    assert got == expected  # every metric of the replayed steps, bitwise


def test_an_existing_run_directory_is_never_reused_without_resume(tmp_path, cache_dir):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    keep = run / "checkpoints" / "last.ckpt"
    keep.write_bytes(b"the user's checkpoint")
    (run / ".hydra").mkdir()
    (run / ".hydra" / "config.yaml").write_text("the user's config")
    done = lit_credit(run, cache_dir)
    assert done.returncode != 0
    assert f"paths.output_dir={run} already holds a run (checkpoints, .hydra)" in done.stderr
    assert f"resume it with ckpt_path={keep}" in done.stderr
    assert keep.read_bytes() == b"the user's checkpoint"
    assert (run / ".hydra" / "config.yaml").read_text() == "the user's config"
    assert not (run / "tensorboard").exists()
