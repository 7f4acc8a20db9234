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
    assert not any(k.startswith("reference.") for k in state["state_dict"])  # made again from the base model
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


def test_the_cuda_rng_state_is_the_current_devices_and_an_old_checkpoints_list_restores(monkeypatch):
    """The CUDA generator is saved for the current device only, so a checkpoint restores on a machine with fewer
    GPUs; an older checkpoint's list (every visible device's) gives the current device's entry, else the first.
    Patched ``torch.cuda`` (no GPU here): each state a distinct tensor, ``set_rng_state`` recorded."""
    from lit_credit.checkpoint import capture_rng, restore_rng

    states = [torch.full((4,), i, dtype=torch.uint8) for i in range(4)]
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": states[1])
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: states)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device="cuda": restored.append(state))
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda new: pytest.fail("restored every device's state"))
    saved = capture_rng({})
    assert torch.equal(saved["cuda"], states[1])
    restore_rng(saved, {})
    restore_rng({**saved, "cuda": states[:3]}, {})  # an older checkpoint of 3 GPUs: device 1's
    restore_rng({**saved, "cuda": states[:1]}, {})  # of 1 GPU: its only entry
    assert [int(s[0]) for s in restored] == [1, 1, 0]


def test_no_checkpoint_holds_the_reference_and_an_older_one_with_it_resumes_alike(tmp_path, cache_dir):
    """The checkpoints hold the policy, not the frozen reference (made again from the base model on resume; the
    SIGKILL test above shows that resume bitwise). A checkpoint written before, with ``reference.*`` keys (the
    base model's weights, as the old code saved them), still loads and continues exactly as the new one: the
    same metrics of step 3 and the same weights, and the checkpoint it writes has no reference either."""
    from hydra.utils import instantiate
    from transformers import AutoModelForCausalLM

    from lit_credit.analysis.compare import run_scalars
    from tests.conftest import compose_train

    args = ["trainer.max_steps=2", "trainer.val_check_interval=50", "callbacks.checkpoint.every_n_train_steps=2"]
    new, old = tmp_path / "new", tmp_path / "old"
    done = lit_credit(new, cache_dir, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    checkpoint = new / "checkpoints" / "last.ckpt"
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    assert any(k.startswith("policy.") for k in state["state_dict"])
    assert not any(k.startswith("reference.") for k in state["state_dict"])
    base = instantiate(compose_train(ARGS, tmp_path / "compose", cache_dir).model).prepare()  # built: the path
    weights = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).state_dict()
    state["state_dict"].update({f"reference.{k}": v for k, v in weights.items()})
    (old / "checkpoints").mkdir(parents=True)
    torch.save(state, old / "checkpoints" / "old.ckpt")
    resumed = {}
    for run, path in ((new, checkpoint), (old, old / "checkpoints" / "old.ckpt")):
        again = lit_credit(run, cache_dir, *args[1:], "trainer.max_steps=3", f"ckpt_path={path}")
        assert again.returncode == 0, again.stderr[-3000:]
        resumed[run] = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
        assert resumed[run]["global_step"] == 3
        assert not any(k.startswith("reference.") for k in resumed[run]["state_dict"])
    assert resumed[new]["state_dict"].keys() == resumed[old]["state_dict"].keys()
    assert all(torch.equal(v, resumed[old]["state_dict"][k]) for k, v in resumed[new]["state_dict"].items())
    scalars = {run: run_scalars(run) for run in (new, old)}
    step3 = {tag: values[2] for tag, values in scalars[new].items() if 2 in values and not tag.startswith("perf/")}
    assert {"loss/total", "loss/kl", "train/reward/mean"} <= set(step3)
    assert step3 == {tag: scalars[old][tag][2] for tag in step3}
