"""Credit records and TensorBoard credit histograms, every N training steps."""
from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
import pandas as pd
import torch

from lit_credit.analysis.records import credit_records, write_shard

log = logging.getLogger(__name__)
HISTOGRAM_KEYS = ("segment", "turn_type", "turn", "case")


class CreditRecords(L.Callback):
    """Every ``every_n_steps`` training batches (the first one included), the credit the module gave its last batch(es)
    (``pl_module.credit_trace``) becomes one parquet shard ``dirpath/step-XXXXXXX.parquet`` of
    :func:`~lit_credit.analysis.records.credit_records` rows (written atomically; readable with pandas and
    ``datasets.load_dataset("parquet", data_files=...)``), and TensorBoard histograms of the per-turn
    advantages: ``credit_hist/segment/<tool|summary|turn>``, ``credit_hist/turn_type/<type>``,
    ``credit_hist/turn/<k>``, ``credit_hist/case/<case>`` (DPA-GRPO), under the step.

    Bounded: once ``max_rows`` rows are written the run writes no more (one warning); the rows of one step
    are capped at ``max_rows_per_step`` (the first rollouts). ``method`` labels the rows (default: the
    credit estimator's class name).
    """

    def __init__(self, dirpath: str, every_n_steps: int = 10, max_rows: int = 200_000,
                 max_rows_per_step: int = 5_000, excerpt_chars: int = 80, method: str | None = None,
                 histograms: bool = True) -> None:
        if every_n_steps < 1 or max_rows < 1 or max_rows_per_step < 1:
            raise ValueError(f"callbacks.credit_records: every_n_steps={every_n_steps}, max_rows={max_rows}, "
                             f"max_rows_per_step={max_rows_per_step} must all be >= 1")
        self.dirpath, self.every_n_steps = Path(dirpath), every_n_steps
        self.max_rows, self.max_rows_per_step, self.excerpt_chars = max_rows, max_rows_per_step, excerpt_chars
        self.method, self.histograms = method, histograms
        self.rows_written = 0

    def state_dict(self) -> dict:
        return {"rows_written": self.rows_written}

    def load_state_dict(self, state: dict) -> None:
        self.rows_written = state.get("rows_written", 0)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        trace = getattr(pl_module, "credit_trace", None)
        due = trainer.fit_loop.total_batch_idx % self.every_n_steps == 0  # batches 0, N, 2N, ...
        if not trace or not due or not trainer.is_global_zero or self.rows_written >= self.max_rows:
            return
        method = self.method or type(pl_module.credit).__name__.removesuffix("Credit").lower()
        frame = pd.concat([credit_records(t, step=step, method=method, excerpt_chars=self.excerpt_chars)
                           for t in trace], ignore_index=True)
        frame = frame.head(min(self.max_rows_per_step, self.max_rows - self.rows_written))
        if frame.empty:
            return
        write_shard(frame, self.dirpath, f"step-{step:07d}")
        self.rows_written += len(frame)
        if self.rows_written >= self.max_rows:
            log.warning("credit records reached max_rows=%d: no more are written in this run", self.max_rows)
        if self.histograms:
            self._histograms(trainer, frame, step)

    @staticmethod
    def _histograms(trainer, frame: pd.DataFrame, step: int) -> None:
        writer = next((lg.experiment for lg in trainer.loggers if hasattr(lg.experiment, "add_histogram")), None)
        if writer is None:
            return
        for key in HISTOGRAM_KEYS:
            for value, rows in frame[frame[key] != ""].groupby(key):
                writer.add_histogram(f"credit_hist/{key}/{value}", torch.tensor(rows["advantage"].to_numpy()), step)
