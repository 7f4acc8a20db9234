from lit_credit.rewards.base import Reward
from lit_credit.rewards.exact_match import ExactMatchReward, parse_final_integer

__all__ = ["ExactMatchReward", "Reward", "parse_final_integer"]
