"""LightningCLI entry point: ``lit-credit-cli fit --config conf/cli/grpo_arith.yaml``.

Builds the same objects as the Hydra entry (``class_path`` where Hydra says ``_target_``).
"""
from __future__ import annotations

from lightning.pytorch.cli import LightningCLI

from data_modules import RolloutDataModule
from lit_credit.methods import GRPOModule


def cli(args=None, run: bool = True) -> LightningCLI:
    return LightningCLI(GRPOModule, RolloutDataModule, subclass_mode_model=True, args=args, run=run,
                        save_config_kwargs={"overwrite": True}, auto_configure_optimizers=False)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
