from lit_credit.models.chat import ChatCodec
from lit_credit.rollout.engine import HFEngine, RolloutEngine
from lit_credit.rollout.experience import Experience, finite_scores
from lit_credit.rollout.generator import TextGenerator
from lit_credit.rollout.loop import Episode, run_episodes, to_batch

__all__ = ["ChatCodec", "Episode", "Experience", "HFEngine", "RolloutEngine", "TextGenerator", "finite_scores",
           "run_episodes", "to_batch"]
