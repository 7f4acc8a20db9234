"""Math answer extraction, math-verify equivalence and the MATH-500-style JSONL loader."""
from __future__ import annotations

import json
import threading

import pytest

from lit_credit.rewards.math_answer import (
    BOXED_INSTRUCTION,
    answers_match,
    extract_answer,
    load_math_jsonl,
    math_score,
)


@pytest.mark.parametrize(("text", "expected"), [
    (r"So the result is \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),
    (r"First \boxed{1}, then corrected: \boxed{2}", "2"),
    (r"\boxed{1} but really \fbox{7}", "7"),
    (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
    (r"\boxed{3} and a truncated \boxed{4", "3"),
    ("The answer is 42.", "42"),
    ("**Answer:** $x+1$.\nThanks", "$x+1$"),
    ("Step 1 gives 3, then 2.5 and finally -4/5 apples", "-4/5"),
    ("It is 3.5.", "3.5"),
    ("no digits at all", None),  # empty, None, huge and odd replies: the bad-input corpus (answers.jsonl)
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_extract_answer_never_raises_on_non_strings():
    assert extract_answer(12) is None  # type: ignore[arg-type]  (None: the corpus's math-none-reply)


@pytest.mark.parametrize(("pred", "gold", "expected"), [
    ("0.5", r"\frac{1}{2}", True),
    ("1/2", r"\frac{1}{2}", True),
    ("3", "2", False),
    ("1+x", "x+1", True),
    (r"\frac{\sqrt{2}}{2}", r"\sqrt{2}/2", True),
    ("14/3", r"\dfrac{14}{3}", True),
    (r"(3,\pi/2)", r"\left( 3, \frac{\pi}{2} \right)", True),
    ("C", r"\text{(C)}", True),
    ("10", r"10\%", True),
    ("10%", r"10\%", True),
    ("0.1", r"10\%", False),
    ("-3", "3", False),
    ("$5$", "5", True),
    ("2.0", "2", True),
])
def test_answers_match(pred, gold, expected):
    assert answers_match(pred, gold) is expected


def test_answers_match_none_and_empty_are_false():
    assert answers_match(None, "1") is False
    assert answers_match("", "") is False
    assert answers_match("1", "") is False


@pytest.mark.parametrize("pred", ["}{", r"\frac{", r"\boxed{", "$$$", "\\", r"\sqrt{", "1/0", "10^{10^{10^{10}}}",
                                  "x" * 5000])
def test_garbage_never_raises(pred):
    assert answers_match(pred, "2") is False


def test_answers_match_in_worker_thread():
    results: dict[str, bool] = {}

    def work():
        results["half"] = answers_match("0.5", r"\frac{1}{2}")
        results["wrong"] = answers_match("3", "2")

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert results == {"half": True, "wrong": False}


def test_math_score():
    assert math_score(r"Adding them: \boxed{\dfrac{1}{2}}", "0.5") == 1.0
    assert math_score("The answer is 7.", "7") == 1.0
    assert math_score("The answer is 8.", "7") == 0.0
    assert math_score("I don't know", "7") == 0.0


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_load_math_jsonl(tmp_path):
    path = _write(tmp_path / "math500.jsonl", [
        json.dumps({"problem": "What is $1+1$?", "answer": "2", "unique_id": "test/algebra/1.json", "level": 1,
                    "subject": "Algebra", "solution": "Clearly $\\boxed{2}$."}),
        "",
        json.dumps({"problem": "Compute $\\frac{1}{2}+\\frac{1}{4}$.", "answer": "\\frac{3}{4}"}),
        json.dumps({"problem": "How many primes are below 10?", "answer": 4, "level": "Level 2"}),
    ])
    rows = load_math_jsonl(path)
    assert [r["id"] for r in rows] == ["test/algebra/1.json", "math500-3", "math500-4"]
    assert [r["answer"] for r in rows] == ["2", "\\frac{3}{4}", "4"]
    assert [r["level"] for r in rows] == ["1", "", "Level 2"]
    assert [r["subject"] for r in rows] == ["Algebra", "", ""]
    assert rows[0]["prompt"] == [{"role": "user", "content": f"What is $1+1$?\n\n{BOXED_INSTRUCTION}"}]
    assert BOXED_INSTRUCTION == "Put the final answer in \\boxed{}."
    for row in rows:
        assert set(row) == {"prompt", "answer", "id", "level", "subject"}
        assert all(isinstance(row[k], str) for k in ("answer", "id", "level", "subject"))
        assert row["prompt"][0]["content"].endswith(BOXED_INSTRUCTION)


def test_load_math_jsonl_missing_field_names_line_and_field(tmp_path):
    path = _write(tmp_path / "bad.jsonl", [json.dumps({"problem": "1+1?", "answer": "2"}),
                                           json.dumps({"problem": "2+2?"})])
    with pytest.raises(ValueError, match=r"line 2.*\"answer\"") as info:
        load_math_jsonl(path)
    assert str(path) in str(info.value)


def test_load_math_jsonl_malformed_line(tmp_path):
    path = _write(tmp_path / "bad.jsonl", [json.dumps({"problem": "1+1?", "answer": "2"}), "", '{"problem": "3+3?",'])
    with pytest.raises(ValueError, match=r"line 3.*malformed JSON"):
        load_math_jsonl(path)


def test_load_math_jsonl_missing_file(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl"):
        load_math_jsonl(missing)


def test_main_thread_call_keeps_an_outer_alarm():
    signal = pytest.importorskip("signal")
    if not hasattr(signal, "setitimer"):
        pytest.skip("no interval timers on this platform")
    previous = signal.getitimer(signal.ITIMER_REAL)
    signal.setitimer(signal.ITIMER_REAL, 1000.0)
    try:
        assert answers_match("0.5", r"\frac{1}{3}") is False  # not the fast path: math-verify (signal.alarm) runs
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 990.0 < remaining <= 1000.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, *previous)
