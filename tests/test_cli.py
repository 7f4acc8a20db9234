"""LightningCLI builds the same module, loss, credit, optimiser and data as the Hydra experiment."""
from __future__ import annotations

from pathlib import Path

import torch
from hydra.utils import instantiate

from lit_credit.cli import cli
from lit_credit.train import CONF_DIR, build
from tests.conftest import FAST_MODEL

CLI_CONFIG = CONF_DIR / "cli" / "grpo_arith.yaml"


def describe(module, datamodule) -> dict:
    """Everything that defines a run, as plain values."""
    opt = module.optimizer_factory([torch.nn.Parameter(torch.zeros(1))])
    sched = module.scheduler_factory(opt)
    return {
        "credit": repr(module.credit), "loss": repr(module.loss),
        "optimizer": (type(opt).__name__, {k: v for k, v in opt.defaults.items() if k in ("lr", "weight_decay")}),
        "scheduler": (type(sched).__name__, sched.start_factor, sched.end_factor, sched.total_iters),
        **{k: module.hparams[k] for k in ("ppo_epochs", "num_minibatches", "max_grad_norm", "dynamic_sampling",
                                          "max_logprob_gap")},
        "policy": module.source.resolve(),
        "sampling": datamodule.sampling, "prompts_per_step": datamodule.prompts_per_step,
        "val_prompts": datamodule.val_prompts, "engine": type(datamodule.engine).__name__,
        "task": vars(datamodule.task) | {"_splits": None}, "reward": type(datamodule.reward).__name__,
    }


def test_cli_config_builds_what_the_hydra_experiment_builds(make_cfg, cache_dir, tmp_path):
    cfg = make_cfg("experiment=grpo_arith")
    module, datamodule, trainer = build(cfg)
    task = {f"task.{k}": v for k, v in instantiate(cfg.task).__dict__.items() if not k.startswith("_")}
    embedded = "--model.init_args.policy.init_args.embedded.init_args."
    args = ["--config", str(CLI_CONFIG), f"{embedded}cache_dir={cache_dir}", f"--trainer.default_root_dir={tmp_path}"]
    args += [f"{embedded}{o.removeprefix('model.embedded.')}" for o in FAST_MODEL]
    for prefix in (f"{embedded}task.init_args.", "--data.task.init_args."):
        args += [f"{prefix}{k.removeprefix('task.')}={'null' if v is None else v}" for k, v in task.items()]
    built = cli(args=args, run=False)
    assert describe(built.model, built.datamodule) == describe(module, datamodule)
    assert built.trainer.max_steps == trainer.max_steps
    assert Path(module.source.resolve()).is_dir()
