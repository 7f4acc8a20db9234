"""Hydra entry point: ``lit-credit [overrides]``; ``train(cfg)`` is importable (tests and notebooks)."""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from lit_credit.checkpoint import atomic_checkpoints, atomic_write
from lit_credit.config import check_config
from lit_credit.distributed import LAUNCH_VARIABLES, claim_run_dir, claimed_checkpoint, earlier_attempt
from lit_credit.emulation import CollectiveRecorder, EmulationCallback, gpu_emulation, trainer_arguments
from lit_credit.quiet import default_progress_bar, quiet

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
log = logging.getLogger(__name__)


def build(cfg: DictConfig, recorder: CollectiveRecorder | None = None
          ) -> tuple[L.LightningModule, L.LightningDataModule, L.Trainer]:
    """Check ``cfg`` (:func:`~lit_credit.config.check_config`), then instantiate the module, the DataModule and
    the Trainer (with its logger and callbacks, and :class:`~lit_credit.quiet.StepProgressBar` as its default
    progress bar; checkpoints written atomically). With a ``recorder`` (``emulate_gpu=true``, inside
    :func:`~lit_credit.emulation.gpu_emulation`) the Trainer runs on the emulated accelerator with its checks.

    The policy source (``cfg.model``) is built and prepared (:meth:`~lit_credit.models.PolicySource.prepare`:
    the embedded policy's SFT warm start on a cold cache) before the module, which receives that same source
    object in place of ``method.policy`` (``${model}``) and only loads from it."""
    check_config(cfg)
    fill_data_parallel_size(cfg)
    L.seed_everything(cfg.seed, workers=True)
    datamodule = instantiate(cfg.data)
    source = instantiate(cfg.model)
    source.prepare()
    module = instantiate(cfg.method, policy=source)
    # Entries without a _target_ are settings left by an overlay for a callback that is switched off.
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c and "_target_" in c]
    callbacks += default_progress_bar(callbacks, cfg.trainer.get("enable_progress_bar"))
    logger = instantiate(cfg.logger) if cfg.get("logger") else False
    emulated = {}
    if recorder is not None:
        callbacks.append(EmulationCallback(recorder))
        emulated = trainer_arguments(cfg.trainer.get("strategy"))
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=logger, **emulated)
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


def fill_data_parallel_size(cfg: DictConfig) -> None:
    """``trainer.strategy.data_parallel_size: null`` (FSDP2's ``ModelParallelStrategy``) becomes
    ``trainer.devices x trainer.num_nodes``: every process one data-parallel rank, on any number of nodes."""
    strategy = cfg.trainer.get("strategy")
    if isinstance(strategy, DictConfig) and "data_parallel_size" in strategy and strategy.data_parallel_size is None:
        with open_dict(cfg):
            strategy.data_parallel_size = int(cfg.trainer.devices) * int(cfg.trainer.get("num_nodes") or 1)


def resume_path(cfg: DictConfig) -> str | None:
    """The checkpoint to continue from: ``ckpt_path``, else with ``resume=auto`` the run directory's
    ``last.ckpt`` (in ``callbacks.checkpoint.dirpath``; a file, or the directory of a distributed checkpoint) when
    it exists (a requeued job continues; the previous one set aside, ``.last.ckpt.old``, when a kill came between
    :func:`~lit_credit.checkpoint.replace_path`'s renames), else None."""
    if cfg.get("ckpt_path"):
        return str(cfg.ckpt_path)
    resume = cfg.get("resume")
    if resume not in (None, "auto"):
        raise ValueError(f"resume={resume}: use resume=auto (continue from the run directory's last.ckpt when "
                         "there is one) or resume=null, or give ckpt_path=... for one checkpoint")
    checkpoint = (cfg.get("callbacks") or {}).get("checkpoint") or {}
    last = Path(checkpoint.get("dirpath") or Path(cfg.paths.output_dir) / "checkpoints") / "last.ckpt"
    if resume != "auto":
        return None
    aside = last.with_name(f".{last.name}.old")  # a kill between replace_path's two renames leaves only this one
    return str(last) if last.exists() else str(aside) if aside.exists() else None


