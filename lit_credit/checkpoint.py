"""Exact resume and nothing lost: random states in the checkpoint, atomic writes, run directories kept apart.

A Lightning checkpoint of a lit-credit run holds the policy (the module's state dict; the frozen reference is
made again from the policy's initial weights, never saved), optimiser and scheduler states, loop counters (``global_step``, batch progress), the DataModule's
position (training batches consumed, group counter) and, from :func:`capture_rng`, every random state a step
draws from: torch (CPU and CUDA), Python, NumPy, and the private generators of the module and the parts it
owns, and of the experience layer's reward and judge (e.g. DPA's exploration RNG, a noisy judge's RNG). Resumed
with ``ckpt_path``, a CPU run continues bitwise as the uninterrupted run would have. Under FSDP2 with
``save_distributed_checkpoint`` a checkpoint is a directory of every rank's shards (no rank gathers the model),
written beside the old one and swapped in (:func:`atomic_checkpoints`).
"""
from __future__ import annotations

import functools
import os
import random
import shutil
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
    private generators (the module's ``random_sources()`` with the experience layer's). CUDA: the current device's
    state only, the one this rank draws from (every visible device's would not restore on a machine with fewer
    GPUs, and a rank's other devices are other ranks')."""
    return {
        "torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "private": {k: g.getstate() if isinstance(g, random.Random) else g.get_state()
                    for k, g in _private_generators(sources).items()},
    }


def restore_rng(state: dict[str, Any], sources: dict[str, Any]) -> None:
    """Put back what :func:`capture_rng` returned, the CUDA state on the current device. An older checkpoint's
    CUDA entry is a list (every visible device's): the current device index's entry is taken, else the first."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    cuda = state["cuda"]
    if cuda is not None and torch.cuda.is_available():
        if isinstance(cuda, (list, tuple)):
            index = torch.cuda.current_device()
            cuda = cuda[index] if index < len(cuda) else cuda[0]
        torch.cuda.set_rng_state(cuda)
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
    """Make ``trainer`` write checkpoints through :class:`AtomicCheckpointIO` (unless it has its own IO), and a
    ``ModelParallelStrategy``'s checkpoints that are directories (``save_distributed_checkpoint``, or a file
    replacing one) through :func:`_save_beside`: Lightning would write them into the old one in place.

    A ``ModelParallelStrategy`` restores after setup, where Lightning 2.6 drops ``fit``'s ``weights_only``
    (``Trainer._run`` calls ``_restore_modules_and_callbacks(ckpt_path)`` without it; Lightning PR #21072):
    there ``None`` becomes ``weights_only`` here, False, what both entry points pass (a lit-credit checkpoint
    pickles hyperparameters and random states; load only your own runs' checkpoints)."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    strategy = trainer.strategy
    if type(strategy.checkpoint_io) is TorchCheckpointIO:
        strategy.checkpoint_io = AtomicCheckpointIO()
    if isinstance(strategy, ModelParallelStrategy) and "save_checkpoint" not in vars(strategy):
        strategy.save_checkpoint = functools.partial(_save_beside, strategy, strategy.save_checkpoint)
        load = strategy.load_checkpoint

        def load_checkpoint(checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
            return load(checkpoint_path, weights_only=False if weights_only is None else weights_only)

        strategy.load_checkpoint = load_checkpoint


def _save_beside(strategy: Any, save: Callable[..., None], checkpoint: dict[str, Any], filepath: Any,
                 storage_options: Any | None = None) -> None:
    """``save`` (``ModelParallelStrategy.save_checkpoint``, a collective) into a temporary sibling of the
    target, then rank 0 swaps it in (:func:`replace_path`): a crash leaves the old checkpoint or the new one."""
    target = Path(strategy.broadcast(str(filepath)))
    tmp = None  # rank 0 decides, on its view of the file system
    local = get_filesystem(target).protocol in ("file", ("file", "local"))
    if strategy.global_rank == 0 and local and (strategy._save_distributed_checkpoint or target.is_dir()):
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        if not strategy._save_distributed_checkpoint:  # a full file replacing a sharded directory
            os.rmdir(tmp)
    tmp = strategy.broadcast(tmp)
    if tmp is None:
        return save(checkpoint, filepath, storage_options)  # one file: AtomicCheckpointIO writes it atomically
    tmp = Path(tmp)
    try:
        save(checkpoint, tmp, storage_options)
        strategy.barrier("lit_credit.checkpoint.save")
        if strategy.global_rank == 0:
            replace_path(tmp, target)
        strategy.barrier("lit_credit.checkpoint.swap")
    finally:
        if strategy.global_rank == 0 and tmp.exists():
            shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()


def replace_path(new: Path, target: Path) -> None:
    """Put ``new`` (a file or a directory) at ``target``, whatever ``target`` is now: a file over a file is one
    rename; otherwise the old ``target`` is renamed aside (``.<name>.old``), ``new`` renamed in, then the old one
    removed, so at every moment one complete checkpoint is on disk under one of the two names."""
    if not target.is_dir() and not new.is_dir():
        os.replace(new, target)
        return
    old = target.with_name(f".{target.name}.old")
    if old.exists():
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    if target.exists():
        os.replace(target, old)
    os.replace(new, target)
    if old.exists():
        shutil.rmtree(old) if old.is_dir() else old.unlink()
