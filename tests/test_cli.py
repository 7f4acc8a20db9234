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


GRPO_HPARAMS = ("ppo_epochs", "num_minibatches", "max_grad_norm", "dynamic_sampling", "max_logprob_gap")
DPA_HPARAMS = ("roles", "verifier_weight", "proposal_weight", "loss_reduction", "max_grad_norm", "logprob_token_budget")


def describe(module, datamodule, hparams: tuple[str, ...] = GRPO_HPARAMS) -> dict:
    """Everything that defines a run, as plain values (``hparams``: the module's own keys among them)."""
    opt = module.optimizer_factory([torch.nn.Parameter(torch.zeros(1))])
    sched = module.scheduler_factory(opt)
    return {
        "module": type(module).__name__, "credit": repr(module.credit), "loss": repr(module.loss),
        "optimizer": (type(opt).__name__, {k: v for k, v in opt.defaults.items() if k in ("lr", "weight_decay")}),
        "scheduler": (type(sched).__name__, sched.start_factor, sched.end_factor, sched.total_iters),
        **{k: module.hparams[k] for k in hparams},
        "policy": module.source.prepare(), "lora": module.source.lora,
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
    tiny = ["sft_target=0", "sft_steps=2", "hidden_size=32", "intermediate_size=64", "num_layers=1"]
    built = cli(args=["--config", str(CLI_CONFIG), f"{embedded}cache_dir={cold}",
                      *[f"{embedded}{o}" for o in tiny]], run=False)
    source = built.model.source
    assert source.embedded.built and source.embedded.path.parent == cold / "embedded"
    assert [p.name for p in (cold / "embedded").iterdir()] == [source.embedded.path.name]  # one build, no temp
    assert built.model.policy.config.hidden_size == 32 and built.model.policy.config.num_hidden_layers == 1


# --- DPA-GRPO by its name: conf/cli/dpa_form.yaml is `lit-credit experiment=dpa_form` -----------------------------
DPA_CLI_CONFIG = CONF_DIR / "cli" / "dpa_form.yaml"
DPA_SMALL = {"task.num_train": 1, "task.num_test": 2, "task.lines": "[\"1a\",\"15\"]", "task.rl_lines": "[\"1a\",\"15\"]",
             "model.embedded.sft_steps": 0, "data.val_samples": 0, "data.prompts_per_step": 2}


def dpa_args(cache_dir: Path, root: Path, small: dict) -> list[str]:
    """The CLI twin of Hydra overrides ``small`` (task keys set on both copies of the task, as the YAML anchors
    them), with the test cache and a run directory."""
    embedded = "--model.init_args.policy.init_args.embedded.init_args."
    args = ["--config", str(DPA_CLI_CONFIG), f"{embedded}cache_dir={cache_dir}", f"--trainer.default_root_dir={root}"]
    for key, value in small.items():
        if key.startswith("task."):
            args += [f"{embedded}task.init_args.{key[5:]}={value}", f"--data.task.init_args.{key[5:]}={value}"]
        elif key.startswith("model.embedded."):
            args.append(f"{embedded}{key.removeprefix('model.embedded.')}={value}")
        else:
            args.append(f"--{key}={value}")
    return args


def describe_dpa(module, datamodule) -> dict:
    """:func:`describe` with DPA-GRPO's keys, its per-role estimators and its game."""
    return describe(module, datamodule, DPA_HPARAMS) | {
        "role_credit": {k: repr(v) for k, v in module.role_credit.items()}, "game": module.game}


def test_the_dpa_cli_config_builds_what_the_hydra_experiment_builds(make_cfg, cache_dir, tmp_path):
    cfg = make_cfg("experiment=dpa_form", *[f"{k}={v}" for k, v in DPA_SMALL.items()], fast_task=False,
                   fast_model=False)
    module, datamodule, trainer = build(cfg)
    built = cli(args=dpa_args(cache_dir, tmp_path, DPA_SMALL), run=False)
    assert describe_dpa(built.model, built.datamodule) == describe_dpa(module, datamodule)
    assert type(built.model.game).__name__ == "FormGame" and built.model.game.revise_share == "all"
    assert built.trainer.max_steps == trainer.max_steps == 120


def test_lightning_cli_trains_dpa_grpo_by_class_path(cache_dir, tmp_path, monkeypatch):
    # One game round through `lit-credit-cli fit`: Lightning counts optimiser steps, 2 per round with two adapters
    # (generator, verifier). The untrained start (sft_steps 0) writes no parsable line, so there are no verifier
    # pairs (they need a parsable x) but every challenge has approver pairs: the generator's LoRA B, which starts
    # at 0, is nonzero after the step (lr 0.05), the verifier's is still 0.
    monkeypatch.chdir(tmp_path)
    run = cli(args=["fit", *dpa_args(cache_dir, tmp_path / "run", DPA_SMALL), "--trainer.max_steps=2",
                    "--trainer.limit_val_batches=0", "--model.init_args.optimizer.init_args.lr=0.05"])
    assert type(run.model).__name__ == "DPAGRPOModule" and run.trainer.global_step == 2
    metrics = run.trainer.callback_metrics
    assert metrics["train/reward/parsable"] == 0, "the premise: no proposal has a parsable amount"
    lora_b = {adapter: sum(p.abs().sum().item() for n, p in run.model.policy.named_parameters()
                           if "lora_B" in n and f".{adapter}." in n) for adapter in ("generator", "verifier")}
    assert lora_b["generator"] > 0 and metrics["loss/generator"] != 0, (lora_b, dict(metrics))
    assert lora_b["verifier"] == 0 and metrics["loss/verifier"] == 0
