"""The full state dict of a policy, whole or sharded."""
from __future__ import annotations

import torch


def is_sharded(model: torch.nn.Module) -> bool:
    """True when ``model`` holds FSDP2 / tensor-parallel (DTensor) parameters."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return False
    return any(isinstance(p, DTensor) for p in model.parameters())


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()``; for a sharded model the gathered full state dict on CPU.

    Sharded: a collective, so every rank must call it; rank 0 receives the tensors, other ranks ``{}``.
    """
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def tied_names(model: torch.nn.Module) -> set[str]:
    """The names of parameters that are an earlier-named parameter (the output embedding of tied word embeddings):
    what ``save_pretrained`` leaves out of an unsharded model's files, and must leave out of a gathered state dict,
    whose tensors no longer share storage."""
    seen, tied = set(), set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            tied.add(name)
        seen.add(id(param))
    return tied
