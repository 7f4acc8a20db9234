from lit_credit.rollout.chat import ChatCodec
from lit_credit.rollout.engine import HFEngine, RolloutEngine
from lit_credit.rollout.loop import Episode, run_episodes, to_batch

__all__ = ["ChatCodec", "Episode", "HFEngine", "RolloutEngine", "run_episodes", "to_batch"]
