"""Every file under conf/ composes, and every object it describes instantiates."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from lit_credit.credit import CreditEstimator
from lit_credit.train import CONF_DIR, build

TOOLCALL_SMALL = ["model.embedded.sft_steps=2", "task.num_train=40", "task.num_test=8"]
GROUP_FILES = sorted(p for p in CONF_DIR.rglob("*.yaml") if p.parent != CONF_DIR and "cli" not in p.parts)


def option(path: Path) -> tuple[str, str]:
    rel = path.relative_to(CONF_DIR)
    return "/".join(rel.parts[:-1]), rel.stem


def test_every_group_is_covered():
    groups = {option(p)[0] for p in GROUP_FILES}
    assert {"task", "reward", "model", "rollout", "data", "credit", "method", "trainer", "logger", "callbacks",
            "paths", "experiment", "debug", "hydra", "hydra/launcher"} <= groups


@pytest.mark.parametrize("path", GROUP_FILES, ids=lambda p: "/".join(option(p)))
def test_config_composes_and_instantiates(path, make_cfg, tmp_path):
    group, name = option(path)
    if group.startswith("hydra"):
        cfg = make_cfg(f"{group}={name}")  # composing is the test: Hydra itself instantiates these
        assert cfg.seed == 0
        return
    if group == "model" and name == "hf":
        embedded = instantiate(make_cfg().model).resolve()  # any local HF directory will do
        cfg = make_cfg("model=hf", f"model.path={embedded}", "model.dtype=float32", fast_model=False)
    else:
        cfg = make_cfg(f"{group}={name}", *TOOLCALL_SMALL, fast_task=False) if "toolcall" in name else \
            make_cfg(f"{group}={name}")
    if group in ("experiment", "debug", "method"):
        module, datamodule, _trainer = build(cfg)
        assert isinstance(module.credit, CreditEstimator)
        assert datamodule.sampling.n >= 2
        return
    if group == "trainer" and cfg.trainer.get("accelerator") in ("gpu", "cuda") and not torch.cuda.is_available():
        assert cfg.trainer.devices  # composed; Lightning refuses a GPU Trainer on a machine without one
        pytest.skip(f"trainer={name} needs a GPU to instantiate")
    node = cfg[group] if group not in ("paths",) else None
    if node is None:
        assert Path(cfg.paths.cache_dir).name
        return
    built = instantiate(node) if not isinstance(node, dict) or "_target_" in node else \
        {k: instantiate(v) for k, v in node.items()}
    assert built is not None
