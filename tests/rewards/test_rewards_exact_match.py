"""The exact-match verifier of integer answers (``reward=exact_match``) and its integer parser; degenerate
replies (empty, whitespace, 5000 digits, NUL) are cases of the bad-input corpus (answers.jsonl)."""
from __future__ import annotations

import pytest

from lit_credit.rewards import ExactMatchReward, parse_final_integer


@pytest.mark.parametrize("reply, score, fmt", [
    ("82", 1.0, 1.0),          # exact
    (" 82 ", 1.0, 1.0),        # surrounding blanks are trimmed
    ("It is 82", 1.0, 0.0),    # the last integer counts, but the format is not a bare number
    ("82 or 81", 0.0, 0.0),    # the last integer is 81
    ("-82", 0.0, 1.0),         # sign matters
    ("", 0.0, 0.0),            # empty reply: zero, not an error
    ("eighty-two", 0.0, 0.0),
])
def test_exact_match(reply, score, fmt):
    out = ExactMatchReward()({"answer": "82"}, [reply])
    assert (out.score, out.parts, out.turns) == (score, {"correct": score, "format": fmt}, {})


def test_negative_answers_and_the_last_integer():
    assert ExactMatchReward()({"answer": "-3"}, ["-3"]).score == 1.0  # (no reply at all: em-empty-replies)
    assert parse_final_integer("a1b-22c") == -22 and parse_final_integer("none") is None
