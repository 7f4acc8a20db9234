"""LightningCLI entry point: ``lit-credit-cli fit --config conf/cli/grpo_arith.yaml``.

Builds the same objects as the Hydra entry (``class_path`` where Hydra says ``_target_``).
"""
from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from data_modules import RolloutDataModule
from lit_credit.checkpoint import atomic_checkpoints
from lit_credit.distributed import claim_run_dir
from lit_credit.methods import PolicyModule
from lit_credit.models import PolicySource
from lit_credit.quiet import default_progress_bar, quiet


def prepared_source(class_type: type[PolicySource], *args, **kwargs) -> PolicySource:
    """jsonargparse instantiator: builds a :class:`PolicySource` and prepares it (the embedded policy's SFT warm
    start on a cold cache). jsonargparse builds ``model.init_args.policy`` before the module it is passed to,
    so the module's constructor only loads."""
    source = class_type(*args, **kwargs)
    source.prepare()
    return source


class CreditCLI(LightningCLI):
    """LightningCLI with lit-credit's guarantees: a run directory holding a run is not reused unless
    resuming (``--ckpt_path``), checkpoints are written atomically, our own checkpoints load in full
    (``weights_only`` defaults to false: they pickle hyperparameters and RNG states), and the policy source is
    prepared as it is built, before the module (:func:`prepared_source`), and the default progress bar counts
    steps (:class:`~lit_credit.quiet.StepProgressBar`)."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_instantiator(prepared_source, PolicySource)

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        """Lightning's, with :class:`~lit_credit.quiet.StepProgressBar` where Lightning would add its default."""
        given = config.get("callbacks") or []
        given = [*(given if isinstance(given, list) else [given]), *callbacks]
        callbacks = [*callbacks, *default_progress_bar(given, config.get("enable_progress_bar"))]
        return super()._instantiate_trainer(config, callbacks)

    def _parse_ckpt_path(self) -> None:
        """No-op: the run's config comes from ``--config``; Lightning's version would re-read the checkpoint's
        hyperparameters with ``weights_only=True``, which refuses our pickled credit, loss and RNG states."""

    def fit(self, model, **kwargs) -> None:
        claim_run_dir(self.trainer.default_root_dir, resuming=kwargs.get("ckpt_path") is not None)
        atomic_checkpoints(self.trainer)
        if kwargs.get("weights_only") is None:
            kwargs["weights_only"] = False
        self.trainer.fit(model, **kwargs)


def cli(args=None, run: bool = True) -> LightningCLI:
    quiet()  # also in the processes Lightning launches for the other ranks: they re-run this command
    return CreditCLI(PolicyModule, RolloutDataModule, subclass_mode_model=True, args=args, run=run,
                     save_config_kwargs={"overwrite": True}, auto_configure_optimizers=False)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
