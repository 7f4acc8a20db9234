"""Hydra entry point: ``lit-credit [overrides]``; ``train(cfg)`` is importable (tests and notebooks)."""
from __future__ import annotations

import logging
from pathlib import Path

import hydra
import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from lit_credit.checkpoint import atomic_checkpoints, atomic_write, claim_run_dir
from lit_credit.config import check_config

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
log = logging.getLogger(__name__)


def build(cfg: DictConfig) -> tuple[L.LightningModule, L.LightningDataModule, L.Trainer]:
    """Check ``cfg`` (:func:`~lit_credit.config.check_config`), then instantiate the module, the DataModule and
    the Trainer (with its logger and callbacks; checkpoints written atomically).

    The policy source (``cfg.model``) is built and prepared (:meth:`~lit_credit.models.PolicySource.prepare`:
    the embedded policy's SFT warm start on a cold cache) before the module, which receives that same source
    object in place of ``method.policy`` (``${model}``) and only loads from it."""
    check_config(cfg)
    L.seed_everything(cfg.seed, workers=True)
    datamodule = instantiate(cfg.data)
    source = instantiate(cfg.model)
    source.prepare()
    module = instantiate(cfg.method, policy=source)
    # Entries without a _target_ are settings left by an overlay for a callback that is switched off.
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c and "_target_" in c]
    logger = instantiate(cfg.logger) if cfg.get("logger") else False
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=logger)
    atomic_checkpoints(trainer)
    return module, datamodule, trainer


def record_config(cfg: DictConfig, output_dir: Path) -> None:
    """Write ``.hydra/{config,hydra,overrides}.yaml`` into the run directory, atomically, as Hydra would (Hydra's
    own writing is off, ``hydra.output_subdir: null``, so that it cannot overwrite an earlier run's record)."""
    hydra_cfg = HydraConfig.get()
    files = {"config.yaml": cfg, "hydra.yaml": OmegaConf.create({"hydra": hydra_cfg}),
             "overrides.yaml": hydra_cfg.overrides.task}
    for name, content in files.items():
        atomic_write(output_dir / ".hydra" / name, lambda tmp, c=content: tmp.write_text(OmegaConf.to_yaml(c)))


def train(cfg: DictConfig) -> dict[str, float]:
    """Claim the run directory, build everything from ``cfg``, optionally validate once (not when resuming),
    fit; returns the final logged metrics."""
    resuming = bool(cfg.get("ckpt_path"))
    output_dir = Path(cfg.paths.output_dir)
    claim_run_dir(output_dir, resuming)
    if HydraConfig.initialized():
        record_config(cfg, output_dir)
    module, datamodule, trainer = build(cfg)
    if cfg.get("validate_first") and not trainer.fast_dev_run and not resuming:
        trainer.validate(module, datamodule=datamodule, verbose=False)
    # weights_only=False: a lit-credit checkpoint also pickles hyperparameters (credit, loss) and RNG states;
    # only load checkpoints you trust (your own runs).
    trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"), weights_only=False)
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
