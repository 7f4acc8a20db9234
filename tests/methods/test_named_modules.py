"""The named GRPO-family modules (lit_credit.methods.named): SLCAGRPOModule, TCPOModule and SLCATCPOModule are
GRPOModule with their method's parts as defaults. The three doors (Python, Hydra ``method=<name>``, the
LightningCLI's ``class_path``) build the parts the experiment files compose on GRPOModule (tests/test_configs.py
EXPERIMENTS), so there is one definition of each method; another method's estimator is refused naming the fix."""
from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import OmegaConf

from lit_credit.cli import cli
from lit_credit.credit import GRPOCredit, SLCACredit, SLCATCPOCredit, TCPOCredit, ToolPOCredit
from lit_credit.methods import GRPOModule, SLCAGRPOModule, SLCATCPOModule, TCPOModule
from lit_credit.train import CONF_DIR
from tests.test_configs import EXPERIMENTS, TOOLCALL_SMALL, composition

# (named module, its conf/method file, the experiment that composes the same parts on GRPOModule)
NAMED = [(SLCAGRPOModule, "slca_grpo", "slca_toolcall"), (TCPOModule, "tcpo", "tcpo_math"),
         (SLCATCPOModule, "slca_tcpo", "slca_tcpo_toolcall")]


def plain(value):
    """A metric set's or augmenter's setting as a plain value (Hydra passes lists as ListConfig, Python tuples)."""
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value)
    return list(value) if isinstance(value, Sequence) and not isinstance(value, str) else value


def parts(credit, augment, metrics, grad_cosine_every) -> dict:
    """Everything a named module chooses, as plain values."""
    return {"credit": repr(credit), "augment": None if augment is None else
            (type(augment).__name__, {k: plain(v) for k, v in vars(augment).items()}),
            "metrics": {name: (type(m).__name__, {k: plain(v) for k, v in vars(m).items()})
                        for name, m in sorted(metrics.items())},
            "grad_cosine_every": grad_cosine_every}


def module_parts(module: GRPOModule) -> dict:
    return parts(module.credit, module.augment, module.metric_sets, module.grad_cosine_every)


@pytest.fixture
def source(make_cfg):
    """A prepared policy source (the session's fast arithmetic recipe: a named module's parts do not depend on it)."""
    policy = instantiate(make_cfg().model)
    policy.prepare()
    return policy


def experiment_cfg(make_cfg, experiment: str):
    toolcall = "toolcall" in experiment
    return make_cfg(f"experiment={experiment}", *(TOOLCALL_SMALL if toolcall else []), fast_task=not toolcall)


@pytest.mark.parametrize(("cls", "method", "experiment"), NAMED, ids=[m for _, m, _ in NAMED])
def test_python_hydra_and_the_experiment_build_the_same_parts(cls, method, experiment, source, make_cfg):
    cfg = experiment_cfg(make_cfg, experiment)
    assert cfg.method._target_ == "lit_credit.methods.GRPOModule"  # the experiments stay on GRPOModule
    expected = parts(instantiate(cfg.credit), instantiate(cfg.augment) if cfg.get("augment") else None,
                     instantiate(cfg.get("metrics") or {}), cfg.method.grad_cosine_every)
    loss = instantiate(make_cfg().loss)  # GRPO's loss: required, as by GRPOModule
    python = cls(source, loss=loss)  # the method's parts by default
    assert type(python) is cls and isinstance(python, GRPOModule)
    assert composition(python) == EXPERIMENTS[experiment]  # (credit, loss, augmenter, metric sets, ...)
    assert module_parts(python) == expected  # and every setting of each part
    hydra = instantiate(make_cfg(f"method={method}").method, policy=source)  # method=<name> alone
    assert type(hydra) is cls and module_parts(hydra) == expected
    assert hydra.num_minibatches == 4 and hydra.optimizer_factory.keywords["lr"] == 1e-6  # conf/method/grpo.yaml's


def test_every_other_argument_goes_to_grpo_module_unchanged(source, make_cfg):
    loss = instantiate(make_cfg().loss)
    module = TCPOModule(source, credit=TCPOCredit(preset="retro"), loss=loss, augment=None, metrics={},
                        num_minibatches=2, ppo_epochs=3, grad_cosine_every=5)
    assert module.credit.preset == "retro" and type(module.augment).__name__ == "CounterfactualTurns"
    assert module.metric_sets == {} and (module.ppo_epochs, module.num_minibatches) == (3, 2)
    assert module.grad_cosine_every == 5 and module.loss is loss
    assert module.hparams["credit"] is module.credit and module.hparams["num_minibatches"] == 2  # the resolved parts
    with pytest.raises(TypeError, match="loss"):  # required, as by GRPOModule
        SLCAGRPOModule(source)


