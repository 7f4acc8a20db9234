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


def option(path: Path) -> tuple[str, str]:
    rel = path.relative_to(CONF_DIR)
    return "/".join(rel.parts[:-1]), rel.stem


def test_every_group_is_covered():
    groups = {option(p)[0] for p in GROUP_FILES}
    assert {"task", "reward", "model", "rollout", "data", "credit", "method", "trainer", "logger", "callbacks",
            "paths", "experiment", "debug", "hydra", "hydra/launcher", "reward/judge", "task/simulator", "model/lora"} <= groups


@pytest.mark.parametrize("path", GROUP_FILES, ids=lambda p: "/".join(option(p)))
def test_config_composes_and_instantiates(path, make_cfg, tmp_path):
    group, name = option(path)
    if group.startswith("hydra"):
        cfg = make_cfg(f"{group}={name}")  # composing is the test: Hydra itself instantiates these
        assert cfg.seed == 0
        return
    local_model = name in ("hf", "llm")  # any local HF directory will do: the embedded one
    embedded = instantiate(make_cfg().model).resolve() if local_model else None
    if group == "model" and name == "hf":
        cfg = make_cfg("model=hf", f"model.path={embedded}", "model.dtype=float32", fast_model=False)
    elif "/" in group and not group.startswith("hydra"):  # a nested group, e.g. reward/judge, task/simulator
        parent = {"reward": "reward=hierr", "task": "task=toolcall", "model": "model=embedded"}[group.split("/")[0]]
        model_path = [f"{group.replace('/', '.')}.generate_fn.path={embedded}"] if name == "llm" else []
        small = TOOLCALL_SMALL if parent == "task=toolcall" or parent == "reward=hierr" else []
        cfg = make_cfg(parent, f"{group}={name}", *model_path, *small, fast_task=not small)
    elif "toolcall" in name:
        cfg = make_cfg(f"{group}={name}", *TOOLCALL_SMALL, fast_task=False)
    elif name.endswith("form") or (group == "experiment" and "form" in name.split("_")):  # task=form, experiments
        cfg = make_cfg(f"{group}={name}", *FORM_SMALL, fast_task=False)
    else:  # FAST_TASK's keys are arith's and math_revise's; other tasks are small already
        lora = ["model/lora=r8"] if name == "dpa_grpo" else []  # DPA-GRPO trains LoRA adapters
        cfg = make_cfg(f"{group}={name}", *lora, fast_task=name not in ("code_revise",))
    if group in ("experiment", "debug", "method"):
        module, datamodule, _trainer = build(cfg)
        assert isinstance(module.credit, CreditEstimator)
        assert datamodule.sampling.n >= 2
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
