"""Exact resume and nothing lost: random states in the checkpoint, atomic writes, run directories kept apart.

A Lightning checkpoint of a lit-credit run holds the policy and the frozen reference (the module's state
dict), optimiser and scheduler states, loop counters (``global_step``, batch progress), the DataModule's
position (training batches consumed, group counter) and, from :func:`capture_rng`, every random state a step
draws from: torch (CPU and CUDA), Python, NumPy, and the private generators of the module and the parts it
owns, and of the experience layer's reward and judge (e.g. DPA's exploration RNG, a noisy judge's RNG). Resumed
with ``ckpt_path``, a CPU run continues bitwise as the uninterrupted run would have.
"""
from __future__ import annotations

import os
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins.io import TorchCheckpointIO


def _private_generators(sources: dict[str, Any]) -> dict[str, random.Random | torch.Generator]:
    """Every ``random.Random`` / ``torch.Generator`` attribute of ``sources`` (owner name -> object: the module
    and the parts it owns, its ``random_sources()``, and the experience layer's reward and judge), by
    ``<owner>.<attribute>``."""
    return {f"{owner}.{name}": value for owner, obj in sources.items() if obj is not None
            for name, value in vars(obj).items() if isinstance(value, (random.Random, torch.Generator))}


def capture_rng(sources: dict[str, Any]) -> dict[str, Any]:
    """Every random state a training step may draw from (see the module docstring); ``sources``: the owners of
    private generators (the module's ``random_sources()`` with the experience layer's)."""
    return {
        "torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "private": {k: g.getstate() if isinstance(g, random.Random) else g.get_state()
                    for k, g in _private_generators(sources).items()},
    }


def restore_rng(state: dict[str, Any], sources: dict[str, Any]) -> None:
    """Put back what :func:`capture_rng` returned."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    for key, generator in _private_generators(sources).items():
        if key in state["private"]:
            saved = state["private"][key]
            generator.setstate(saved) if isinstance(generator, random.Random) else generator.set_state(saved)


def atomic_write(target: str | os.PathLike[str], write: Callable[[Path], Any]) -> Path:
    """``write(tmp)`` to a temporary file beside ``target``, then rename it over ``target`` (atomic on POSIX): a
    crash leaves the old file or the new one, never half of one."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return target


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``torch.save`` checkpoints, written to a temporary name and renamed into place."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike[str],
                        storage_options: Any | None = None) -> None:
        if get_filesystem(path).protocol not in ("file", ("file", "local")):
            return super().save_checkpoint(checkpoint, path, storage_options)  # remote stores: their own way
        atomic_write(path, lambda tmp: torch.save(checkpoint, tmp))


def atomic_checkpoints(trainer: Any) -> None:
    """Make ``trainer`` write checkpoints through :class:`AtomicCheckpointIO` (unless it has its own IO)."""
    if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
        trainer.strategy.checkpoint_io = AtomicCheckpointIO()
