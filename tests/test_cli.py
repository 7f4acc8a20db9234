"""LightningCLI builds the same module, loss, credit, optimiser and data as the Hydra experiment."""
from __future__ import annotations

from pathlib import Path

import pytest
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
        "policy": module.source.prepare(),
        "sampling": datamodule.experience.sampling, "prompts_per_step": datamodule.prompts_per_step,
        "val_prompts": datamodule.val_prompts, "val_samples": datamodule.experience.val_samples,
        "embedded": module.source.embedded.recipe, "engine": type(datamodule.experience.engine).__name__,
        "task": vars(datamodule.task) | {"_splits": None}, "reward": type(datamodule.experience.reward).__name__,
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
    assert Path(module.source.prepare()).is_dir()


def test_cli_fit_refuses_a_used_directory_and_resumes_its_own_checkpoint(cache_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the CLI config writes under outputs/cli/grpo_arith (relative)
    embedded = "--model.init_args.policy.init_args.embedded.init_args."
    args = ["fit", "--config", str(CLI_CONFIG), f"{embedded}cache_dir={cache_dir}",
            *[f"{embedded}{o.removeprefix('model.embedded.')}" for o in FAST_MODEL], "--data.prompts_per_step=2",
            "--data.sampling.init_args.n=2", "--data.task.init_args.max_operand=9",
            f"{embedded}task.init_args.max_operand=9"]
    first = cli(args=[*args, "--trainer.max_steps=1"])
    assert first.trainer.global_step == 1
    ckpt = tmp_path / "outputs" / "cli" / "grpo_arith" / "checkpoints" / "step1.ckpt"
    first.trainer.save_checkpoint(ckpt)
    with pytest.raises(FileExistsError, match="already holds a run"):
        cli(args=[*args, "--trainer.max_steps=2"])
    resumed = cli(args=[*args, "--trainer.max_steps=2", f"--ckpt_path={ckpt}"])  # loads RNG states, hparams
    assert resumed.trainer.global_step == 2


def test_cli_prepares_the_policy_before_it_builds_the_module(tmp_path, monkeypatch):
    # A cold cache: the module's constructor only loads (PolicySource.load refuses an unbuilt policy), so the
    # module exists only if the CLI prepared the source first (cli.prepared_source).
    monkeypatch.chdir(tmp_path)
    cold = tmp_path / "cold-cache"
    embedded = "--model.init_args.policy.init_args.embedded.init_args."
    tiny = ["sft_steps=2", "hidden_size=32", "intermediate_size=64", "num_layers=1"]
    built = cli(args=["--config", str(CLI_CONFIG), f"{embedded}cache_dir={cold}",
                      *[f"{embedded}{o}" for o in tiny]], run=False)
    source = built.model.source
    assert source.embedded.built and source.embedded.path.parent == cold / "embedded"
    assert [p.name for p in (cold / "embedded").iterdir()] == [source.embedded.path.name]  # one build, no temp
    assert built.model.policy.config.hidden_size == 32 and built.model.policy.config.num_hidden_layers == 1