@contextlib.contextmanager
def launch_scope() -> Iterator[None]:
    """Where Lightning may start the other ranks of this run, and what it leaves behind undone afterwards.

    Under Hydra, Lightning re-runs ``sys.argv`` for each rank it starts, adding ``hydra.run.dir=<run.dir>``: a
    sweep's command line (``-m``, lists) would run the whole sweep again there, and a sweep job's ``run.dir``
    is not its directory. So, inside, ``sys.argv`` is this job's own command (its overrides, one run) and
    ``hydra.run.dir`` its output directory. Afterwards the launch variables Lightning exported into this process
    (``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_PORT``, ...) and the process group are removed, so the next job of a
    sweep starts its own ranks."""
    argv, env = list(sys.argv), {k: os.environ.get(k) for k in LAUNCH_VARIABLES}
    grouped = torch.distributed.is_available() and torch.distributed.is_initialized()
    hydra_cfg = HydraConfig.get() if HydraConfig.initialized() else None
    job_dir = OmegaConf.select(hydra_cfg, "runtime.output_dir") if hydra_cfg is not None else None
    if job_dir is not None:  # a Hydra run (a composed config without a runtime, as in tests, has none)
        sys.argv = [argv[0], *hydra_flags(argv[1:]), *hydra_cfg.overrides.task]
        with read_write(hydra_cfg), open_dict(hydra_cfg):
            hydra_cfg.run.dir = job_dir
    try:
        yield
    finally:
        sys.argv = argv
        if not grouped and torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def hydra_flags(args: list[str]) -> list[str]:
    """The options of a Hydra command line that choose the config (``--config-dir/-cd``, ``--config-name/-cn``,
    ``--config-path/-cp``, with their values), without ``-m`` and the overrides."""
    names, kept, take = {"--config-dir", "-cd", "--config-name", "-cn", "--config-path", "-cp"}, [], False
    for arg in args:
        if take or arg.split("=", 1)[0] in names:
            kept.append(arg)
            take = not take and "=" not in arg
    return kept


def train(cfg: DictConfig) -> dict[str, float]:
    """Claim the run directory (the leading rank writes the run's record; the others join it), build everything
    from ``cfg``, optionally validate once (not when resuming), fit; returns the final logged metrics.

    Resuming is decided by the leading rank alone (:func:`resume_path` on its view of the file system) and read by
    the others from its claim, so ranks on different nodes never disagree. With ``resume=auto`` a directory claimed
    by an earlier attempt of the same launch (a SLURM job preempted before its first checkpoint, requeued with its
    job id) is started over in; any other directory that holds a run is refused as without ``resume``.

    Dependencies' messages that are not about the run are filtered first (:func:`~lit_credit.quiet.quiet`); the
    leading rank logs the run directory at the start and the final metrics at the end."""
    quiet()
    ckpt_path = resume_path(cfg)
    output_dir = Path(cfg.paths.output_dir)
    requeued = cfg.get("resume") == "auto" and earlier_attempt(output_dir)  # preempted before its first checkpoint
    leader = claim_run_dir(output_dir, ckpt_path is not None or requeued, checkpoint=ckpt_path)
    if not leader:
        ckpt_path = claimed_checkpoint(output_dir)
    if leader:
        log.info("run directory: %s", output_dir.resolve())
    if leader and HydraConfig.initialized():
        record_config(cfg, output_dir)
    emulation = gpu_emulation(output_dir) if cfg.get("emulate_gpu") else contextlib.nullcontext()
    with launch_scope(), emulation as recorder:
        module, datamodule, trainer = build(cfg, recorder)
        start: dict[str, float] = {}
        if cfg.get("validate_first") and not trainer.fast_dev_run and ckpt_path is None:
            trainer.validate(module, datamodule=datamodule, verbose=False)
            start = {k: float(v) for k, v in trainer.callback_metrics.items()}
        # weights_only=False: a lit-credit checkpoint also pickles hyperparameters (credit, loss) and RNG states;
        # only load checkpoints you trust (your own runs).
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=False)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    if leader:
        log.info("final metrics: %s", {k: round(v, 4) for k, v in sorted(metrics.items()) if "/" in k})
        if summary := held_out_summary(start, metrics):
            log.info(summary)
    return metrics


HELD_OUT = {"greedy": "val/reward/mean", "sampled": "val/sampled/reward/mean"}


def held_out_summary(start: dict[str, float], end: dict[str, float]) -> str | None:
    """The run's last line: the held-out mean reward, greedy and sampled, at the start (the validation before
    training, when there was one) and at the end; None when the run validated nothing."""
    parts = [f"{how} {start[key]:.3f} -> {end[key]:.3f}" if key in start else f"{how} {end[key]:.3f} at the end"
             for how, key in HELD_OUT.items() if key in end]
    return "held-out reward: " + ", ".join(parts) if parts else None


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def _main(cfg: DictConfig) -> float | None:
    metrics = train(cfg)
    return metrics.get(cfg.get("optimized_metric", "val/reward/mean"))


def main() -> None:
    _main()


if __name__ == "__main__":
    main()
