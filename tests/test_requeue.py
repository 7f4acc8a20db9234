"""A requeued job with ``resume=auto`` (issue 49, finding 4): a job preempted before its first checkpoint starts over
in its own directory, a distributed checkpoint (a ``last.ckpt`` directory) is found, and one rank decides for all."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lit_credit.distributed import (
    CLAIM,
    RUN_ID,
    claim_run_dir,
    claimed_checkpoint,
    earlier_attempt,
    launcher_run_id,
)
from lit_credit.train import resume_path
from tests.conftest import FAST_MODEL, FAST_TASK

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID", "SLURM_RESTART_COUNT",
          RUN_ID, "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_JOB_ID")


@pytest.fixture
def no_launcher(monkeypatch):
    for key in LAUNCH:
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def test_resume_auto_finds_a_distributed_checkpoint_directory(make_cfg):
    cfg = make_cfg("resume=auto")
    last = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
    assert resume_path(cfg) is None
    aside = last.with_name(".last.ckpt.old")
    (aside / "shards").mkdir(parents=True)  # killed between replace_path's renames: the previous one, set aside
    assert resume_path(cfg) == str(aside)
    (last / "shards").mkdir(parents=True)  # save_distributed_checkpoint: a directory of shards
    assert resume_path(cfg) == str(last)
    assert resume_path(make_cfg()) is None  # resume=null: only ckpt_path resumes


def test_the_leaders_resume_decision_is_every_ranks(tmp_path, no_launcher):
    run = tmp_path / "run"
    no_launcher.setenv("SLURM_JOB_ID", "77")
    no_launcher.setenv("SLURM_NTASKS", "2")
    no_launcher.setenv("SLURM_PROCID", "0")
    assert claim_run_dir(run, resuming=True, checkpoint="/shared/run/checkpoints/last.ckpt") is True
    no_launcher.delenv(RUN_ID)
    no_launcher.setenv("SLURM_PROCID", "1")  # a task on another node: its own view of the file system has no file
    assert claim_run_dir(run, resuming=False, timeout_s=1) is False
    assert claimed_checkpoint(run) == "/shared/run/checkpoints/last.ckpt"


def test_a_requeued_attempts_followers_wait_for_their_own_leader(tmp_path, no_launcher):
    """SLURM keeps the job id on requeue: without the restart count a follower of the new attempt could join the
    previous attempt's claim and take its resume decision."""
    run = tmp_path / "run"
    no_launcher.setenv("SLURM_JOB_ID", "77")
    assert launcher_run_id() == "slurm-77"
    claim_run_dir(run, resuming=False)  # the first attempt's leader
    no_launcher.delenv(RUN_ID)
    no_launcher.setenv("SLURM_RESTART_COUNT", "1")
    assert launcher_run_id() == "slurm-77-attempt1"
    no_launcher.setenv("SLURM_NTASKS", "2")
    no_launcher.setenv("SLURM_PROCID", "1")
    with pytest.raises(FileExistsError, match="launch slurm-77-attempt1 found the claim of launch slurm-77"):
        claim_run_dir(run, resuming=True, timeout_s=0.3)
    no_launcher.setenv("SLURM_PROCID", "0")
    assert claim_run_dir(run, resuming=True, checkpoint=None) is True
    assert json.loads((run / CLAIM).read_text())["run_id"] == "slurm-77-attempt1"


def test_resume_auto_starts_over_only_in_an_earlier_attempts_directory(tmp_path, no_launcher):
    run = tmp_path / "run"
    run.mkdir()
    assert not earlier_attempt(run)  # no claim
    (run / CLAIM).write_text(json.dumps({"run_id": "slurm-77", "pid": 1, "time": 0.0}))
    assert not earlier_attempt(run)  # this launch has no id of its own (a plain command)
    no_launcher.setenv("SLURM_JOB_ID", "78")
    assert not earlier_attempt(run)  # another job's directory: refused, as without resume
    no_launcher.setenv("SLURM_JOB_ID", "77")
    no_launcher.setenv("SLURM_RESTART_COUNT", "2")
    assert earlier_attempt(run)  # the same job, requeued
    (run / CLAIM).write_text(json.dumps({"run_id": "slurm-77-attempt1", "pid": 1, "time": 0.0}))
    assert earlier_attempt(run)


@pytest.mark.slow
def test_a_job_preempted_before_its_first_checkpoint_starts_over_on_requeue(tmp_path, cache_dir):
    run = tmp_path / "run"
    (run / "tensorboard").mkdir(parents=True)  # what the preempted attempt left: its claim and its first logs
    (run / CLAIM).write_text(json.dumps({"run_id": "slurm-77", "pid": 1, "time": 0.0}))
    script = Path(sys.executable).with_name("lit-credit")
    cmd = [str(script), "experiment=grpo_arith", *FAST_TASK, *FAST_MODEL, "trainer.max_steps=1",
           "data.prompts_per_step=2", "data.sampling.n=2", "data.val_prompts=2", "callbacks.hf_export=null",
           "callbacks.credit_records=null", "+trainer.enable_progress_bar=false", "resume=auto",
           f"paths.cache_dir={cache_dir}", f"hydra.run.dir={run}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "SLURM_JOB_ID": "77"}
    for key in LAUNCH:
        env.pop(key, None)
    env |= {"SLURM_JOB_ID": "78"}  # another job: the directory is refused, nothing of it touched
    refused = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    assert refused.returncode != 0 and "already holds a run" in refused.stderr
    assert json.loads((run / CLAIM).read_text())["run_id"] == "slurm-77"
    env |= {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "1"}  # the same job, requeued
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert json.loads((run / CLAIM).read_text())["checkpoint"] is None  # started over: nothing to resume from