@pytest.mark.parametrize(("cls", "credit", "given"), [
    (SLCAGRPOModule, GRPOCredit(), "credit=grpo (GRPOCredit)"),
    (SLCAGRPOModule, ToolPOCredit(), "credit=toolpo (ToolPOCredit)"),
    (SLCAGRPOModule, SLCATCPOCredit(), "credit=slca_tcpo (SLCATCPOCredit)"),
    (TCPOModule, SLCACredit(), "credit=slca (SLCACredit)"),
    (SLCATCPOModule, TCPOCredit(), "credit=tcpo (TCPOCredit)"),
])
def test_another_methods_estimator_is_refused_naming_the_fix(cls, credit, given):
    own = cls.ESTIMATOR.__name__
    expected = (f"{cls.__name__} trains with {own} (credit=", f"; {given} conflicts: leave credit to "
                f"method={cls.METHOD} (or give credit=", "), or use method=grpo (GRPOModule) for another estimator")
    with pytest.raises(ValueError, match="^" + ".*".join(map(re.escape, expected)) + "$"):
        cls(None, credit=credit)  # refused before the policy is loaded


def test_hydra_a_conflicting_credit_fails_and_the_credit_group_still_decides(make_cfg, source):
    with pytest.raises(InstantiationException, match=r"SLCAGRPOModule trains with SLCACredit .*credit=grpo"):
        instantiate(make_cfg("method=slca_grpo", "credit=grpo").method, policy=source)
    cfg = make_cfg("method=tcpo", "credit.preset=retro", "metrics=[tool,turn]")  # groups as for method=grpo
    module = instantiate(cfg.method, policy=source)
    assert module.credit.preset == "retro" and sorted(module.metric_sets) == ["tool", "turn"]
    mixed = make_cfg("experiment=slca_toolcall", "method=tcpo", *TOOLCALL_SMALL, fast_task=False)  # credit=slca
    with pytest.raises(InstantiationException, match=r"TCPOModule trains with TCPOCredit .*credit=slca"):
        instantiate(mixed.method, policy=source)


def cli_config(tmp_path: Path, module: str, credit: dict | None) -> Path:
    """conf/cli/grpo_arith.yaml as SLCA-GRPO's twin on tiny tool calling: ``model.class_path: <module>``, credit
    left to the module (or ``credit``), the toolcall task and HierR, one step of 2 x 2 rollouts."""
    config = yaml.safe_load((CONF_DIR / "cli" / "grpo_arith.yaml").read_text())
    task = {"class_path": "lit_credit.tasks.ToolCallTask",
            "init_args": {"num_train": 40, "num_test": 8, "subsets": "single", "max_turns": 2, "seed": 0}}
    model = config["model"]
    model["class_path"] = module
    model["init_args"].pop("credit")
    if credit is not None:
        model["init_args"]["credit"] = credit
    embedded = model["init_args"]["policy"]["init_args"]["embedded"]["init_args"]
    embedded |= {"task": task, "sft_target": 0, "sft_steps": 2, "hidden_size": 64, "intermediate_size": 128, "num_layers": 2}
    config["data"] |= {"task": task, "prompts_per_step": 2, "val_prompts": 2, "val_samples": 0,
                       "reward": {"class_path": "lit_credit.rewards.HierRReward",
                                  "init_args": {"judge": {"class_path": "lit_credit.rewards.RubricJudge"}}}}
    config["data"]["sampling"] |= {"n": 2, "max_new_tokens": 16}
    config["trainer"] |= {"max_steps": 1}
    path = tmp_path / "slca_toolcall_cli.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_lightning_cli_trains_slca_grpo_by_class_path_and_refuses_another_estimator(cache_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the CLI config writes under outputs/cli/grpo_arith (relative)
    cache = f"--model.init_args.policy.init_args.embedded.init_args.cache_dir={cache_dir}"
    config = cli_config(tmp_path, "lit_credit.methods.SLCAGRPOModule", None)
    run = cli(args=["fit", "--config", str(config), cache])
    module = run.model
    assert type(module) is SLCAGRPOModule and run.trainer.global_step == 1
    assert type(module.credit) is SLCACredit and list(module.metric_sets) == ["tool"] and module.augment is None
    assert module.grad_cosine_every == 10 and module.num_minibatches == 4  # GRPOModule's arguments passed through
    assert "train/success@1.0" in run.trainer.callback_metrics  # the tool metric set logged
    grpo = cli_config(tmp_path, "lit_credit.methods.SLCAGRPOModule",
                      {"class_path": "lit_credit.credit.GRPOCredit", "init_args": {"norm_by_std": True}})
    with pytest.raises(ValueError, match=r"SLCAGRPOModule trains with SLCACredit .*credit=grpo .*use method=grpo"):
        cli(args=["--config", str(grpo), cache], run=False)
