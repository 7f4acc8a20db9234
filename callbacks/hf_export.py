"""An HF ``save_pretrained`` copy of the policy beside the Lightning checkpoints."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import lightning as L

from lit_credit.checkpoint import replace_path
from lit_credit.models.state import full_state_dict, is_sharded, tied_names


def save_pretrained_atomic(model, tokenizer, target: Path, state_dict: dict | None = None) -> Path:
    """Write model + tokenizer to a temporary sibling directory, then swap it in
    (:func:`~lit_credit.checkpoint.replace_path`)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(tmp, state_dict=state_dict)
        tokenizer.save_pretrained(tmp)
        replace_path(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


class HFExport(L.Callback):
    """Every ``every_n_steps`` optimiser steps and at the end of training, save the policy as an HF model
    directory under ``dirpath`` (``step-N`` and ``last``), loadable with ``from_pretrained`` and usable as
    ``model.path=...``. Reads ``pl_module.policy`` and ``pl_module.tokenizer``.
    """

    def __init__(self, dirpath: str, every_n_steps: int = 0, keep_steps: bool = False) -> None:
        self.dirpath, self.every_n_steps, self.keep_steps = Path(dirpath), every_n_steps, keep_steps

    def _export(self, trainer: L.Trainer, pl_module: L.LightningModule, name: str) -> None:
        policy = pl_module.policy
        state = None
        if is_sharded(policy):  # a collective: every rank gathers; tied weights written once, as unsharded
            tied = tied_names(policy)
            state = {k: v for k, v in full_state_dict(policy).items() if k not in tied}
        if trainer.is_global_zero:
            save_pretrained_atomic(policy, pl_module.tokenizer, self.dirpath / name, state_dict=state)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if self.every_n_steps and step and step % self.every_n_steps == 0:
            self._export(trainer, pl_module, f"step-{step}" if self.keep_steps else "last")

    def on_train_end(self, trainer, pl_module) -> None:
        self._export(trainer, pl_module, "last")
