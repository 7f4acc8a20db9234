"""Task ``form`` (DPA-GRPO's line decisions); values worked by hand. The form oracle reward and the dollar
parsers: tests/rewards/test_rewards_form_line.py."""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from lit_credit.tasks import FormTask
from lit_credit.tasks.form import (
    INSTRUCTIONS,
    action_text,
    gold_challenge,
    line_rows,
    parse_decision,
    render_case,
    role_prompt,
    wrong_value,
)
from lit_credit.tasks.form1040 import EVALUATED_LINES, TaxInput, compute_1040

CASE = TaxInput(filing_status="single", w2s=((52300, 4100),))


def test_render_case_and_rows_hold_the_earlier_lines():
    assert render_case(CASE) == "single | w2 52300/4100"
    three = TaxInput("married_filing_jointly", w2s=((1000.5, 10),), taxable_interest=120, ordinary_dividends=300,
                     qualified_dividends=100, num_qualifying_children=2)
    assert render_case(three) == ("married filing jointly | w2 1000.50/10 | interest 120 | dividends 300 "
                                  "(qualified 100) | children 2")
    gold = compute_1040(CASE)  # 1a 52300, 9 52300, 10 0, 11 52300, 12 14600, 15 = 52300 - 14600 = 37700
    rows = line_rows("c0", CASE, gold, ("1a", "15"))
    assert [r["line"] for r in rows] == ["1a", "15"] and rows[1]["gold"] == 37700
    assert rows[0]["context"] == "single | w2 52300/4100\n"  # nothing on the form before line 1a
    assert rows[1]["context"] == "single | w2 52300/4100\nform: 1a 52300, 9 52300, 10 0, 11 52300, 12 14600\n"
    assert rows[1]["prompt"][1]["content"].endswith("line 15?")
    assert json.loads(rows[1]["case"])["w2s"] == [[52300, 4100]]


def test_role_prompts_and_the_gold_challenge():
    row = line_rows("c0", CASE, compute_1040(CASE), ("15",))[0]
    challenge = gold_challenge(row, {"11": 52300, "12": 14600})
    assert challenge == {"claim": "37700", "argument": "11 - 12", "evidence": "52300 - 14600"}
    approver = role_prompt(row, "approver", "37600", challenge, "37700")
    assert approver[0]["content"] == INSTRUCTIONS["approver"]
    assert approver[1]["content"].endswith(
        'line 15: 37600\nchallenge: {"claim": "37700", "argument": "11 - 12", "evidence": "52300 - 14600"}\n'
        "revision: 37700")
    with pytest.raises(ValueError, match="role='judge'"):
        role_prompt(row, "judge")


def test_parsers():
    sac = action_text("15", "SAC") + '\n{"claim": "5", "argument": "a", "evidence": "b"}'
    assert parse_decision(sac, ("SAC", "NS")) == ("SAC", {"claim": "5", "argument": "a", "evidence": "b"})
    assert parse_decision(action_text("15", "SAC"), ("SAC", "NS")) == ("SAC", {})  # no challenge line
    assert parse_decision('{"decision": "ns"}', ("SAC", "NS")) == ("NS", {})
    assert parse_decision('{"decision": "MAYBE"}', ("SAC", "NS")) == (None, {})
    assert parse_decision("{not json", ("KEEP", "REVISE")) == (None, {})
    assert parse_decision("[1, 2]", ("KEEP", "REVISE")) == (None, {})


def test_an_unparsable_verdict_reaches_the_reviser_as_an_empty_challenge():
    # DPA-GRPO counts a verifier reply that is not a decision as SAC (the official choice): parse_decision gives
    # (None, {}) and the reviser's prompt then carries the challenge with every field empty.
    row = line_rows("c0", CASE, compute_1040(CASE), ("15",))[0]
    decision, challenge = parse_decision("looks fine to me", ("SAC", "NS"))
    assert (decision, challenge) == (None, {})
    reviser = role_prompt(row, "reviser", "37600", challenge)
    assert reviser[0]["content"] == INSTRUCTIONS["reviser"]
    assert reviser[1]["content"].endswith('line 15: 37600\nchallenge: {"claim": "", "argument": "", "evidence": ""}')


def test_wrong_values_are_never_the_gold_value():
    rng = random.Random(0)
    rows = FormTask(num_train=30, num_test=2).dataset("train")
    assert all(wrong_value(rng, row) not in (row["gold"],) and wrong_value(rng, row) >= 0 for row in rows)


