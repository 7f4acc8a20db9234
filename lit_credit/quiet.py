"""A quiet run: :func:`quiet` drops the messages of dependencies that say nothing about the run, each at its
source and by its text, so that a run prints its progress bar, its run directory, its final metrics and what
concerns it (any other warning or log record still shows); :class:`StepProgressBar` counts a step-based run in
steps (``train: k/max_steps``, not Lightning's ``Epoch 0/-2``), the RL run's and the SFT warm start's."""
from __future__ import annotations

import logging
import warnings
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, ProgressBar, TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

#: Logger name -> the starts of the messages dropped from it (a record whose text starts otherwise passes).
LOG_MESSAGES: dict[str, tuple[str, ...]] = {
    # Lightning's rank_zero_info: advertisements, in lightning/pytorch/trainer/connectors/: by every Trainer without
    # a LitLogger (logger_connector/logger_connector.py:91), and by one that adds its own ModelCheckpoint
    # (callback_connector.py:190, callbacks=none).
    "lightning.pytorch.utilities.rank_zero": (
        "💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]",
        "💡 Tip: For seamless cloud uploads and versioning, try installing [litmodels]"),
    # math_verify/parser.py (parse) and math_verify/grader.py (verify), once per process: lit-credit turns
    # math-verify's signal.alarm timeouts off on purpose and bounds sympy's work itself
    # (lit_credit.rewards.math_answer). math-verify's "Timeout during parsing/comparison" still shows.
    "math_verify.parser": ("Timeout is disabled as parsing_timeout is None or <= 0",),
    "math_verify.grader": ("Timeout is disabled as timeout_seconds is None or <= 0",),
}
#: (message regex, category, module regex) of the warnings ignored: ``warnings.filterwarnings`` arguments.
WARNINGS: tuple[tuple[str, type[Warning], str], ...] = (
    # torch/utils/_pytree.py's @deprecated LeafSpec class, constructed by Lightning's own
    # lightning/pytorch/utilities/_pytree.py:21 (_tree_flatten) at every fit: Lightning's to fix, nothing to do here.
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning, r"lightning\.pytorch\.utilities\._pytree"),
)
#: Descriptions of transformers' own tqdm bars that are switched off: a one-second load or save of the policy
#: (transformers/core_model_loading.py:1752, modeling_utils.py:3511 in save_pretrained) between the run's own bars.
TRANSFORMERS_BARS = frozenset({"Loading weights", "Writing model shards"})


class DropMessages(logging.Filter):
    """Drops the records of one logger whose message starts with one of ``starts``; lets every other through."""

    def __init__(self, starts: tuple[str, ...]) -> None:
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.starts)


def _quiet_bar(factory, args, kwargs):
    """transformers' tqdm hook: the bars of :data:`TRANSFORMERS_BARS` disabled, every other bar as it was."""
    if kwargs.get("desc") in TRANSFORMERS_BARS:
        kwargs = {**kwargs, "disable": True}
    return factory(*args, **kwargs)


def quiet() -> None:
    """Install the filters (idempotent; called at start-up by ``lit-credit``'s ``train()`` and ``lit-credit-cli``,
    so also in the processes Lightning launches for the other ranks, which re-run the command). Dropped, and why
    each is noise:

    * ``💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]...`` and
      ``💡 Tip: For seamless cloud uploads and versioning, try installing [litmodels]...`` (Lightning's logger and
      callback connectors, logger ``lightning.pytorch.utilities.rank_zero``): advertisements, at every Trainer.
    * "`isinstance(treespec, LeafSpec)` is deprecated, use ..." (a FutureWarning of torch's ``_pytree``, raised
      where Lightning's ``lightning/pytorch/utilities/_pytree.py`` builds a ``LeafSpec``, at every fit): about
      Lightning's code, not ours, and nothing a user can change.
    * ``Timeout is disabled as parsing_timeout is None or <= 0, ...`` and ``Timeout is disabled as
      timeout_seconds is None or <= 0, ...`` (loggers ``math_verify.parser`` and ``math_verify.grader``, on math
      tasks): lit-credit disables math-verify's timeouts deliberately (see
      :mod:`lit_credit.rewards.math_answer`) and guards against hangs itself.
    * transformers' ``Loading weights`` and ``Writing model shards`` progress bars (through transformers'
      ``set_tqdm_hook``): a local policy's load and save, not the run's progress; other bars of transformers and
      the Hub's download bars are left on.
    """
    for module_name, starts in LOG_MESSAGES.items():
        logger = logging.getLogger(module_name)
        if not any(isinstance(f, DropMessages) for f in logger.filters):
            logger.addFilter(DropMessages(starts))
    for message, category, module in WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    from transformers.utils import logging as hf_logging

    if hasattr(hf_logging, "set_tqdm_hook"):
        hf_logging.set_tqdm_hook(_quiet_bar)


class StepProgressBar(TQDMProgressBar):
    """Lightning's tqdm bar, counted in training steps when the run is step-based (``max_steps`` set,
    ``max_epochs=-1``): the main bar reads ``train: k/max_steps`` with ``k = trainer.global_step``, so a resumed
    run starts at its step and the bar does not restart at an epoch boundary. An epoch-based run gets
    Lightning's bar; validation bars are Lightning's."""

    def __init__(self, description: str = "train", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.description = description

    @property
    def train_description(self) -> str:
        return self.description

    @staticmethod
    def by_step(trainer: L.Trainer) -> bool:
        return trainer.max_epochs == -1 and trainer.max_steps is not None and trainer.max_steps > 0

    def init_train_tqdm(self) -> Tqdm:
        bar = super().init_train_tqdm()
        if self.by_step(self.trainer):  # a resumed run starts at its step; the rate counts this run's steps
            bar.reset(total=self.trainer.max_steps)
            bar.initial = bar.n = self.trainer.global_step
            bar.refresh()
        return bar

    def on_train_epoch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if not self.by_step(trainer):
            return super().on_train_epoch_start(trainer, *args)
        if self._leave:  # a bar per epoch, as Lightning's; else the one bar goes on counting steps
            self.train_progress_bar = self.init_train_tqdm()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self.by_step(trainer):
            return super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        step = trainer.global_step
        bar = self.train_progress_bar
        if self._should_update(step, bar.total) and not bar.disable:
            bar.n = step
            bar.set_postfix(self.get_metrics(trainer, pl_module))  # refreshes the bar


def default_progress_bar(callbacks: list[Callback], enabled: bool | None = True) -> list[Callback]:
    """``[StepProgressBar()]`` where Lightning would add its own default bar (``enable_progress_bar`` not false
    and no progress bar among ``callbacks``), else ``[]``: append it to the Trainer's callbacks."""
    if enabled is False or any(isinstance(c, ProgressBar) for c in callbacks):
        return []
    return [StepProgressBar()]
