"""Rewards: one finished episode in, a :class:`~lit_credit.types.RewardResult` out (the :class:`Reward`
protocol of :mod:`lit_credit.interfaces`), and the parsers of what a reply says."""
from lit_credit.interfaces import Reward
from lit_credit.rewards.bfcl import BFCLMultiTurnReward, bfcl_reward
from lit_credit.rewards.dpa import (
    APPROVER_ACTIONS,
    CASES,
    VERIFIER_ACTIONS,
    DPASettings,
    approver_pair_rewards,
    case_labels,
    case_shares,
    informative_groups,
    rarity_weights,
    revise_bonus,
    revise_share,
    revision_rewards,
    verifier_pair_rewards,
)
from lit_credit.rewards.exact_match import ExactMatchReward, parse_final_integer
from lit_credit.rewards.form_line import FormLineReward, line_correct
from lit_credit.rewards.hierr import (
    HierRReward,
    final_reply,
    normalize_gold_calls,
    parse_tool_calls,
    strict_correct_ratio,
    tool_process_score,
)
from lit_credit.rewards.judges import JudgeResult, LLMJudge, RubricJudge, SummaryJudge, parse_rating
from lit_credit.rewards.turns import FinalTurnReward

__all__ = ["APPROVER_ACTIONS", "CASES", "VERIFIER_ACTIONS", "BFCLMultiTurnReward", "DPASettings", "ExactMatchReward", "FinalTurnReward", "FormLineReward",
           "HierRReward",
           "JudgeResult", "LLMJudge", "Reward", "RubricJudge", "SummaryJudge", "approver_pair_rewards", "bfcl_reward",
           "case_labels", "case_shares", "final_reply", "informative_groups", "line_correct", "normalize_gold_calls",
           "parse_final_integer", "parse_rating", "parse_tool_calls", "rarity_weights", "revise_bonus",
           "revise_share", "revision_rewards", "strict_correct_ratio", "tool_process_score", "verifier_pair_rewards"]
