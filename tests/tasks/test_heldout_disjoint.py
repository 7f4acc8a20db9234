"""Held-out splits are disjoint in *content* from training and from the demonstrations, for every task.

Each task defines a content key (what a problem is, surface words a template varies removed) and splits with
:func:`lit_credit.tasks.base.heldout_split`. Per task: the default-size split (``conf/task/*.yaml``) shares no
content key between test and train, no demonstration carries a held-out key, and a hand-written pair of rows
that differ only in surface words share a key while rows of other content do not.
"""
from __future__ import annotations

import itertools
import json

import pytest

from lit_credit.tasks import (
    ArithTask,
    CodeReviseTask,
    FormTask,
    MathReviseTask,
    ToolCallTask,
    arith,
    code_revise,
    form,
    math_revise,
    toolcall,
)
from lit_credit.tasks.base import disjoint_train, heldout_split
from lit_credit.tasks.code_revise import extract_code, make_problem
from lit_credit.tasks.form1040 import TaxInput, compute_1040
from lit_credit.tasks.toolcall import make_row


def keys(task, split, key):
    return [key(r) for r in task.dataset(split)]


def assert_disjoint(task, key):
    test, train = keys(task, "test", key), keys(task, "train", key)
    assert len(set(test)) == len(test) == task.num_test  # one row per held-out content
    assert not set(test) & set(train)
    return set(test)


def user_row(demo):
    """A demonstration's first user turn as a row (what the content keys read)."""
    return {"prompt": [next(m for m in demo["messages"] if m["role"] == "user")]}


# ------------------------------------------------------------------------------------------------ math_revise
def test_math_revise_default_split_and_demonstrations_are_disjoint_in_content():
    task = MathReviseTask(num_train=2000, num_test=100, max_turns=3, kinds="word,arith", max_operand=12,
                          revise_frac=0.4)
    held = assert_disjoint(task, math_revise.content_key)
    assert len(task.dataset("train")) == 2000
    demos = list(task.demonstrations(500, seed=0))
    assert len(demos) == 500 and not {math_revise.content_key(user_row(d)) for d in demos} & held


def test_math_revise_content_key_strips_names_and_items_only():
    def row(text):
        return {"prompt": [{"role": "user", "content": text}]}

    ana = "Ana has 3 pens and gets 4 more. How many pens does Ana have now?"
    ben = "Ben has 3 coins and gets 4 more. How many coins does Ben have now?"
    assert math_revise.surface_free(ana) == "{n} has 3 {i} and gets 4 more. How many {i} does {n} have now?"
    assert math_revise.content_key(row(ana)) == math_revise.content_key(row(ben))
    assert math_revise.content_key(row(ana)) != math_revise.content_key(row(ana.replace("4 more", "5 more")))
    other_template = "Ana has 3 pens and 4 more than that in a box. How many pens are in the box?"
    assert math_revise.content_key(row(ana)) != math_revise.content_key(row(other_template))
    assert math_revise.surface_free("Bench pens, Anabel") == "Bench {i}, Anabel"  # whole words only


def test_math_revise_running_dry_names_the_fields():
    # kinds=arith, max_operand=2: 3 templates x 2^3 operand triples = 24 problems, fewer than 30 held out
    with pytest.raises(ValueError, match=r"task\.num_train=1, task\.num_test=30: only 24 distinct held-out"):
        MathReviseTask(num_train=1, num_test=30, kinds="arith", max_operand=2).dataset("test")


def test_math_revise_jsonl_train_drops_repeats_of_held_out_problems(tmp_path):
    path = tmp_path / "math.jsonl"
    problems = ["What is 1+1?", "What is 2+2?", "what is  1+1?", "What is 3+3?"]
    path.write_text("".join(json.dumps({"problem": p, "answer": "0"}) + "\n" for p in problems))
    test = tmp_path / "test.jsonl"
    test.write_text(json.dumps({"problem": "What is 1+1?", "answer": "2"}) + "\n")
    task = MathReviseTask(num_train=10, num_test=1, jsonl_path=str(path), test_jsonl_path=str(test))
    assert [r["prompt"][0]["content"].split("\n")[0] for r in task.dataset("train")] == ["What is 2+2?",
                                                                                         "What is 3+3?"]


# ------------------------------------------------------------------------------------------------ arith
def test_arith_default_split_and_demonstrations_are_disjoint_in_content():
    task = ArithTask(num_train=None, num_test=128, max_operand=99, ops="+-")
    held = assert_disjoint(task, arith.content_key)
    # every problem not held out: 100 * 101 / 2 sums + 100 * 100 differences - 128
    assert len(task.dataset("train")) == 5050 + 10000 - 128
    assert len(set(keys(task, "train", arith.content_key))) == len(task.dataset("train"))
    demos = list(task.demonstrations(2000, seed=1))
    assert len(demos) == 2000 and not {arith.content_key(user_row(d)) for d in demos} & held


