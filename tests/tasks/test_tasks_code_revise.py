"""The code_revise task: the problem templates, splits, the verifier environment and the revision demonstrations
(the sandbox itself is tested in test_sandbox.py)."""
from __future__ import annotations

import pytest

from lit_credit.tasks.code_revise import (
    INSTRUCTION,
    SPACE,
    TEMPLATES,
    CodeReviseTask,
    code_feedback,
    extract_code,
    gold_reply,
    make_problem,
)
from lit_credit.tasks.sandbox import SandboxResult, run_sandboxed, run_trusted


# ---------------------------------------------------------------------------------------------- task
@pytest.fixture(scope="module")
def task() -> CodeReviseTask:
    return CodeReviseTask(num_train=300, num_test=40, max_turns=3, timeout_s=2.0, seed=5)


def test_splits_disjoint_and_deterministic(task: CodeReviseTask) -> None:
    train, test = task.dataset("train"), task.dataset("test")
    assert (len(train), len(test)) == (300, 40)
    assert not set(train["id"]) & set(test["id"]) and len(set(train["id"])) == 300
    again = CodeReviseTask(num_train=300, num_test=40, seed=5)
    assert again.dataset("test")["id"] == test["id"] and again.dataset("train")["id"] == train["id"]
    assert CodeReviseTask(num_train=300, num_test=40, seed=6).dataset("test")["id"] != test["id"]
    row = train[0]
    assert set(row) == {"prompt", "tests", "entry_point", "solution", "id"}
    assert row["prompt"][0]["role"] == "user" and row["prompt"][0]["content"].endswith(INSTRUCTION)
    assert 4 <= len(row["tests"]) <= 5 and all(t.startswith(f"assert {row['entry_point']}(") for t in row["tests"])
    assert len({i.split(":")[0] for i in train["id"]}) == len(TEMPLATES)


def test_config_errors() -> None:
    with pytest.raises(ValueError, match=r"task\.num_train"):
        CodeReviseTask(num_train=SPACE, num_test=1)
    with pytest.raises(ValueError, match=r"task\.max_turns"):
        CodeReviseTask(max_turns=0)
    with pytest.raises(ValueError, match=r"task\.memory_mb"):
        CodeReviseTask(memory_mb=16)
    with pytest.raises(ValueError, match=r"task\.timeout_s"):
        CodeReviseTask(timeout_s=0)


def test_every_gold_passes_and_every_bug_fails_in_process() -> None:
    for name, (_, _, params) in TEMPLATES.items():
        for p in params:
            problem = make_problem(name, p)
            assert run_trusted(problem.solution, problem.tests).score == 1.0, problem.id
            assert run_trusted(problem.bug, problem.tests).score < 1.0, problem.id


def test_gold_and_bugs_in_the_sandbox(task: CodeReviseTask) -> None:
    """One row per template: the gold scores 1 in the real sandbox and the bug's sandboxed result equals the
    in-process one the demonstrations use."""
    rows = {}
    for row in task.dataset("train"):
        rows.setdefault(row["entry_point"], row)
    env = task.environment()
    for row in rows.values():
        assert env.verdict(row, gold_reply(row["solution"])).score == 1.0, row["id"]
        problem = make_problem(*_params_of(row["id"]))
        assert run_sandboxed(problem.bug, problem.tests, timeout_s=2.0) == run_trusted(problem.bug, problem.tests)


def _params_of(pid: str) -> tuple[str, tuple]:
    name, _, _ = pid.partition(":")
    return name, next(p for p in TEMPLATES[name][2] if make_problem(name, p).id == pid)


def test_extract_code() -> None:
    assert extract_code("Here:\n```python\nx = 1\n```\nand\n```python\ny = 2\n```\nDone.") == "y = 2\n"
    assert extract_code("```\na = 1\n```\n```python\nb = 2\n```\n```text\nnot code\n```") == "b = 2\n"
    assert extract_code("```py\nz = 3\n```") == "z = 3\n"
    assert extract_code("```\nw = 4\n```") == "w = 4\n"
    assert extract_code("  def f():\n    return 1\n ") == "def f():\n    return 1"
    assert extract_code("```python\ndef f():\n    return 1\n") == "def f():\n    return 1\n"  # truncated reply


def test_feedback_texts() -> None:
    tests = ["assert f(1) == 2", "assert f(2) == 3", "assert f(3) == 4"]
    assert code_feedback(SandboxResult(1, 3, None, ((1, "AssertionError"), (2, "TypeError"))), tests) == \
        "1/3 tests passed. First failing test: `assert f(2) == 3`. Fix the code."
    assert code_feedback(SandboxResult(2, 3, None, ((0, "TypeError"),)), tests) == \
        "2/3 tests passed. First failing test: `assert f(1) == 2` (raised TypeError). Fix the code."
    assert code_feedback(SandboxResult(0, 3, "timeout"), tests) == "Your code timed out. Fix the code."
    assert code_feedback(SandboxResult(3, 3), tests) == "3/3 tests passed."


