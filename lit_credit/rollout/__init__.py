from lit_credit.models.chat import ChatCodec
from lit_credit.rollout.engine import HFEngine, RolloutEngine
from lit_credit.rollout.experience import Experience, finite_scores
from lit_credit.rollout.generator import TextGenerator
from lit_credit.rollout.loop import Trajectory, run_episodes, to_batch

__all__ = ["ChatCodec", "Experience", "HFEngine", "RolloutEngine", "TextGenerator", "Trajectory", "finite_scores",
           "run_episodes", "to_batch"]