def test_arith_content_key_orders_commutative_operands():
    key = arith.content_key
    assert key(ArithTask.row(3, "+", 4)) == key(ArithTask.row(4, "+", 3)) == (3, "+", 4)
    assert key(ArithTask.row(3, "*", 4)) == key(ArithTask.row(4, "*", 3))
    assert key(ArithTask.row(7, "-", 2)) != key(ArithTask.row(2, "-", 7))
    assert key(ArithTask.row(3, "+", 4)) != key(ArithTask.row(3, "*", 4))


def test_arith_counts_the_space_in_content_keys():
    # max_operand=1, ops="+": 0 + 0, 0 + 1 (= 1 + 0), 1 + 1: 3 problems, not 4
    assert arith.num_problems(1, "+") == 3 and arith.num_problems(9, "+-*") == 55 + 100 + 55
    with pytest.raises(ValueError, match=r"task\.num_train \+ task\.num_test = 4 must fit the 3 distinct"):
        ArithTask(num_train=2, num_test=2, max_operand=1, ops="+")
    task = ArithTask(num_train=2, num_test=1, max_operand=1, ops="+")
    assert sorted(keys(task, "test", arith.content_key) + keys(task, "train", arith.content_key)) == [
        (0, "+", 0), (0, "+", 1), (1, "+", 1)]


# ------------------------------------------------------------------------------------------------ toolcall
@pytest.mark.parametrize("kwargs", [
    dict(num_train=1000, num_test=100, max_distractors=2),  # conf/task/toolcall.yaml
    dict(num_train=600, num_test=60, subsets={"chain": 1.0}, max_distractors=1, max_turns=4),  # toolcall_multistep
], ids=["toolcall", "toolcall_multistep"])
def test_toolcall_default_split_and_demonstrations_are_disjoint_in_content(kwargs):
    task = ToolCallTask(**kwargs)
    held = assert_disjoint(task, toolcall.content_key)
    assert len(task.dataset("train")) == kwargs["num_train"]
    rows = [row for row, _ in task.demonstration_rows(400, seed=0)]
    assert len(rows) == 400 and not {toolcall.content_key(r) for r in rows} & held


def test_toolcall_content_key_is_the_canonical_gold_calls():
    task = ToolCallTask(num_train=0, num_test=0)
    key = toolcall.content_key
    weather = task.synthetic_row(("weather", ("Paris", "2026-11-05")))
    rain = task.synthetic_row(("weather_rain", ("Paris", "2026-11-05")))
    assert weather["question"] != rain["question"] and key(weather) == key(rain)
    assert key(weather) != key(task.synthetic_row(("weather", ("Rome", "2026-11-05"))))
    # one parallel step: the order of its calls is not scored; two sequential steps: it is
    a_b, b_a = (task.synthetic_row(("time2", cities)) for cities in (("Seoul", "Tokyo"), ("Tokyo", "Seoul")))
    assert key(a_b) == key(b_a)
    f, g = {"name": "get_time", "arguments": {"city": "Seoul"}}, {"name": "get_stock_price", "arguments": {"symbol": "IBM"}}
    assert key(make_row("q", [], [[f], [g]], "chain", "1")) != key(make_row("q", [], [[g], [f]], "chain", "2"))
    # argument order, blanks and case do not matter (the reward's loose equality), values do
    w1 = make_row("q1", [], [[{"name": "get_weather", "arguments": {"city": "Paris", "date": "2026-11-05"}}]], "single", "a")
    w2 = make_row("q2", [], [[{"name": "get_weather", "arguments": {"date": "2026-11-05", "city": " paris"}}]], "single", "b")
    assert key(w1) == key(w2)
    # no gold calls: the question is the content
    assert key(task.synthetic_row(("capital", ("France",)))) != key(task.synthetic_row(("capital", ("Peru",))))


def test_toolcall_running_dry_names_the_fields():
    # values_per_slot=2: 52 single questions, 44 contents (weather_rain and convert_q repeat 4 calls each)
    with pytest.raises(ValueError, match=r"task\.num_test: the 'single' subset is asked for 45 held-out questions "
                                         r"and has 44 distinct in content"):
        ToolCallTask(num_train=0, num_test=45, subsets="single", values_per_slot=2).dataset("test")
    with pytest.raises(ValueError, match=r"task\.num_train: the 'single' subset is asked for 40 training questions"):
        ToolCallTask(num_train=40, num_test=12, subsets="single", values_per_slot=2).dataset("train")


