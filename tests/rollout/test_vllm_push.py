"""VLLMEngine's CUDA-only behaviour without vLLM or a GPU: the weight push and sleep mode against a fake
``vllm.LLM`` (sleep mode and bfloat16 are CUDA paths; here ``torch.cuda.is_available`` is patched where they need
it), the launcher environment with patched ``torch.cuda`` functions, the tensor-parallel refusals, the ``auto``
dtype and the DataModule closing the engine at the end of a fit. The real engine is tested in test_vllm.py
(``-m vllm``)."""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
from hydra.utils import instantiate
from transformers import LlamaConfig, LlamaForCausalLM

from data_modules.rollout import RolloutDataModule
from lit_credit.config import ConfigError, check_config
from lit_credit.models import build_tokenizer
from lit_credit.rollout import Experience
from lit_credit.rollout.vllm_engine import VLLMEngine, _launcher_env
from lit_credit.tasks.base import SingleTurnEnvironment
from lit_credit.types import RewardResult, SamplingParams

CORPUS = ["What is 3 + 4?\n7", "Try again. Wrong answer."] * 20
BOTH = frozenset({"weights", "kv_cache"})


class FakeLLM:
    """The part of ``vllm.LLM`` that VLLMEngine uses. Records its calls in order; ``sleeping`` is what
    ``sleep(level=1)`` released and no ``wake_up`` brought back; each push records ``(name, dtype, shape)`` of the
    tensors the weights iterator yields (``handed``: the tensors themselves) and what was asleep meanwhile."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.sleeping: set[str] = set()
        self.pushed: list[list[tuple[str, torch.dtype, tuple[int, ...]]]] = []
        self.handed: list[list[tuple[str, torch.Tensor]]] = []

    def sleep(self, level: int = 1) -> None:
        self.calls.append(("sleep", level))
        self.sleeping = set(BOTH)

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(("wake_up", tags))
        self.sleeping -= set(tags or BOTH)

    def collective_rpc(self, method: str, kwargs: dict) -> None:
        assert method == "reload_weights"
        self.calls.append(("reload_weights", frozenset(self.sleeping)))
        self.handed.append(list(kwargs["weights_iterator"]))
        self.pushed.append([(name, t.dtype, tuple(t.shape)) for name, t in self.handed[-1]])

    def reset_prefix_cache(self) -> None:
        self.calls.append(("reset_prefix_cache",))


class UntaggedLLM(FakeLLM):
    """A vLLM whose ``wake_up`` takes no tags: everything wakes at once."""

    def wake_up(self) -> None:  # type: ignore[override]
        self.calls.append(("wake_up", None))
        self.sleeping = set()


class Zero:
    def __call__(self, row, replies, tool_responses=None, turn_scores=None):
        return RewardResult(0.0, {})


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(CORPUS, 300)


def tiny(tok, tied: bool = True) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                        tie_word_embeddings=tied, pad_token_id=tok.pad_token_id,
                                        eos_token_id=tok.eos_token_id)).eval()


@pytest.fixture
def faked(monkeypatch):
    """``faked(llm, cuda=..., **engine kwargs)``: a VLLMEngine whose ``vllm.LLM`` is ``llm`` (every build; the
    builds counted in ``engine.builds``), on a pretended CUDA machine where ``cuda``."""
    def make(llm: FakeLLM, cuda: bool = False, **kwargs) -> VLLMEngine:
        if cuda:
            monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        engine = VLLMEngine(**kwargs)
        engine.builds = 0

        def create(directory: str) -> FakeLLM:
            engine.builds += 1
            return llm

        monkeypatch.setattr(engine, "_create", create)
        monkeypatch.setattr(engine, "_check_head_dim", lambda model: None)
        return engine

    return make


def test_sync_after_release_wakes_the_weights_alone_for_the_push_then_the_kv_cache(faked, tok):
    """The experience layer's order (release: ``sleep``; sync_weights: ``wake``, ``update_weights``) on a CUDA
    engine in sleep mode (a fake LLM: CUDA only): the weights alone are woken, the push runs with the KV cache
    still released, and the KV cache is woken after it (TRL's colocate order)."""
    model, llm = tiny(tok), FakeLLM()
    engine = faked(llm, cuda=True, enable_sleep_mode=True)
    exp = Experience(engine, SingleTurnEnvironment(), Zero(), SamplingParams(n=2), max_turns=1)
    exp.bind(model, tok)
    exp.sync_weights(model)  # first use: the engine is built and pushed
    assert llm.calls == [("reload_weights", frozenset()), ("reset_prefix_cache",)] * 2
    llm.calls.clear()
    exp.release()  # the step's generation done
    exp.sync_weights(model)  # after the policy update
    assert llm.calls == [("sleep", 1), ("wake_up", ["weights"]), ("reload_weights", frozenset({"kv_cache"})),
                         ("reset_prefix_cache",), ("wake_up", ["kv_cache"])]
    assert llm.sleeping == set()


def test_a_push_into_a_sleeping_engine_puts_it_back_to_sleep(faked, tok):
    model, llm = tiny(tok), FakeLLM()
    engine = faked(llm, cuda=True, enable_sleep_mode=True)
    engine.bind(model, tok)
    engine.sleep()
    llm.calls.clear()
    engine.update_weights(model)
    assert llm.calls == [("wake_up", ["weights"]), ("reload_weights", frozenset({"kv_cache"})),
                         ("reset_prefix_cache",), ("wake_up", ["kv_cache"]), ("sleep", 1)]
    assert llm.sleeping == BOTH


def test_a_half_awake_engine_is_woken_whole_before_it_sleeps_again(faked, tok):
    """``wake`` (the weights) then ``sleep`` with no push or generation between: the KV cache is woken before
    vLLM sleeps again, so no allocation is released twice (older vLLM allocators would)."""
    model, llm = tiny(tok), FakeLLM()
    engine = faked(llm, cuda=True, enable_sleep_mode=True)
    engine.bind(model, tok)
    engine.sleep()
    engine.wake()
    engine.sleep()
    engine.sleep()  # asleep already: nothing
    assert llm.calls[2:] == [("sleep", 1), ("wake_up", ["weights"]), ("wake_up", ["kv_cache"]), ("sleep", 1)]


def test_a_vllm_without_wake_up_tags_is_woken_whole(faked, tok):
    model, llm = tiny(tok), UntaggedLLM()
    engine = faked(llm, cuda=True, enable_sleep_mode=True)
    engine.bind(model, tok)
    engine.sleep()
    engine.wake()
    llm.calls.clear()
    engine.update_weights(model)
    assert llm.calls == [("reload_weights", frozenset()), ("reset_prefix_cache",)]


def test_sleep_mode_is_off_without_cuda(faked, tok):
    model, llm = tiny(tok), FakeLLM()
    engine = faked(llm, enable_sleep_mode=True)
    engine.bind(model, tok)
    engine.sleep()
    engine.wake()
    assert [c[0] for c in llm.calls] == ["reload_weights", "reset_prefix_cache"]


@pytest.mark.parametrize("tied", [True, False])
def test_the_push_is_cast_to_the_engine_dtype_and_a_tied_embedding_is_cast_once(faked, tok, tied):
    """A float32 policy into a bfloat16 engine: every tensor handed over is bfloat16 already (half the bytes). A
    tied output embedding is handed over under both names (vLLM's layerwise reload processes ``lm_head`` as a
    layer of its own: tests/rollout/test_vllm.py's greedy match fails without it) but produced once: one cast
    copy (under FSDP2 one gather), ``lm_head.weight`` right after ``embed_tokens``. An untied one is its own."""
    model, llm = tiny(tok, tied), FakeLLM()
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    engine = faked(llm, dtype="bfloat16")
    engine.bind(model, tok)
    engine.update_weights(model)
    assert len(llm.pushed) == 2 and llm.pushed[0] == llm.pushed[1]
    names = [name for name, _, _ in llm.pushed[0]]
    assert {dtype for _, dtype, _ in llm.pushed[0]} == {torch.bfloat16}
    assert sorted(names) == sorted(model.state_dict())
    handed = dict(llm.handed[1])
    assert (handed["lm_head.weight"] is handed["model.embed_tokens.weight"]) == tied
    assert (names.index("lm_head.weight") == names.index("model.embed_tokens.weight") + 1) == tied
    assert torch.equal(handed["lm_head.weight"], model.lm_head.weight.detach().bfloat16())
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the policy itself is not cast


def test_rollout_dtype_auto_is_bfloat16_on_cuda_and_float32_on_cpu(monkeypatch, make_cfg):
    assert instantiate(make_cfg("rollout=vllm").rollout).dtype == "float32"  # conf/rollout/vllm.yaml's auto
    assert VLLMEngine(dtype="float32").dtype == "float32"
    with pytest.raises(ValueError, match=r"rollout.dtype='fp8'.*fix: one of auto"):
        VLLMEngine(dtype="fp8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert VLLMEngine().dtype == "bfloat16" and VLLMEngine(dtype="float32").dtype == "float32"


def test_a_closed_engine_rebinds_to_its_policy_at_its_next_use(faked, tok):
    model, llm = tiny(tok), FakeLLM()
    engine = faked(llm)
    engine.bind(model, tok)
    engine.close()
    assert engine.llm is None
    assert engine.generate([], SamplingParams(n=2)) == []  # rebuilt (no prompt: nothing sampled)
    assert engine.builds == 2 and engine.llm is llm and len(llm.pushed) == 2
    engine.close()
    engine.update_weights(model)
    assert engine.builds == 3 and len(llm.pushed) == 3
    with pytest.raises(RuntimeError, match=r"before bind"):
        faked(FakeLLM()).generate([[1]], SamplingParams(n=2))


def test_the_datamodule_closes_the_engine_at_the_end_of_fit_only():
    closed = []
    holder = SimpleNamespace(experience=SimpleNamespace(engine=SimpleNamespace(close=lambda: closed.append(1))))
    RolloutDataModule.teardown(holder, "validate")  # validate_first runs before fit: the engine stays
    assert closed == []
    RolloutDataModule.teardown(holder, "fit")
    assert closed == [1]
    RolloutDataModule.teardown(SimpleNamespace(experience=SimpleNamespace(engine=object())), "fit")  # no close()


def test_launcher_local_rank_is_the_trainers_cuda_device(monkeypatch):
    """``trainer.devices=[2,3]``: the launcher's LOCAL_RANK is 0 on the process whose device is GPU 2, and vLLM
    binds ``cuda:LOCAL_RANK``. Patched ``torch.cuda`` (no GPU here)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("RANK", "5")
    with _launcher_env(0):
        assert os.environ["LOCAL_RANK"] == "2" and os.environ["RANK"] == "0"
    assert os.environ["LOCAL_RANK"] == "0" and os.environ["RANK"] == "5"  # the launcher's, put back
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.delenv("RANK")
    with _launcher_env(1):
        assert os.environ["LOCAL_RANK"] == "2" and os.environ["RANK"] == "1"
    assert "LOCAL_RANK" not in os.environ and "RANK" not in os.environ


def test_launcher_local_rank_on_cpu_is_the_launchers(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("LOCAL_RANK", "1")
    with _launcher_env(1):
        assert os.environ["LOCAL_RANK"] == "1"
    monkeypatch.delenv("LOCAL_RANK")
    with _launcher_env(1):
        assert os.environ["LOCAL_RANK"] == "0"
    assert "LOCAL_RANK" not in os.environ


@pytest.mark.parametrize(("overrides", "error"), [
    (["trainer=cpu", "rollout.tensor_parallel_size=2"],
     r"rollout.tensor_parallel_size=2: with one trainer process .* fix: run trainer.devices=2"),
    (["trainer=ddp_cpu", "rollout.tensor_parallel_size=3", "data.prompts_per_step=6"],
     r"rollout.tensor_parallel_size=3: does not divide the 2 trainer processes"),
    (["trainer=ddp_cpu", "trainer.devices=[0,1,2]", "rollout.tensor_parallel_size=2", "data.prompts_per_step=6"],
     r"rollout.tensor_parallel_size=2: does not divide the 3 trainer processes"),
    (["trainer=cpu", "rollout.tensor_parallel_size=0"], r"rollout.tensor_parallel_size=0: must be >= 1"),
])
def test_tensor_parallel_sizes_that_do_not_tile_the_processes_are_refused(make_cfg, overrides, error):
    with pytest.raises(ConfigError, match=error):
        check_config(make_cfg("rollout=vllm", *overrides))


def test_tensor_parallel_sizes_that_tile_the_processes_pass(make_cfg):
    check_config(make_cfg("rollout=vllm", "trainer=ddp_cpu", "rollout.tensor_parallel_size=2"))
    check_config(make_cfg("rollout=vllm", "trainer=cpu"))


def test_the_engine_refuses_tensor_parallel_in_one_process_before_building(faked, tok):
    engine = faked(FakeLLM(), tensor_parallel_size=2)
    with pytest.raises(ConfigError, match=r"rollout.tensor_parallel_size=2: with one trainer process"):
        engine.bind(tiny(tok), tok)
    assert engine.builds == 0 and engine.llm is None
