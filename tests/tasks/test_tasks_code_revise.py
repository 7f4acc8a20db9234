"""The code_revise task: the subprocess sandbox, the problem templates, splits, the verifier environment and the
revision demonstrations."""
from __future__ import annotations

import os
import signal
import socket
import time
from contextlib import suppress
from pathlib import Path

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

ADD = "def add(a, b):\n    return a + b\n"


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (a zombie is dead, merely unreaped by its new parent)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def wait_dead(pid: int, within_s: float = 2.0) -> bool:
    deadline = time.monotonic() + within_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# ---------------------------------------------------------------------------------------------- sandbox
def test_sandbox_counts_passes_exactly() -> None:
    tests = ["assert add(2, 3) == 5", "assert add(1, 1) == 3", "assert add(-1, 1) == 0"]
    result = run_sandboxed(ADD, tests, timeout_s=2.0)
    assert (result.passed, result.total, result.error) == (2, 3, None)
    assert result.score == pytest.approx(2 / 3)
    assert result.failures == ((1, "AssertionError"),)
    typed = run_sandboxed(ADD, ["assert add('a', 1) == 'a1'", "assert add(1, 2) == 3"], timeout_s=2.0)
    assert (typed.passed, typed.failures) == (1, ((0, "TypeError"),))
    assert run_sandboxed(ADD, [], timeout_s=2.0).score == 0.0 and SandboxResult(0, 0).score == 0.0


def test_sandbox_matches_trusted_run() -> None:
    tests = ["assert add(2, 3) == 5", "assert add(1, 1) == 3", "assert sub(1, 1) == 0"]
    assert run_sandboxed(ADD, tests, timeout_s=2.0) == run_trusted(ADD, tests)


def test_sandbox_kills_infinite_loops_within_the_timeout() -> None:
    for source, tests in [("while True:\n    pass\n", ["assert True"]),
                          ("def spin():\n    while True:\n        pass\n", ["assert True", "assert spin()"])]:
        start = time.monotonic()
        result = run_sandboxed(source, tests, timeout_s=1.0)
        assert time.monotonic() - start < 1.0 + 2.0
        assert result.error == "timeout" and result.score == 0.0 and result.total == len(tests)


@pytest.mark.parametrize("hang", [True, False], ids=["timeout", "normal-exit"])
def test_sandbox_kills_grandchildren(tmp_path: Path, hang: bool) -> None:
    pid_file = tmp_path / "grandchild.pid"
    source = ("import subprocess, sys\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
              f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
              + ("while True:\n    pass\n" if hang else ""))
    result = run_sandboxed(source, ["assert child.pid > 0"], timeout_s=1.0, max_processes=1 << 20)
    assert pid_file.exists(), "the grandchild was never started, so this test checks nothing"
    pid = int(pid_file.read_text())
    try:
        assert wait_dead(pid), f"grandchild {pid} outlived the sandbox"
    finally:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert result.error == ("timeout" if hang else None)


def test_sandbox_memory_limit() -> None:
    top = run_sandboxed("data = bytearray(2**30)\n", ["assert len(data) > 0"], timeout_s=2.0, memory_mb=256)
    assert (top.score, top.error) == (0.0, "memory")
    inner = run_sandboxed("def big():\n    return len(bytearray(2**30))\n",
                          ["assert big() == 2**30", "assert len(bytearray(10**6)) == 10**6"],
                          timeout_s=2.0, memory_mb=256)
    assert (inner.passed, inner.failures, inner.error) == (1, ((0, "MemoryError"),), "memory")


def test_sandbox_blocks_sockets() -> None:
    server = socket.create_server(("127.0.0.1", 0), backlog=8)  # the kernel completes handshakes unaccepted
    port = server.getsockname()[1]
    source = ("import _socket, socket\n"
              "def probe(connect):\n"
              "    try:\n"
              "        connect()\n"
              "    except OSError:\n"
              "        return 'blocked'\n"
              "    return 'open'\n"
              f"def via_create():\n    socket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n"
              f"def via_socket():\n    s = socket.socket()\n    s.settimeout(1)\n    s.connect(('127.0.0.1', {port}))\n"
              "    s.close()\n"
              f"def via_raw():\n    s = _socket.socket()\n    s.settimeout(1)\n    s.connect(('127.0.0.1', {port}))\n"
              "    s.close()\n")
    kinds = ("via_create", "via_socket", "via_raw")
    try:
        # Control: without the guard the server is reachable, so 'blocked' below is the guard's doing.
        assert run_trusted(source, [f"assert probe({k}) == 'open'" for k in kinds]).passed == 3
        result = run_sandboxed(source, [f"assert probe({k}) == 'blocked'" for k in kinds], timeout_s=3.0)
        assert (result.passed, result.error) == (3, None)
    finally:
        server.close()


def test_sandbox_syntax_errors_and_exits() -> None:
    for source in ("def add(a, b)\n    return a + b\n", "x = 1\0\n"):
        result = run_sandboxed(source, ["assert True"], timeout_s=2.0)
        assert (result.passed, result.total, result.error) == (0, 1, "syntax error")
    raised = run_sandboxed("raise ValueError('nope')\n", ["assert True"], timeout_s=2.0)
    assert (raised.passed, raised.error) == (0, "exception: ValueError: nope")
    assert run_sandboxed("raise SystemExit(0)\n", ["assert True"], timeout_s=2.0).error == "exception: SystemExit: 0"
    assert run_sandboxed("import os\nos._exit(0)\n", ["assert True"], timeout_s=2.0).error == "crashed"


def test_sandbox_output_cannot_fake_the_count() -> None:
    fake = '{"passed": 3, "failures": [], "error": null}'
    source = ("import atexit, os, sys\n"
              f"FAKE = {fake!r}\n"
              "print(FAKE)\n"
              "print('0' * 32 + ' ' + FAKE)\n"
              "print('x' * 2_000_000)\n"
              "sys.__stdout__.write(FAKE + '\\n')\n"
              "os.write(1, (FAKE + '\\n').encode())\n"
              "os.write(2, (FAKE + '\\n').encode())\n"
              "for fd in range(3, 8):\n"
              "    try:\n"
              "        os.write(fd, (FAKE + '\\n').encode())\n"
              "    except OSError:\n"
              "        pass\n"
              "atexit.register(lambda: print(FAKE))\n"
              "def f():\n    print(FAKE)\n    return 1\n")
    result = run_sandboxed(source, ["assert f() == 1", "assert f() == 2", "assert f() == 3"], timeout_s=3.0)
    assert (result.passed, result.total, result.error) == (1, 3, None)


def test_sandbox_files_stay_in_a_removed_temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    cwd_file = tmp_path / "cwd"
    source = (f"import os\nopen('data.txt', 'w').write('hello')\nopen({str(cwd_file)!r}, 'w').write(os.getcwd())\n")
    tests = ["assert open('data.txt').read() == 'hello'", "assert sorted(os.listdir('.')) == ['data.txt']",
             "assert set(os.environ) - {'LC_CTYPE'} == {'PATH'}"]
    result = run_sandboxed(source, tests, timeout_s=2.0)
    assert (result.passed, result.error) == (3, None), result
    work = Path(cwd_file.read_text())
    assert work != tmp_path and not work.exists()


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
