"""Shared fixtures: a session-wide embedded-policy cache and Hydra composition of conf/train.yaml."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from lit_credit.train import CONF_DIR

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

# A cheaper embedded recipe than the default job's, shared by every test in the session.
FAST_TASK = ["task.max_operand=9", "task.num_test=20"]
FAST_MODEL = ["model.embedded.sft_target=0", "model.embedded.sft_steps=120", "model.embedded.sft_lr=1e-2", "model.embedded.hidden_size=64", "model.embedded.intermediate_size=128",
              "model.embedded.num_layers=2"]


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    return Path(os.environ.get("LIT_CREDIT_TEST_CACHE") or tmp_path_factory.mktemp("lit-credit-cache"))


def compose_train(overrides: list[str], output_dir: Path, cache_dir: Path) -> DictConfig:
    """Compose conf/train.yaml as the `lit-credit` command would, with run outputs under ``output_dir``."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.output_dir = str(output_dir)
        cfg.paths.cache_dir = str(cache_dir)
        del cfg.hydra
    return cfg


@pytest.fixture
def make_cfg(tmp_path, cache_dir):
    def make(*overrides: str, fast_model: bool = True, fast_task: bool = True) -> DictConfig:
        fast = [*(FAST_TASK if fast_task else []), *(FAST_MODEL if fast_model else [])]
        return compose_train([*fast, *overrides], tmp_path / "run", cache_dir)

    return make
