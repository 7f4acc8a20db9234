"""Where the policy comes from: a local HF causal-LM directory or a hub id (:mod:`~lit_credit.models.hub`), or the
embedded default."""
from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.modeling_layers import GradientCheckpointingLayer

from lit_credit.models.embedded import CachedPolicy
from lit_credit.models.hub import resolve_model_dir

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def is_peft(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a PEFT (LoRA) model, whose reference policy is itself with adapters disabled."""
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def checkpoint_layers(model: torch.nn.Module) -> int:
    """Activation checkpointing: each decoder layer (a transformers ``GradientCheckpointingLayer``) keeps only
    its inputs for backward and runs its forward again there (``torch.utils.checkpoint``, non-reentrant),
    whenever gradients are on, in eval mode too (transformers' own ``gradient_checkpointing_enable`` acts in
    train mode only, and RL runs the policy in eval mode: no dropout). A layer's saved activations shrink to
    its input; the backward pays one more forward of every layer. Under ``torch.no_grad`` (rollouts,
    reference and old log-probs) the layers run as before. Returns the number of layers made so; a model
    without such layers is refused by name."""
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise ValueError(f"model.activation_checkpointing=true: {type(model).__name__} has no decoder layers of "
                         "transformers' GradientCheckpointingLayer kind to checkpoint; set it to false")
    for layer in layers:
        layer.__class__ = _checkpointed(type(layer))
    return len(layers)


@functools.cache
def _checkpointed(cls: type) -> type:
    """``cls`` whose forward is recomputed in backward when gradients are on (:func:`checkpoint_layers`)."""
    if getattr(cls, "checkpointed_layer", False):  # already made so
        return cls

    def forward(self, *args, **kwargs):
        if not torch.is_grad_enabled():
            return cls.forward(self, *args, **kwargs)
        # no KV cache across a recompute (it would be written twice), as transformers' own checkpointing does
        kwargs.update({k: None for k in ("past_key_values", "layer_past") if kwargs.get(k) is not None})
        if kwargs.get("use_cache"):
            kwargs["use_cache"] = False
        return checkpoint(cls.forward, self, *args, use_reentrant=False, **kwargs)

    name = f"Checkpointed{cls.__name__}"
    made = type(name, (cls,), {"forward": forward, "checkpointed_layer": True, "__module__": __name__,
                               "__qualname__": name})
    globals()[name] = made  # so a pickled model finds its class
    return made


class PolicySource:
    """Loads ``(model, tokenizer)`` with ``from_pretrained`` from ``path``, or from the embedded policy's
    cache when ``path`` is None. ``path`` is resolved as transformers resolves a name
    (:func:`~lit_credit.models.hub.resolve_model_dir`): a local directory first, else a Hugging Face Hub id,
    downloaded once into the HF cache (only the cache with ``HF_HUB_OFFLINE=1``); the embedded policy never
    touches a hub.

    Two steps, so that building a module never trains one: :meth:`prepare` makes what :meth:`load` reads
    (the embedded policy's tokenizer, model and SFT warm start, once per recipe, cached on disk; nothing for
    a local ``path``; a hub id's snapshot, downloaded when not cached) and returns the directory; :meth:`load`
    only loads, and refuses an embedded policy that is not built yet. The entry points (``lit-credit``'s :func:`lit_credit.train.build`, ``lit-credit-cli``)
    prepare the source before they build the module; code that builds a module itself calls ``prepare()``
    first.

    ``lora`` (a ``peft.LoraConfig``, e.g. ``model/lora=r8``): the model is wrapped with one trainable LoRA
    adapter named :data:`ADAPTER` and the base weights frozen; the reference policy is then the base with
    adapters disabled (no copy). Methods with more roles add adapters beside it (DPA-GRPO's verifier).

    Precision: the weights that train are fp32 master weights whatever the checkpoint's dtype and ``dtype``
    (:meth:`load`); ``dtype`` is the dtype of the weights that never train (a LoRA policy's frozen base, a frozen
    judge's model), which they are stored and computed in. The compute dtype of training is the trainer's:
    ``trainer.precision=bf16-mixed`` autocasts the forward to bf16 over the fp32 weights (and under FSDP2
    all-gathers them in bf16, :meth:`~lit_credit.methods.base.PolicyModule.configure_model`), so an update
    smaller than a bf16 ulp still moves a weight; ``32-true`` computes in fp32.

    ``embedded`` is any :class:`~lit_credit.models.embedded.CachedPolicy`, built once into a cache directory:
    the embedded tiny policy (:class:`~lit_credit.models.embedded.EmbeddedPolicy`) or SmolLM2 converted from its GGUF
    (:class:`~lit_credit.models.smollm2.SmolLM2`, ``model=smollm2``). ``head_chunk_tokens``: the trainer's
    log-probs come from the chunked LM head, that many tokens at a time (:mod:`~lit_credit.models.chunked_head`:
    no [B, T, V] logits); None: the model's own logits. ``activation_checkpointing``: each decoder layer's
    activations are recomputed in backward instead of kept (:func:`checkpoint_layers`).
    """

    ADAPTER = "generator"

    def __init__(self, path: str | None = None, embedded: CachedPolicy | None = None, dtype: str = "float32",
                 lora: Any = None, head_chunk_tokens: int | None = None, activation_checkpointing: bool = False) -> None:
        if path is None and embedded is None:
            raise ValueError("model.path is null and model.embedded is null: give a local HF model directory "
                             "(model.path=/dir) or a hub id (model.path=Qwen/Qwen2.5-0.5B-Instruct), or keep the "
                             "default embedded policy")
        if dtype not in _DTYPES:
            raise ValueError(f"model.dtype={dtype!r}: the dtype of the weights that never train (a LoRA base, a "
                             f"frozen judge); use one of {sorted(_DTYPES)}")
        if head_chunk_tokens is not None and head_chunk_tokens < 1:
            raise ValueError(f"model.head_chunk_tokens={head_chunk_tokens}: tokens per LM-head chunk, >= 1 (null: "
                             "the model's own [B, T, V] logits)")
        self.path, self.embedded, self.dtype, self.lora = path, embedded, dtype, lora
        self.head_chunk_tokens = head_chunk_tokens
        self.activation_checkpointing = bool(activation_checkpointing)
        self._resolved: str | None = None  # model.path's directory, once resolved

    def prepare(self) -> str:
        """The directory :meth:`load` reads, built first if it is the embedded policy's and not cached yet
        (:meth:`EmbeddedPolicy.build`: the SFT warm start, minutes on CPU the first time; a cache hit after);
        for ``path``, its directory (:meth:`directory`: a hub id's snapshot, downloaded when not cached)."""
        return self.directory() if self.path is not None else str(self.embedded.build())

    def directory(self) -> str:
        """``path``'s local directory (:func:`~lit_credit.models.hub.resolve_model_dir`), resolved once."""
        if getattr(self, "_resolved", None) is None:
            self._resolved = resolve_model_dir(self.path, "model.path")
        return self._resolved

    def load(self, trainable: bool = True, empty: bool = False) -> tuple[torch.nn.Module, Any]:
        """``(model, tokenizer)`` from the prepared directory; builds and trains nothing.

        ``trainable`` (the policy): every parameter that trains is fp32, the master weight the optimiser updates;
        without LoRA the whole model is loaded in fp32 (from a bf16 checkpoint exactly its values; from an fp32
        one without rounding), with LoRA the frozen base stays in ``dtype`` and the adapters (and any
        ``modules_to_save``) are fp32. ``trainable=False`` (a frozen model that is never trained: a judge, a tool
        simulator): every weight in ``dtype``, half the memory of fp32 in bf16.

        ``empty``: the same model (class, config, generation config, dtypes, tied weights, eval mode) on the meta
        device, no weight read: what a rank builds that receives its FSDP2 shards from rank 0's load
        (:meth:`~lit_credit.methods.base.PolicyModule.configure_model`). Not with LoRA."""
        if empty and self.lora is not None:
            raise ValueError("PolicySource.load(empty=True): a LoRA policy is loaded on every rank")
        if self.path is not None:
            where = self.directory()
        elif self.embedded.built:
            where = str(self.embedded.path)
        else:
            raise ValueError(f"model.embedded: the embedded policy is not built yet ({self.embedded.path} is "
                             "missing): call PolicySource.prepare() before load() or before building the module "
                             "(it runs the SFT warm start once and caches it), or run through `lit-credit` or "
                             "`lit-credit-cli`, which prepare the policy first")
        tokenizer = AutoTokenizer.from_pretrained(where, local_files_only=True)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        dtype = torch.float32 if trainable and self.lora is None else _DTYPES[self.dtype]
        model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, local_files_only=True,
                                                     **({"device_map": "meta"} if empty else {}))
        if self.activation_checkpointing:
            checkpoint_layers(model)
        if self.lora is not None:
            from peft import get_peft_model

            model = get_peft_model(model, self.lora, adapter_name=self.ADAPTER)
        if trainable:
            for param in model.parameters():
                if param.requires_grad and param.dtype != torch.float32:  # LoRA's modules_to_save
                    param.data = param.data.float()
        return model, tokenizer
