"""The outcome reward of a multi-turn refinement episode (``reward=final_turn``): the last turn's verifier
score."""
from __future__ import annotations

import pytest

from lit_credit.rewards import FinalTurnReward


def test_final_turn_reward_is_the_last_turn_score():
    out = FinalTurnReward()({}, ["3", "5"], turn_scores=[0.0, 1.0])
    assert (out.score, out.parts, out.turns) == (1.0, {"best": 1.0, "first": 0.0, "turns": 2.0}, {})
    # a success lost at the last turn scores the lost turn (None: an unscored turn counts 0); best keeps it
    lost = FinalTurnReward()({}, ["5", "4"], turn_scores=[1.0, None])
    assert (lost.score, lost.parts["best"]) == (0.0, 1.0)
    with pytest.raises(ValueError, match="task=math_revise"):
        FinalTurnReward()({}, ["3"])
