"""Hydra entry point: ``lit-credit [overrides]``; ``train(cfg)`` is importable (tests and notebooks)."""
from __future__ import annotations

import logging
from pathlib import Path

import hydra
import lightning as L
from hydra.utils import instantiate
from omegaconf import DictConfig

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
log = logging.getLogger(__name__)


def build(cfg: DictConfig) -> tuple[L.LightningModule, L.LightningDataModule, L.Trainer]:
    """Instantiate the module, the DataModule and the Trainer (with its logger and callbacks) from ``cfg``."""
    L.seed_everything(cfg.seed, workers=True)
    datamodule = instantiate(cfg.data)
    module = instantiate(cfg.method)
    # Entries without a _target_ are settings left by an overlay for a callback that is switched off.
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c and "_target_" in c]
    logger = instantiate(cfg.logger) if cfg.get("logger") else False
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=logger)
    return module, datamodule, trainer


def train(cfg: DictConfig) -> dict[str, float]:
    """Build everything from ``cfg``, optionally validate once, fit; returns the final logged metrics."""
    module, datamodule, trainer = build(cfg)
    if cfg.get("validate_first") and not trainer.fast_dev_run:
        trainer.validate(module, datamodule=datamodule, verbose=False)
    trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    log.info("final metrics: %s", {k: round(v, 4) for k, v in sorted(metrics.items()) if "/" in k})
    return metrics


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def _main(cfg: DictConfig) -> float | None:
    metrics = train(cfg)
    return metrics.get(cfg.get("optimized_metric", "val/reward/mean"))


def main() -> None:
    _main()


if __name__ == "__main__":
    main()
