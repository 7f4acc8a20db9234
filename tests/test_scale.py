"""CPU scale-out: GRPO steps under DDP (2 gloo processes) and FSDP2 (ModelParallelStrategy + fully_shard)
give the losses, gradient norms and final weights of one process.

The experience is fixed: it is sampled once here, saved, and served by ``FixedExperience`` (the full batch to
one process, a contiguous shard of whole groups to each rank of two). With ``seq-mean-token-mean`` and equal
rows per shard the mean of the two shard losses is the full-batch loss, and DDP / FSDP2 average gradients,
so every run takes the same SGD steps. Each run is a fresh ``python -m tests.test_scale`` process (Lightning
re-launches that command for rank 1, as it would the ``lit-credit`` command).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import open_dict

from data_modules.rollout import RolloutDataModule
from lit_credit.train import CONF_DIR, build
from lit_credit.types import RolloutBatch

ROOT = CONF_DIR.parent
STEPS, PROMPTS, N = 3, 4, 4
# The first FAST_* lists of tests/conftest.py, so the cached embedded policy is the one the fixtures built.
FAST = ["task.max_operand=9", "task.num_test=20", "model.embedded.sft_target=0", "model.embedded.sft_steps=120",
        "model.embedded.sft_lr=1e-2",
        "model.embedded.hidden_size=64", "model.embedded.intermediate_size=128", "model.embedded.num_layers=2"]
RUN = ["callbacks=none", "~logger", "validate_first=false", f"trainer.max_steps={STEPS}",
       "+trainer.limit_val_batches=0", "+trainer.enable_checkpointing=false", "+trainer.enable_progress_bar=false",
       f"data.prompts_per_step={PROMPTS}", f"data.sampling.n={N}", "data.sampling.max_new_tokens=16",
       "loss.kl_coef=0.5", "loss.aggregation=seq-mean-token-mean", "method.lr_scheduler=null",
       "method.optimizer._target_=torch.optim.SGD", "method.optimizer.lr=0.1", "method.max_grad_norm=1.0",
       "method.num_minibatches=1"]  # one update per step: a rank's random minibatches are not the single process's


class FixedExperience(RolloutDataModule):
    """Serves precomputed RolloutBatches (one per step, from the file ``batches``) as the experience layer's
    training draw: all rows on one process, rank r's contiguous ``1 / world_size`` of them (whole groups)
    otherwise. The engine (HFEngine on the trainer's policy: binding and weight sync are no-ops) never generates."""

    def __init__(self, *args: Any, batches: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batches, self._steps, self._calls = batches, None, 0
        self.experience.draw = self.fixed_draw

    def fixed_draw(self, rows) -> RolloutBatch:
        if self._steps is None:
            self._steps = torch.load(self.batches, weights_only=False)
        batch, self._calls = self._steps[self._calls], self._calls + 1
        rank, world = self.trainer.global_rank, self.trainer.world_size
        size = len(batch) // world
        return batch.select(torch.arange(rank * size, (rank + 1) * size))


class Record(L.Callback):
    """Per-rank logged loss and grad norm of every step; the full policy state dict from rank 0 at the end."""

    def __init__(self, out: str) -> None:
        self.out, self.steps = Path(out), []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        m = trainer.callback_metrics
        self.steps.append({k: float(m[k]) for k in ("loss/total", "train/grad_norm")})

    def on_train_end(self, trainer, pl_module) -> None:
        from torch.distributed.tensor import DTensor

        state = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu().clone()
                 for k, v in pl_module.policy.state_dict().items()}  # full_tensor: every rank takes part
        from torch.distributed.fsdp import FSDPModule
        from transformers.modeling_layers import GradientCheckpointingLayer

        sharded = any(isinstance(p, DTensor) for p in pl_module.policy.parameters())
        layers = [m for m in pl_module.policy.modules() if isinstance(m, GradientCheckpointingLayer)]
        sharded = sharded and bool(layers) and all(isinstance(m, FSDPModule) for m in layers)  # each its own unit
        reference = list(pl_module.reference.parameters())  # the frozen reference, sharded like the policy
        reference_sharded = bool(reference) and all(isinstance(p, DTensor) and p.device_mesh.size() == 2
                                                    and p.to_local().numel() < p.numel() for p in reference)
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(
            {"steps": self.steps, "world_size": trainer.world_size, "sharded": sharded,
             "reference_sharded": reference_sharded, "strategy": type(trainer.strategy).__name__}))
        if trainer.global_rank == 0:
            torch.save(state, self.out / "policy.pt")


def compose_run(trainer: str, experience: str, cache_dir: str, out: str, *extra: str):
    GlobalHydra.instance().clear()  # no HydraConfig: Lightning then re-launches `python -m tests.test_scale ...`
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        cfg = compose("train", overrides=[*FAST, *RUN, f"trainer={trainer}",
                                          "data._target_=tests.test_scale.FixedExperience",
                                          f"+data.batches={experience}",
                                          "+callbacks.record._target_=tests.test_scale.Record",
                                          f"+callbacks.record.out={out}", *extra])
    with open_dict(cfg):
        cfg.paths.output_dir, cfg.paths.cache_dir = out, cache_dir
    return cfg


