"""The form oracle (``reward=form_line``) and the dollar parsers it shares with the form task; garbled,
non-finite and missing amounts are cases of the bad-input corpus (answers.jsonl)."""
from __future__ import annotations

from lit_credit.rewards import FormLineReward
from lit_credit.rewards.form_line import parse_dollars, parse_value


def test_parse_dollars_and_the_first_line_of_a_reply():
    assert parse_dollars("-$1,234.00") == -1234.0
    assert parse_dollars(True) is None and parse_dollars("nan") is None
    assert parse_value("37700") == 37700 and parse_value(" $1,234\nmore") == 1234
    assert parse_value("abc") is None and parse_value("") is None


def test_form_line_reward_strict_and_lenient():
    reward, row = FormLineReward(), {"gold": 1234}
    assert reward(row, ["$1,234"]).score == 1.0
    assert reward(row, ["$1,234"]).parts == {"strict": 1.0, "lenient": 1.0, "parsable": 1.0}
    assert reward(row, ["1239"]).score == 0.0
    assert reward(row, ["1239"]).parts == {"strict": 0.0, "lenient": 1.0, "parsable": 1.0}  # |5| <= 5
    assert reward(row, ["1240"]).parts["lenient"] == 0.0  # |6| > 5
    assert reward(row, ["twelve"]).score == 0.0
    assert reward(row, ["twelve"]).parts == {"strict": 0.0, "lenient": 0.0, "parsable": 0.0}
