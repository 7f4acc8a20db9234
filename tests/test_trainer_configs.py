"""Every trainer variant composes to exactly the node it had before conf/trainer/default.yaml existed.

The expected dicts below were written down by composing ``trainer=<name>`` from the five self-contained files
(cpu, ddp_cpu, fsdp, fsdp2_cpu, gpu) before they were made to extend ``default``; a key dropped from a variant,
a value changed in the base, or a ``_self_`` placed before the base would change the composed node.
"""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

SHARED = {  # the keys all five variants repeated verbatim, and num_nodes (added with data parallelism)
    "_target_": "lightning.pytorch.Trainer",
    "num_nodes": 1,
    "max_steps": 150,
    "max_epochs": -1,
    "val_check_interval": 25,
    "check_val_every_n_epoch": None,
    "num_sanity_val_steps": 0,
    "log_every_n_steps": 1,
    "default_root_dir": "${paths.output_dir}",
    "enable_model_summary": False,
}
EXPECTED = {  # unresolved, as composed from the old files
    "cpu": {**SHARED, "accelerator": "cpu", "devices": 1, "precision": "32-true"},
    "gpu": {**SHARED, "accelerator": "gpu", "devices": 1, "precision": "bf16-mixed"},
    "ddp_cpu": {**SHARED, "accelerator": "cpu", "devices": 2, "precision": "32-true",
                "strategy": {"_target_": "lightning.pytorch.strategies.DDPStrategy",
                             "process_group_backend": "gloo"}},
    "fsdp2_cpu": {**SHARED, "accelerator": "cpu", "devices": 2, "precision": "32-true",
                  "strategy": {"_target_": "lightning.pytorch.strategies.ModelParallelStrategy",
                               "data_parallel_size": None, "tensor_parallel_size": 1,
                               "process_group_backend": "gloo", "save_distributed_checkpoint": False}},
    "fsdp": {**SHARED, "accelerator": "gpu", "devices": 2, "precision": "bf16-mixed",
             "strategy": {"_target_": "lightning.pytorch.strategies.ModelParallelStrategy",
                          "data_parallel_size": None, "tensor_parallel_size": 1,
                          "save_distributed_checkpoint": True}},
}


def resolved(expected: dict, output_dir: str) -> dict:
    """``expected`` with its interpolation resolved by hand: the run directory. (FSDP2's ``data_parallel_size:
    null`` becomes devices x num_nodes in ``lit_credit.train.fill_data_parallel_size``, not in the config.)"""
    return {**expected, "default_root_dir": output_dir}


@pytest.mark.parametrize("name", [*EXPECTED, None], ids=lambda n: n or "train.yaml-default")
def test_trainer_variant_composes_as_before(name, make_cfg):
    cfg = make_cfg(*([f"trainer={name}"] if name else []))
    expected = EXPECTED[name or "cpu"]  # train.yaml keeps `trainer: cpu` as its default
    assert OmegaConf.to_container(cfg.trainer, resolve=False) == expected
    assert OmegaConf.to_container(cfg.trainer, resolve=True) == resolved(expected, cfg.paths.output_dir)


def test_default_holds_only_the_shared_keys(make_cfg):
    cfg = make_cfg("trainer=default")
    assert OmegaConf.to_container(cfg.trainer, resolve=False) == SHARED