def main(argv: list[str]) -> None:
    trainer_name, experience, cache_dir, out, *extra = argv
    module, datamodule, trainer = build(compose_run(trainer_name, experience, cache_dir, out, *extra))
    trainer.fit(module, datamodule=datamodule)


def run(trainer: str, experience: Path, cache_dir: Path, out: Path, *extra: str) -> tuple[list[dict], dict, float]:
    out.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tests.test_scale", trainer, str(experience), str(cache_dir),
                           str(out), *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0, f"trainer={trainer} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    return ranks, torch.load(out / "policy.pt"), elapsed


def mean_over_ranks(ranks: list[dict], key: str) -> list[float]:
    return [sum(r["steps"][s][key] for r in ranks) / len(ranks) for s in range(STEPS)]


@pytest.fixture(scope="module")
def experience(tmp_path_factory, cache_dir) -> Path:
    """STEPS batches of PROMPTS x N rollouts of the initial policy, saved for every run to share."""
    from tests.conftest import compose_train

    tmp = tmp_path_factory.mktemp("scale")
    cfg = compose_train([*FAST, *RUN], tmp / "gen", cache_dir)
    GlobalHydra.instance().clear()
    module, datamodule, _ = build(cfg)
    datamodule.setup("fit")
    datamodule.experience.bind(module.policy, module.tokenizer)
    loader = iter(datamodule.train_dataloader())
    batches = [datamodule.experience.draw(next(loader)) for _ in range(STEPS)]
    scores = torch.Generator().manual_seed(0)
    for b in batches:
        b.scores = torch.rand(len(b), generator=scores)  # the tiny policy is mostly wrong: give every group a spread
        b.reward_parts = {}  # rollouts of one prompt are contiguous, so each half holds whole groups
        half = len(b) // 2
        assert len(b) == PROMPTS * N and not set(b.group_ids[:half].tolist()) & set(b.group_ids[half:].tolist())
        assert b.scores.std() > 0
    torch.save({k: v.detach().clone() for k, v in module.policy.state_dict().items()}, tmp / "init.pt")
    path = tmp / "experience.pt"
    torch.save(batches, path)
    return path


@pytest.fixture(scope="module")
def single(experience, cache_dir):
    return run("cpu", experience, cache_dir, experience.parent / "cpu")


@pytest.mark.parametrize("trainer, extra", [("ddp_cpu", ()), ("fsdp2_cpu", ()),
                                            ("fsdp2_cpu", ("model.head_chunk_tokens=7",)),
                                            ("fsdp2_cpu", ("model.activation_checkpointing=true",)),
                                            ("ddp_cpu", ("method.logprob_token_budget=32",)),
                                            ("fsdp2_cpu", ("method.logprob_token_budget=32",))],
                         ids=["ddp_cpu", "fsdp2_cpu", "fsdp2_cpu-chunked_head", "fsdp2_cpu-activation_checkpointing",
                              "ddp_cpu-micro_batches", "fsdp2_cpu-micro_batches"])
def test_two_processes_match_one(trainer, extra, experience, single, cache_dir):
    """Also the chunked LM head under FSDP2 (the head runs inside the sharded root's forward, so its weight is
    unsharded there and again for the backward) against one process with the model's own logits, activation
    checkpointing, and update micro-batches of at most 32 tokens (several per update on each rank; DDP
    all-reduces at the last, FSDP2 reduce-scatters each, every rank running as many as the rank with the most)
    against one process with one micro-batch."""
    one, one_state, one_s = single
    ranks, state, elapsed = run(trainer, experience, cache_dir, experience.parent / "_".join([trainer, *extra]).replace("=", "-"), *extra)
    assert len(ranks) == 2 and all(r["world_size"] == 2 for r in ranks)
    assert all(r["sharded"] for r in ranks) == (trainer == "fsdp2_cpu")
    assert all(r["reference_sharded"] for r in ranks) == (trainer == "fsdp2_cpu")
    loss_1, loss_2 = mean_over_ranks(one, "loss/total"), mean_over_ranks(ranks, "loss/total")
    norm_1, norm_2 = mean_over_ranks(one, "train/grad_norm"), mean_over_ranks(ranks, "train/grad_norm")
    diff = max((state[k] - one_state[k]).abs().max().item() for k in one_state)
    init = torch.load(experience.parent / "init.pt")
    moved = max((one_state[k] - v).abs().max().item() for k, v in init.items())
    print(f"\n{trainer}: loss 1 proc {loss_1} / 2 procs {loss_2}; grad norm {norm_1} / {norm_2}; "
          f"max |w diff| {diff:.3g} (moved {moved:.3g}); {one_s:.1f}s / {elapsed:.1f}s")
    assert state.keys() == one_state.keys()
    assert loss_2 == pytest.approx(loss_1, rel=1e-5, abs=1e-6)
    assert norm_2 == pytest.approx(norm_1, rel=1e-5, abs=1e-6)
    assert moved > 1e-3 and diff < 1e-5


if __name__ == "__main__":
    main(sys.argv[1:])
