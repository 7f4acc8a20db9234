"""GPU mistakes caught on CPU (lit_credit.emulation): the checking device, NCCL's inference-mode evaluation and the
collective-symmetry check, by hand, and the standard jobs run through `lit-credit ... emulate_gpu=true` on one
process and on two FSDP2 ranks over gloo (slow)."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from lit_credit.analysis.metrics import gradient_cosine, step_exact_match
from lit_credit.emulation import (
    ACC,
    ACCELERATOR,
    HOST,
    PROJECT_DIRS,
    CollectiveMismatchError,
    CollectiveRecorder,
    DeviceCheck,
    DeviceMismatchError,
    place_module,
    place_of,
)
from tests.conftest import FAST_MODEL

ROOT = Path(__file__).resolve().parents[1]
HERE = (str(Path(__file__).parent) + os.sep,)  # this file's code is checked like the project's


# ------------------------------------------------------------------------------------------ the checking device
def test_placement_follows_devices_moves_and_inputs():
    with DeviceCheck(roots=HERE):
        host = torch.arange(3)  # no device: the host
        acc = torch.zeros(3, device=ACCELERATOR)
        assert place_of(host) == HOST and place_of(acc) == ACC
        assert acc.device == ACCELERATOR and host.device == torch.device("cpu")  # .device reads the place
        moved = host.to(acc.device)
        assert place_of(moved) == ACC and place_of(host) == HOST  # a move makes a new tensor; the input stays
        assert place_of(torch.arange(3, device=acc.device)) == ACC
        assert place_of((acc * 2).cpu()) == HOST
        assert place_of(acc + moved) == ACC
        assert place_of(acc + torch.tensor(2.0)) == ACC  # a 0-dim host tensor mixes, as a CPU scalar on CUDA
        acc[host[:1]] = 1.0  # indexing with host indices is allowed on CUDA


def test_an_accelerator_tensor_meeting_a_host_tensor_raises_where_cuda_would():
    with DeviceCheck(roots=HERE):
        acc = torch.ones(2, 3, device=ACCELERATOR)
        with pytest.raises(DeviceMismatchError, match=r"test_gpu_emulation.py:\d+: torch gt mixes .* shape \(3,\)"):
            _ = acc > torch.arange(3)
        with pytest.raises(DeviceMismatchError, match="torch cat"):
            torch.cat([acc, torch.zeros(1, 3)])
        with pytest.raises(DeviceMismatchError, match="numpy"):
            acc.numpy()


def test_a_host_tensor_is_caught_wherever_it_meets_the_accelerator():
    with DeviceCheck(roots=HERE):
        acc, host = torch.ones(2, 3, device=ACCELERATOR), torch.zeros(2, 3)
        layer = torch.nn.Linear(3, 1)
        place_module(layer)
        with pytest.raises(DeviceMismatchError, match=r"test_gpu_emulation.py:\d+: torch linear"):
            layer(host)  # a forgotten .to(device) before a forward: caught in the model's first layer
        with pytest.raises(DeviceMismatchError, match=r"test_gpu_emulation\.py"):
            torch.nn.functional.mse_loss(acc, host)  # torch's Python functions name their caller
        with pytest.raises(DeviceMismatchError, match="__getitem__"):
            _ = host[torch.tensor([0], device=ACCELERATOR)]  # CPU tensor, CUDA index
        assert place_of(torch.arange(3, device=None)) == HOST  # device=None is no device


def test_only_the_projects_code_makes_host_tensors():
    with DeviceCheck(roots=("/nowhere/",)):
        acc = torch.ones(3, device=ACCELERATOR)
        assert place_of(torch.arange(3)) is None  # a library's tensor made without a device is not placed
        assert (acc > torch.arange(3)).all() is not None


def test_the_tool_metrics_step_match_makes_its_steps_on_the_rollouts_device():
    """Finding 2 of issue 49: ``gold_steps[:, None] > torch.arange(depth)`` compared a device tensor with a CPU one
    (every ``metrics=tool`` run on a GPU failed at step 1)."""
    assert PROJECT_DIRS[0].endswith(f"lit_credit{os.sep}")
    exact = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    gold = torch.tensor([2.0, 1.0])
    with DeviceCheck():
        exact, gold = exact.to(ACCELERATOR), gold.to(ACCELERATOR)
        assert place_of(gold) == ACC
        # step 1: both rollouts' plans reach it, both exact; step 2: only rollout 0's, not exact
        assert step_exact_match(exact, gold) == {1: 1.0, 2: 0.0}


def test_marks_survive_on_parameters():
    layer = torch.nn.Linear(2, 2)
    place_module(layer)
    with DeviceCheck(roots=HERE):
        out = layer(torch.ones(1, 2, device=ACCELERATOR))
        assert place_of(out) == ACC
        assert next(layer.parameters()).device == ACCELERATOR


# ------------------------------------------------------------------------------------------ collectives
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _asymmetric_ranks(rank: int, port: int, errors: dict) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    recorder = CollectiveRecorder(None)
    all_reduce = recorder.wrap("all_reduce", torch.distributed.all_reduce)
    all_reduce(torch.ones(2))
    recorder.compare("step 0")  # the same so far
    if rank == 1:
        recorder.record("generate")  # an engine call rank 0 does not make: a collective under tensor parallelism
    all_reduce(torch.ones(2))
    try:
        recorder.compare("step 1")
    except CollectiveMismatchError as error:
        errors[rank] = str(error)
    torch.distributed.destroy_process_group()


def test_the_ranks_collectives_are_compared_and_the_first_difference_named():
    errors = mp.Manager().dict()
    mp.spawn(_asymmetric_ranks, args=(_free_port(), errors), nprocs=2, join=True)
    assert set(errors) == {0, 1} and errors[0] == errors[1]
    assert "step 1: the ranks' collectives differ at call 0" in errors[0]
    assert "rank 0: all_reduce[(2,)] (1 calls); rank 1: generate (2 calls)" in errors[0]


def test_gradient_cosine_by_hand():
    # a = (1, 0, 1), b = (1, 1, 0): a.b = 1, |a| = |b| = sqrt 2, cos = 1/2; a zero gradient has none.
    assert gradient_cosine(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([1.0, 1.0, 0.0])) == pytest.approx(0.5)
    assert gradient_cosine(torch.zeros(3), torch.ones(3)) is None


# ------------------------------------------------------------------------------------------ inference mode
def _generate_in_inference_mode_then_train(rank: int, port: int) -> None:
    """Finding 1 of issue 49: FSDP2's unsharded buffers, made by the HF engine's first generation inside
    Lightning's inference-mode validation (NCCL's), were inference tensors that training's all-gather then wrote
    into."""
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    from lit_credit.rollout.engine import HFEngine
    from lit_credit.types import SamplingParams

    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=2, pad_token_id=0,
                                         eos_token_id=1, bos_token_id=2))
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)

    class Tokenizer:
        pad_token_id, eos_token_id = 0, 1

        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    engine = HFEngine()
    engine.bind(model, Tokenizer())
    with torch.inference_mode():  # validation under NCCL
        engine.generate([[2, 5, 6]], SamplingParams(n=2, max_new_tokens=3), seeds=[7])
    engine.sleep()
    model(torch.tensor([[2, 5, 6, 7]])).logits.sum().backward()  # the next training step
    torch.distributed.destroy_process_group()


def test_generation_in_inference_mode_leaves_fsdp2_trainable():
    mp.spawn(_generate_in_inference_mode_then_train, args=(_free_port(),), nprocs=1, join=True)


# ------------------------------------------------------------------------------------------ the standard jobs
SMALL = ["model.embedded.sft_lr=1e-2", "model.embedded.hidden_size=64", "model.embedded.intermediate_size=128",
         "model.embedded.num_layers=2", "data.prompts_per_step=4", "data.sampling.n=2", "data.val_prompts=4",
         "trainer.max_steps=2", "trainer.val_check_interval=1", "callbacks.checkpoint.every_n_train_steps=1",
         "callbacks.hf_export.every_n_steps=1", "callbacks.credit_records.every_n_steps=1",
         "+trainer.enable_progress_bar=false"]
ARITH = ["task.max_operand=9", "task.num_test=20", "model.embedded.sft_target=0", "model.embedded.sft_steps=120", "data.sampling.max_new_tokens=8"]
TOOLS = ["model.embedded.sft_steps=2", "task.num_train=40", "task.num_test=8", "data.max_turns=2",
         "data.sampling.max_new_tokens=16"]
JOBS = {
    "grpo": ["experiment=grpo_arith", *ARITH],
    "dapo": ["experiment=dapo_arith", *ARITH],
    "slca": ["experiment=slca_toolcall", *TOOLS],  # grad_cosine_every=10: the segment cosine at step 0
    "slca_tcpo": ["experiment=slca_tcpo_toolcall", *TOOLS],
    "tcpo": ["experiment=tcpo_math", "task.max_operand=4", "task.num_test=20", "model.embedded.sft_steps=20",
             "data.sampling.n=4", "data.val_samples=0", "augment.top_l=2", "augment.samples=2",
             "data.sampling.max_new_tokens=8"],
    "dpa_grpo": ["experiment=dpa_form", "model.embedded.sft_steps=0", "task.num_train=1", "task.num_test=2",
                 "task.lines=[1a,15]", "task.rl_lines=null", "data.val_samples=0", "data.prompts_per_step=2",
                 "method.roles=shared"],
}
assert all(f"model.embedded.{k}" in " ".join(FAST_MODEL) for k in ("hidden_size", "num_layers"))


def emulated(run: Path, cache_dir: Path, job: str, trainer: str) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name("lit-credit")
    cmd = [str(script), *SMALL, *JOBS[job], f"trainer={trainer}", "emulate_gpu=true", f"paths.cache_dir={cache_dir}",
           f"hydra.run.dir={run}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    for key in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "LIT_CREDIT_RUN_ID"):
        env.pop(key, None)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["cpu", "fsdp2_cpu"])
@pytest.mark.parametrize("job", list(JOBS))
def test_the_standard_jobs_pass_the_gpu_emulation(job, trainer, tmp_path, cache_dir):
    """Each standard job for 2 steps with validation (before training and after each step), checkpoints and credit
    records, on the checking device with evaluation in inference mode; with ``fsdp2_cpu`` on 2 FSDP2 ranks whose
    collectives, engine calls and backward passes are compared after every step. Before the fixes of issue 49,
    ``slca`` failed on the checking device (the tool metrics) and under FSDP2 (the segment cosine's DTensors), and
    every FSDP2 job failed at step 1 (validation's inference tensors)."""
    run = tmp_path / "run"
    done = emulated(run, cache_dir, job, trainer)
    assert done.returncode == 0, done.stderr[-6000:]
    assert (run / "checkpoints" / "last.ckpt").exists() and any((run / "records").glob("*.parquet"))
    failures = re.findall(r"'(backend/[^']+)': ([0-9.]+)", (run / "train.log").read_text())
    assert not [key for key, value in failures if float(value)], failures  # no engine call failed (and was retried)
    for rank in range(2 if trainer == "fsdp2_cpu" else 1):  # the checks ran: calls checked, validations
        summary = json.loads((run / "emulation" / f"rank{rank}.json").read_text())
        assert summary["checked_calls"] > 1000
        # validate_first (trainer.validate) in inference mode as under NCCL; Lightning validates inside fit under
        # no_grad on every backend
        assert summary["validations_in_inference_mode"] == [True, False, False]
    if trainer == "fsdp2_cpu":
        ranks = [(run / "collectives" / f"rank{r}.txt").read_text().splitlines() for r in (0, 1)]
        assert ranks[0] == ranks[1]
        assert {"generate", "backward"} <= set(ranks[0])
        assert any(e.startswith("all_gather_single") for e in ranks[0])  # FSDP2's own all-gathers are recorded
