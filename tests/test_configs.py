"""Every file under conf/ composes, and every object it describes instantiates."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from lit_credit.credit import CreditEstimator
from lit_credit.train import CONF_DIR, build

TOOLCALL_SMALL = ["model.embedded.sft_steps=2", "task.num_train=40", "task.num_test=8"]
FORM_SMALL = ["task.num_train=20", "task.num_test=2"]
GROUP_FILES = sorted(p for p in CONF_DIR.rglob("*.yaml") if p.parent != CONF_DIR and "cli" not in p.parts)


# What each GRPO-family experiment builds: (credit, surrogate, aggregation, augmenter's score, metric sets,
# dynamic sampling, grad-cosine period). DAPO is loss=dapo method.dynamic_sampling=true; the named modules
# (method=slca_grpo, tcpo, slca_tcpo: lit_credit.methods.named) build the same parts as slca_toolcall, tcpo_math
# and slca_tcpo_toolcall (tests/methods/test_named_modules.py holds them to these rows).
PPO = ("ClippedSurrogate", "token-mean")  # GRPO's loss
EXPERIMENTS = {
    "grpo_arith": ("GRPOCredit", *PPO, None, [], False, 0),
    "dr_grpo_arith": ("DrGRPOCredit", "ClippedSurrogate", "seq-mean-token-sum-norm", None, [], False, 0),
    "dapo_arith": ("GRPOCredit", *PPO, None, [], True, 0),
    "gspo_arith": ("GRPOCredit", "GSPOSurrogate", "seq-mean-token-mean", None, [], False, 0),
    "grpo_form_ppo": ("GRPOCredit", *PPO, None, [], False, 0),
    "grpo_form": ("GRPOCredit", "ReinforceSurrogate", "seq-mean-token-sum", None, [], False, 0),
    "dapo_form": ("GRPOCredit", "ClippedSurrogate", "seq-mean-token-mean", None, [], True, 0),
    "gspo_form": ("GRPOCredit", "GSPOSurrogate", "seq-mean-token-mean", None, [], False, 0),
    "slca_toolcall": ("SLCACredit", *PPO, None, ["tool"], False, 10),
    "grpo_toolcall": ("GRPOCredit", *PPO, None, ["tool"], False, 10),
    "toolpo_toolcall": ("ToolPOCredit", *PPO, None, ["tool"], False, 10),
    "slca_tcpo_toolcall": ("SLCATCPOCredit", *PPO, "reward", ["tool", "turn"], False, 10),
    "tcpo_math": ("TCPOCredit", *PPO, "verifier", ["turn"], False, 0),
}


def composition(module) -> tuple:
    """The parts of a GRPO-family module that its config chose, as in :data:`EXPERIMENTS`."""
    return (type(module.credit).__name__, type(module.loss.surrogate).__name__, module.loss.aggregation,
            module.augment.score if module.augment is not None else None, sorted(module.metric_sets),
            module.dynamic_sampling, module.grad_cosine_every)


def test_every_grpo_family_experiment_is_listed():
    experiments = {p.stem for p in GROUP_FILES if option(p)[0] == "experiment"}
    assert experiments - set(EXPERIMENTS) == {"dpa_form", "dpa_form_e68b47"}  # DPAGRPOModule, its own module


def option(path: Path) -> tuple[str, str]:
    rel = path.relative_to(CONF_DIR)
    return "/".join(rel.parts[:-1]), rel.stem


def test_every_group_is_covered():
    groups = {option(p)[0] for p in GROUP_FILES}
    assert {"task", "reward", "model", "rollout", "data", "credit", "loss", "augment", "metrics", "method", "trainer",
            "logger", "callbacks", "paths", "experiment", "debug", "hydra", "hydra/launcher", "reward/judge",
            "task/simulator", "model/lora", "game"} <= groups


@pytest.mark.parametrize("path", GROUP_FILES, ids=lambda p: "/".join(option(p)))
def test_config_composes_and_instantiates(path, make_cfg, tmp_path):
    group, name = option(path)
    if group.startswith("hydra"):
        cfg = make_cfg(f"{group}={name}")  # composing is the test: Hydra itself instantiates these
        assert cfg.seed == 0
        return
    local_model = name in ("hf", "llm")  # any local HF directory will do: the embedded one
    embedded = instantiate(make_cfg().model).prepare() if local_model else None
    if group == "model" and name == "hf":
        cfg = make_cfg("model=hf", f"model.path={embedded}", "model.dtype=float32", fast_model=False)
    elif group == "model" and name == "smollm2":  # instantiating records the source; converting is prepare()'s
        cfg = make_cfg("model=smollm2", fast_model=False)
    elif "/" in group and not group.startswith("hydra"):  # a nested group, e.g. reward/judge, task/simulator
        parent = {"reward": "reward=hierr", "task": "task=toolcall", "model": "model=embedded",
                  "credit": "credit=grpo"}[group.split("/")[0]]
        model_path = [f"{group.replace('/', '.')}.generate_fn.path={embedded}"] if name == "llm" else []
        small = TOOLCALL_SMALL if parent == "task=toolcall" or parent == "reward=hierr" else []
        cfg = make_cfg(parent, f"{group}={name}", *model_path, *small, fast_task=not small)
    elif "toolcall" in name:
        cfg = make_cfg(f"{group}={name}", *TOOLCALL_SMALL, fast_task=False)
    elif name.endswith("form") or (group == "experiment" and "form" in name.split("_")):  # task=form, experiments
        cfg = make_cfg(f"{group}={name}", *FORM_SMALL, fast_task=False)
    else:  # FAST_TASK's keys are arith's and math_revise's; other tasks are small already
        lora = ["model/lora=r8"] if name == "dpa_grpo" else []  # DPA-GRPO trains LoRA adapters
        cfg = make_cfg(f"{group}={name}", *lora, fast_task=name not in ("code_revise", "reasoning_gym", "bfcl", "textarena"))
    if group in ("experiment", "debug", "method"):
        module, datamodule, _trainer = build(cfg)
        assert isinstance(module.credit, CreditEstimator)
        assert datamodule.experience.sampling.n >= 2
        if group == "experiment" and name in EXPERIMENTS:
            assert composition(module) == EXPERIMENTS[name]
        return
    if group == "trainer" and cfg.trainer.get("accelerator") in ("gpu", "cuda") and not torch.cuda.is_available():
        assert cfg.trainer.devices  # composed; Lightning refuses a GPU Trainer on a machine without one
        pytest.skip(f"trainer={name} needs a GPU to instantiate")
    node = OmegaConf.select(cfg, group.replace("/", ".")) if group != "paths" else None
    if node is None:
        assert Path(cfg.paths.cache_dir).name
        return
    built = instantiate(node) if not isinstance(node, dict) or "_target_" in node else \
        {k: instantiate(v) for k, v in node.items()}
    assert built is not None