# ------------------------------------------------------------------------------------------------ code_revise
def test_code_revise_default_split_and_demonstrations_are_disjoint_in_content():
    task = CodeReviseTask(num_train=500, num_test=50, max_turns=3, revise_frac=0.3)
    held = assert_disjoint(task, code_revise.content_key)
    demos = list(task.demonstrations(150, seed=0))
    solutions = {extract_code(d["messages"][-1]["content"]) for d in demos}
    assert len(demos) == 150 and solutions and not solutions & held


def test_code_revise_content_key_is_the_program():
    row = make_problem("add_k", (5,)).row()
    reworded = dict(row, prompt=[{"role": "user", "content": "Define add_k(x) returning x + 5."}], id="other")
    assert code_revise.content_key(row) == code_revise.content_key(reworded)
    assert code_revise.content_key(row) != code_revise.content_key(make_problem("add_k", (6,)).row())
    assert code_revise.content_key(row) != code_revise.content_key(make_problem("shout", (5,)).row())


# ------------------------------------------------------------------------------------------------ form
def test_form_default_split_and_demonstrations_are_disjoint_in_content():
    task = FormTask(num_train=400, num_test=20)
    test, train = set(keys(task, "test", form.content_key)), set(keys(task, "train", form.content_key))
    assert len(test) == 20 and not test & train
    rendered_test = {r["context"].split("\n")[0] for r in task.dataset("test")}
    demos = list(task.demonstrations(500, seed=0))
    cases = {next(m for m in d["messages"] if m["role"] == "user")["content"].split("\n")[0] for d in demos}
    assert len(cases) > 100 and not cases & rendered_test


def test_form_content_key_is_the_inputs():
    one = TaxInput("single", w2s=((52300, 4100), (8000, 600)), taxable_interest=120)
    swapped = TaxInput("single", w2s=((8000.0, 600.0), (52300, 4100)), taxable_interest=120.0)
    richer = TaxInput("single", w2s=((52300, 4100), (8000, 600)), taxable_interest=121)

    def row(case_id, inp):
        return form.line_rows(case_id, inp, compute_1040(inp), ("1a",))[0]

    assert form.content_key(row("train3", one)) == form.content_key(row("test0", swapped))
    assert form.content_key(row("train3", one)) != form.content_key(row("train3", richer))


def test_form_train_skips_cases_with_held_out_inputs():
    """Synthetic test and train cases come from two seeded streams, which rarely repeat each other; so the
    helper is fed the train stream as the test stream too: its first case is held out, and train must skip
    that draw of the train stream."""
    task = FormTask(num_train=5, num_test=3, difficulties=[1], seed=0)
    test_keys = set(keys(task, "test", form.content_key))
    assert not test_keys & set(keys(task, "train", form.content_key))
    split = heldout_split(task._draws("train"), lambda c: c["key"], 5, 1, train_draws=task._draws("train"))
    assert split["test"][0]["key"] not in {c["key"] for c in split["train"]}
    assert [c["id"] for c in split["train"]] == [1, 2, 3, 4, 5]  # draw 0 is the held-out case


# ------------------------------------------------------------------------------------------------ the helper
def test_heldout_split_reserves_the_first_distinct_keys_and_names_the_fields():
    rows = [{"id": i, "k": k} for i, k in enumerate("aabcadb")]
    split = heldout_split(rows, lambda r: r["k"], None, 2)
    assert [r["id"] for r in split["test"]] == [0, 2] and [r["id"] for r in split["train"]] == [3, 5]
    assert heldout_split(rows, lambda r: r["k"], 1, 2)["train"] == [rows[3]]
    with pytest.raises(ValueError, match=r"task\.num_train=3, task\.num_test=2: the draws ended after 2 .*; fix"):
        heldout_split(rows, lambda r: r["k"], 3, 2, fix="fix")
    with pytest.raises(ValueError, match=r"task\.num_train=0, task\.num_test=5: the draws ended after 4 distinct"):
        heldout_split(rows, lambda r: r["k"], 0, 5)
    endless = ({"id": i % 3, "k": i % 3} for i in itertools.count())  # 3 ids, 3 keys, forever
    with pytest.raises(ValueError, match=r"task\.num_train=4, task\.num_test=1: only 2 training problems"):
        heldout_split(endless, lambda r: r["k"], 4, 1, max_misses=100)
    assert disjoint_train(rows, lambda r: r["k"], {"a"}, None, distinct=lambda r: r["k"]) == [rows[2], rows[3], rows[5]]