def test_environment_turns(task: CodeReviseTask) -> None:
    env = task.environment()
    row = next(r for r in task.dataset("train") if r["entry_point"] == "clamp")
    right = env.step(row, 0, "Sure.\n" + gold_reply(row["solution"]))
    assert right.done and right.score == 1.0 and right.messages == []
    wrong_code = row["solution"].replace("min(", "max(", 1)
    wrong = env.step(row, 0, gold_reply(wrong_code))
    assert not wrong.done and wrong.score < 1.0
    assert wrong.messages == [{"role": "user", "content": wrong.info["verdict"].feedback}]
    assert "tests passed. First failing test: `assert clamp(" in wrong.messages[0]["content"]
    assert env.step(row, task.max_turns - 1, gold_reply(wrong_code)).done
    empty = env.step(row, 1, "I don't know.")
    assert not empty.done and empty.score == 0.0
    assert empty.messages[0]["content"] == "Your code has a syntax error. Fix the code."
    assert env.errors == 0


def test_demonstrations(task: CodeReviseTask) -> None:
    by_prompt = {make_problem(n, p).row()["prompt"][0]["content"]: make_problem(n, p).row()
                 for n, (_, _, params) in TEMPLATES.items() for p in params}
    held_out = set(task.dataset("test")["id"])
    demos = list(task.demonstrations(300, seed=1))
    assert len(demos) == 300 and demos == list(task.demonstrations(300, seed=1))
    assert not {by_prompt[d["messages"][0]["content"]]["id"] for d in demos} & held_out
    revised = [d for d in demos if len(d["messages"]) == 4]
    assert all(len(d["messages"]) in (2, 4) for d in demos)
    assert 0.2 < len(revised) / len(demos) < 0.4
    env = task.environment()
    for demo in revised[:6]:
        user, first, feedback, final = demo["messages"]
        row = by_prompt[user["content"]]
        assert [m["role"] for m in demo["messages"]] == ["user", "assistant", "user", "assistant"]
        step = env.step(row, 0, first["content"])
        assert not step.done and step.messages == [feedback]
        assert env.step(row, 1, final["content"]).score == 1.0
    assert all(len(d["messages"]) == 2 for d in CodeReviseTask(num_train=50, num_test=10, max_turns=1)
               .demonstrations(50, seed=0))


def test_continue_after_success_mode() -> None:
    # task.stop_on_success=false: passing code is answered with the verifier's all-passed message and the
    # episode goes on to max_turns turns; the demonstrations keep the right code to the last turn.
    task = CodeReviseTask(num_train=60, num_test=10, max_turns=3, seed=5, stop_on_success=False)
    env = task.environment()
    row = next(r for r in task.dataset("train") if r["entry_point"] == "clamp")
    n = len(row["tests"])
    right = env.step(row, 0, gold_reply(row["solution"]))
    assert (right.done, right.score) == (False, 1.0)
    assert right.messages == [{"role": "user", "content": f"{n}/{n} tests passed."}]  # neutral: no "Fix"
    assert env.step(row, 2, gold_reply(row["solution"])).done  # turn K ends it
    demos = list(task.demonstrations(60, seed=1))
    for demo in demos:
        turns = demo["messages"][1:]
        assert [m["role"] for m in turns] == ["assistant", "user"] * 2 + ["assistant"]
        code = turns[-1]["content"]
        first = next(k for k, m in enumerate(turns[::2]) if m["content"] == code)
        assert first <= 1 and all(m["content"] == code for m in turns[2 * first::2])
    by_prompt = {make_problem(n, p).row()["prompt"][0]["content"]: make_problem(n, p).row()
                 for n, (_, _, params) in TEMPLATES.items() for p in params}
    for demo in demos[:6]:  # the messages are exactly the environment's (sandboxed) answers to each turn
        turns, problem = demo["messages"][1:], by_prompt[demo["messages"][0]["content"]]
        assert [m["content"] for m in turns[1::2]] == \
            [env.step(problem, k, m["content"]).messages[0]["content"] for k, m in enumerate(turns[:-1:2])]
    assert any(len(d["messages"]) == 6 and d["messages"][1] != d["messages"][3] for d in demos)  # revisions too
    with pytest.raises(ValueError, match=r"task\.stop_on_success"):
        CodeReviseTask(num_train=60, num_test=10, stop_on_success="no")
