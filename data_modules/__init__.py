from data_modules.rollout import RolloutDataModule

__all__ = ["RolloutDataModule"]