def test_dataset_splits_sizes_and_determinism():
    task = FormTask(num_train=10, num_test=3, lines="1a,15,35a")
    train, test = task.dataset("train"), task.dataset("test")
    assert len(train) == 30 and len(test) == 9  # every case has every line
    assert {r["id"].split("/")[0] for r in train}.isdisjoint({r["id"].split("/")[0] for r in test})
    assert FormTask(num_train=10, num_test=3, lines="1a,15,35a").dataset("train")["id"] == train["id"]
    assert FormTask(num_train=10, num_test=3, lines="1a,15,35a", seed=1).dataset("train")["id"] != train["id"]
    with pytest.raises(ValueError, match=r"task\.lines"):
        FormTask(lines="1a,99")
    with pytest.raises(ValueError, match=r"task\.difficulties"):
        FormTask(difficulties="4")
    with pytest.raises(ValueError, match=r"task\.role_mix"):
        FormTask(role_mix="1,1")



def test_rl_lines_narrow_the_rows_but_not_the_warm_start():
    from lit_credit.models.embedded import _task_identity

    full = FormTask(num_train=10, num_test=3, lines="1a,15,35a")
    narrow = FormTask(num_train=10, num_test=3, lines="1a,15,35a", rl_lines="15")
    # 10 train cases x 1 line, 3 test cases x 1 line; the rows are the full task's rows of line 15.
    assert len(narrow.dataset("train")) == 10 and len(narrow.dataset("test")) == 3
    assert set(narrow.dataset("train")["line"]) == {"15"}
    assert sorted(narrow.dataset("train")["id"]) == sorted(i for i in full.dataset("train")["id"] if i.endswith("/15"))
    # The demonstrations (hence the SFT start) and the embedded policy's cache key do not change.
    assert list(narrow.demonstrations(20, seed=3)) == list(full.demonstrations(20, seed=3))
    assert _task_identity(narrow) == _task_identity(full)
    with pytest.raises(ValueError, match=r"task\.rl_lines"):
        FormTask(lines="1a,15", rl_lines="35a")
def test_taxcalcbench_directory_is_the_test_split(tmp_path: Path):
    # One case of the public layout (<case>/input.json + output.xml; the fixture tests/data/taxcalcbench holds
    # it): single, one W-2 52300 / 4100 -> 1a 52300, 15 = 52300 - 14600 = 37700, 16 4295 (output.xml).
    fixture = Path(__file__).parents[1] / "data" / "taxcalcbench" / "ty24" / "test_data" / "single-w2-basic"
    shutil.copytree(fixture, tmp_path / "single-w2-basic")
    test = FormTask(taxcalcbench_dir=str(tmp_path), lines="1a,15,16").dataset("test")
    assert sorted(zip(test["line"], test["gold"])) == [("15", 37700), ("16", 4295), ("1a", 52300)]
    # The context holds the gold lines before each one (every evaluated line; a missing MeF element is 0).
    assert dict(zip(test["line"], test["context"]))["16"].endswith(
        "form: 1a 52300, 9 52300, 10 0, 11 52300, 12 14600, 15 37700\n")


def test_demonstrations_play_every_role_by_the_rules():
    task = FormTask(num_train=20, num_test=2)
    seen = set()
    for demo in task.demonstrations(200, seed=3):
        system, user, reply = (m["content"] for m in demo["messages"])
        role = next(r for r, text in INSTRUCTIONS.items() if text == system)
        seen.add(role)
        row_line = user.split("\nline ")[-1].split(":")[0].split("?")[0]
        gold = _gold_of(task, user, row_line)
        if role in ("proposer", "reviser"):
            assert reply == str(gold)
            continue
        x = int(user.split(f"line {row_line}: ")[1].split("\n")[0])
        if role == "verifier":  # SAC (with the gold challenge) exactly when x is wrong
            decision, challenge = parse_decision(reply, ("SAC", "NS"))
            assert decision == ("SAC" if x != gold else "NS")
            assert challenge.get("claim", str(gold)) == str(gold)
        else:  # approver: REVISE exactly when x is wrong and the shown revision is right
            z = int(user.split("revision: ")[1])
            assert parse_decision(reply, ("KEEP", "REVISE"))[0] == ("REVISE" if x != gold and z == gold else "KEEP")
    assert seen == set(INSTRUCTIONS)


def _gold_of(task: FormTask, user: str, line: str) -> int:
    context = user.rsplit("line ", 1)[0]
    row = next(r for r in task.dataset("train") if r["line"] == line and r["context"] == context)
    return row["gold"]


def test_nineteen_lines_are_evaluated():
    assert len(EVALUATED_LINES) == 19
