"""A callback that SIGKILLs its own training process after a given optimiser step (the exact-resume test)."""
from __future__ import annotations

import os
import signal

import lightning as L


class KillAfterStep(L.Callback):
    """``os.kill(getpid(), SIGKILL)`` once ``trainer.global_step == step``: no cleanup, no flush, like a crash."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)
