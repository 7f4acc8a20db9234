"""Host memory that fits a node: under FSDP2 only rank 0 reads the policy's weights and every rank's shards (the
policy's and the reference's) are filled from that one load; the frozen reference is in no state dict and no
checkpoint and is made again on resume; FSDP2's distributed checkpoints are written beside the old one and
swapped in, resume bitwise, and the HF export of a sharded run loads."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

from lit_credit.checkpoint import replace_path
from tests.conftest import FAST_MODEL, FAST_TASK

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["experiment=grpo_arith", *FAST_TASK, *FAST_MODEL, "trainer=fsdp2_cpu", "data.prompts_per_step=4",
        "data.sampling.n=2", "data.val_prompts=4", "data.sampling.max_new_tokens=8", "validate_first=false",
        "callbacks.credit_records=null", "callbacks.checkpoint.every_n_train_steps=1",
        "callbacks.hf_export.every_n_steps=0", "+trainer.enable_progress_bar=false"]


def lit_credit(cache_dir: Path, run: Path, *extra: str) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name("lit-credit")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    for key in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "LIT_CREDIT_RUN_ID"):
        env.pop(key, None)
    cmd = [str(script), *ARGS, f"paths.cache_dir={cache_dir}", f"hydra.run.dir={run}", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)


class Probe(L.Callback):
    """Each rank's view of the load (``<out>/rank<r>.json``): at the callbacks' ``setup`` (before the module's,
    so before any weight is brought in) whether the policy is on the meta device; at ``on_fit_start`` (sharded)
    whether every parameter and buffer of the policy and of the reference equals the model directory's, loaded
    whole here for the comparison, and whether the tied embedding is still one parameter."""

    def __init__(self, out: str) -> None:
        self.out, self.seen = Path(out), {}

    def setup(self, trainer, pl_module, stage) -> None:
        self.seen.setdefault("meta_at_setup", all(p.is_meta for p in pl_module.policy.parameters()))

    def on_fit_start(self, trainer, pl_module) -> None:
        from torch.distributed.tensor import DTensor
        from transformers import AutoModelForCausalLM

        def full(t: torch.Tensor) -> torch.Tensor:
            return t.full_tensor() if isinstance(t, DTensor) else t

        loaded = AutoModelForCausalLM.from_pretrained(pl_module.source.prepare(), dtype=torch.float32)
        expected = {**dict(loaded.named_parameters()), **dict(loaded.named_buffers())}
        for role in ("policy", "reference"):
            model = getattr(pl_module, role)
            got = {**dict(model.named_parameters()), **dict(model.named_buffers())}
            self.seen[f"{role}_sharded"] = all(isinstance(p, DTensor) for p in model.parameters())
            self.seen[f"{role}_names"] = sorted(got) == sorted(expected)
            self.seen[f"{role}_equal"] = all(torch.equal(full(got[k]).detach().cpu(), v) for k, v in expected.items())
            self.seen[f"{role}_tied"] = model.lm_head.weight is model.model.embed_tokens.weight
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(self.seen))


@pytest.mark.slow
def test_fsdp2_reads_the_weights_on_rank_0_only_and_fills_every_shard_from_that_load(tmp_path, cache_dir):
    """2 gloo ranks: rank 1 builds the policy on the meta device (no weight read) and receives its shards of the
    policy and of the reference from rank 0's load; after sharding both equal the model directory's weights on
    every rank (rotary frequencies, which no state dict holds, included; the tied embedding still one
    parameter), and the checkpoint holds no ``reference.*`` key."""
    run, probe = tmp_path / "run", tmp_path / "probe"
    done = lit_credit(cache_dir, run, "trainer.max_steps=1", "callbacks.hf_export=null",
                      f"+callbacks.probe._target_={__name__}.Probe", f"+callbacks.probe.out={probe}")
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((probe / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["meta_at_setup"] for r in ranks] == [False, True]
    for seen in ranks:
        for role in ("policy", "reference"):
            assert seen[f"{role}_sharded"] and seen[f"{role}_names"] and seen[f"{role}_equal"], (role, seen)
            assert seen[f"{role}_tied"], (role, seen)
    state = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert any(k.startswith("policy.") for k in state["state_dict"])
    assert not any(k.startswith("reference.") for k in state["state_dict"])


@pytest.mark.slow
def test_fsdp2_distributed_checkpoints_resume_bitwise_and_the_hf_export_loads(tmp_path, cache_dir):
    """``save_distributed_checkpoint=true`` (conf/trainer/fsdp.yaml's default) on 2 gloo ranks: ``last.ckpt`` is a
    directory of shards without the reference, written beside the old one and swapped in (no temporary left);
    resumed from it (``resume=auto``) a 2-step run continues to step 3 bitwise as the 3-step run (the exported
    weights; the logged metrics of step 3), and the HF export of the sharded policy loads with
    ``from_pretrained``."""
    from safetensors import safe_open
    from torch.distributed.checkpoint import FileSystemReader
    from transformers import AutoModelForCausalLM

    from lit_credit.analysis.compare import run_scalars

    dcp = "trainer.strategy.save_distributed_checkpoint=true"
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    done = lit_credit(cache_dir, straight, dcp, "trainer.max_steps=3")
    assert done.returncode == 0, done.stderr[-4000:]
    first = lit_credit(cache_dir, resumed, dcp, "trainer.max_steps=2")
    assert first.returncode == 0, first.stderr[-4000:]
    last = resumed / "checkpoints" / "last.ckpt"
    assert last.is_dir() and (last / "meta.pt").is_file()
    keys = set(FileSystemReader(str(last)).read_metadata().state_dict_metadata)
    assert any(k.startswith("state_dict.policy.") for k in keys)
    assert not any(".reference." in k or k.startswith("state_dict.reference") for k in keys)
    assert torch.load(last / "meta.pt", weights_only=False)["global_step"] == 2
    again = lit_credit(cache_dir, resumed, dcp, "trainer.max_steps=3", "resume=auto")
    assert again.returncode == 0, again.stderr[-4000:]
    assert torch.load(last / "meta.pt", weights_only=False)["global_step"] == 3
    assert not [p.name for p in last.parent.iterdir() if p.name.startswith(".")]  # no temporary, no old copy

    # The tied output embedding is written once, as the one-process export writes it (the gathered tensors share
    # no storage, so save_pretrained cannot tell).
    with safe_open(straight / "checkpoints" / "hf" / "last" / "model.safetensors", "pt") as exported:
        names = set(exported.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    models = [AutoModelForCausalLM.from_pretrained(r / "checkpoints" / "hf" / "last") for r in (straight, resumed)]
    weights = [m.state_dict() for m in models]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(v, weights[1][k]) for k, v in weights[0].items())
    scalars = [run_scalars(r) for r in (straight, resumed)]
    for tag in ("loss/total", "loss/kl", "train/reward/mean", "train/grad_norm"):
        assert scalars[1][tag][2] == scalars[0][tag][2], tag  # step 3, the one the resumed run trained


def test_the_reference_is_in_no_state_dict_and_an_older_checkpoints_reference_keys_load(make_cfg):
    """One process: the reference is a copy of the policy as loaded, out of the module's state dict; a state
    dict written before (with ``reference.*`` keys) loads strictly; ``to`` casts the reference with the module."""
    from lit_credit.train import build

    module, _, _ = build(make_cfg())
    policy = {k: v.clone() for k, v in module.policy.state_dict().items()}
    reference = module.reference.state_dict()
    assert reference.keys() == policy.keys() and all(torch.equal(reference[k], v) for k, v in policy.items())
    assert all(not p.requires_grad for p in module.reference.parameters()) and not module.reference.training
    state = module.state_dict()
    assert state and all(k.startswith("policy.") for k in state)
    older = {**state, **{f"reference.{k}": torch.zeros_like(v) for k, v in policy.items()}}
    assert not module.load_state_dict(older, strict=True).unexpected_keys
    assert all(torch.equal(module.reference.state_dict()[k], v) for k, v in policy.items())  # not the file's zeros
    module.to(torch.float64)
    assert {p.dtype for p in module.reference.parameters()} == {torch.float64}


def test_a_checkpoint_replaces_the_old_one_whatever_each_is(tmp_path):
    """A directory over a directory, a file over a directory, a directory over a file: the target holds the
    new one and nothing else is left beside it."""
    target = tmp_path / "last.ckpt"
    target.mkdir()
    (target / "meta.pt").write_text("old")
    new = tmp_path / ".last.ckpt.1.tmp"
    new.mkdir()
    (new / "meta.pt").write_text("new")
    replace_path(new, target)
    assert (target / "meta.pt").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    new = tmp_path / ".last.ckpt.2.tmp"
    new.write_text("file")
    replace_path(new, target)
    assert target.read_text() == "file" and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    new = tmp_path / ".last.ckpt.3.tmp"
    new.mkdir()
    replace_path(new, target)
    assert target.is_dir() and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
