from lit_credit.rewards.base import Reward
from lit_credit.rewards.exact_match import ExactMatchReward, parse_final_integer
from lit_credit.rewards.hierr import (
    HierRReward,
    final_reply,
    normalize_gold_calls,
    parse_tool_calls,
    tool_process_score,
)
from lit_credit.rewards.judges import JudgeResult, LLMJudge, RubricJudge, SummaryJudge, parse_rating
from lit_credit.rewards.turns import FinalTurnReward

__all__ = ["ExactMatchReward", "FinalTurnReward", "HierRReward", "JudgeResult", "LLMJudge", "Reward", "RubricJudge", "SummaryJudge",
           "final_reply", "normalize_gold_calls", "parse_final_integer", "parse_rating", "parse_tool_calls",
           "tool_process_score"]
