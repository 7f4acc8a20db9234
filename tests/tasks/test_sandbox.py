"""The code verifier's subprocess sandbox: exact counts, limits (time, memory), the process group, and the audit
hook's refusals (processes, network, writes outside its directory)."""
from __future__ import annotations

import os
import signal
import socket
import tempfile
import time
from contextlib import suppress
from pathlib import Path

import pytest

from lit_credit.tasks.sandbox import SandboxResult, run_sandboxed, run_trusted

ADD = "def add(a, b):\n    return a + b\n"
REFUSED = "exception: PermissionError: the sandbox refuses "
PROBE = ("def refused(action):\n"
         "    try:\n"
         "        action()\n"
         "    except PermissionError as err:\n"
         "        return str(err)\n"
         "    return 'allowed'\n")


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


def live_processes_mentioning(marker: str) -> list[int]:
    """Pids of live processes whose command line contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        with suppress(FileNotFoundError, ProcessLookupError, PermissionError):
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes() and alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def snapshot(root: Path) -> dict[str, tuple]:
    """``root`` and every path under it with its type, mode, size, mtime and contents."""
    return {str(p.relative_to(root)): (p.lstat().st_mode, p.lstat().st_size, p.lstat().st_mtime_ns,
                                       p.read_bytes() if p.is_file() and not p.is_symlink() else None)
            for p in (root, *root.rglob("*"))}


@pytest.fixture
def sandboxes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The folder this test's sandboxes make their temporary directories in: its path is in every sandbox
    child's command line (the payload's path), and in that of its forks."""
    root = tmp_path / "sandboxes"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


# ---------------------------------------------------------------------------------------------- counting
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


# ---------------------------------------------------------------------------------------------- limits
def test_sandbox_kills_infinite_loops_within_the_timeout() -> None:
    for source, tests in [("while True:\n    pass\n", ["assert True"]),
                          ("def spin():\n    while True:\n        pass\n", ["assert True", "assert spin()"])]:
        start = time.monotonic()
        result = run_sandboxed(source, tests, timeout_s=1.0)
        assert time.monotonic() - start < 1.0 + 2.0
        assert result.error == "timeout" and result.score == 0.0 and result.total == len(tests)


def test_sandbox_memory_limit() -> None:
    top = run_sandboxed("data = bytearray(2**30)\n", ["assert len(data) > 0"], timeout_s=2.0, memory_mb=256)
    assert (top.score, top.error) == (0.0, "memory")
    inner = run_sandboxed("def big():\n    return len(bytearray(2**30))\n",
                          ["assert big() == 2**30", "assert len(bytearray(10**6)) == 10**6"],
                          timeout_s=2.0, memory_mb=256)
    assert (inner.passed, inner.failures, inner.error) == (1, ((0, "MemoryError"),), "memory")


@pytest.mark.parametrize("hang", [True, False], ids=["timeout", "normal-exit"])
def test_sandbox_kills_grandchildren(tmp_path: Path, hang: bool) -> None:
    """With processes allowed (the hook refuses them by default), the process group still dies with the run."""
    pid_file, partial = tmp_path / "grandchild.pid", tmp_path / "grandchild.tmp"
    grandchild = (f"import os, time; open({str(partial)!r}, 'w').write(str(os.getpid())); "
                  f"os.rename({str(partial)!r}, {str(pid_file)!r}); time.sleep(60)")  # a fresh python: no hook
    source = ("import os, subprocess, sys, time\n"
              f"child = subprocess.Popen([sys.executable, '-c', {grandchild!r}])\n"
              f"while not os.path.exists({str(pid_file)!r}):\n    time.sleep(0.01)\n"
              + ("while True:\n    pass\n" if hang else ""))
    result = run_sandboxed(source, ["assert child.pid > 0"], timeout_s=1.5 if hang else 5.0, max_processes=1 << 20,
                           allow_processes=True)
    assert pid_file.exists(), "the grandchild was never started, so this test checks nothing"
    pid = int(pid_file.read_text())
    try:
        assert wait_dead(pid), f"grandchild {pid} outlived the sandbox"
    finally:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert (result.passed, result.error) == ((0, "timeout") if hang else (1, None))


# ---------------------------------------------------------------------------------------------- the audit hook
SPAWNS = {  # one process start -> the audit event the sandbox refuses it at
    "os.fork()": "os.fork",
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)', os.getcwd()])": "subprocess.Popen",
    "multiprocessing.Process(target=time.sleep, args=(30,)).start()": "os.fork",
}


@pytest.mark.parametrize("spawn", list(SPAWNS), ids=["os.fork", "subprocess", "multiprocessing"])
def test_sandbox_stops_fork_bombs(sandboxes: Path, spawn: str) -> None:
    """We run as root, whom RLIMIT_NPROC does not bind: the audit hook is what stops the bomb."""
    header = "import multiprocessing, os, subprocess, sys, time\n"
    expected = REFUSED + SPAWNS[spawn]
    # A single start first: should the guard ever break, this test must not turn into a fork bomb itself.
    assert run_sandboxed(header + spawn + "\n", ["assert True"], timeout_s=2.0).error == expected
    start = time.monotonic()
    bomb = run_sandboxed(header + f"while True:\n    {spawn}\n", ["assert True"], timeout_s=2.0)
    assert (bomb.passed, bomb.error) == (0, expected)  # refused at once: not a timeout
    assert time.monotonic() - start < 2.0
    assert live_processes_mentioning(str(sandboxes)) == []
    assert run_sandboxed(ADD, ["assert add(1, 2) == 3"], timeout_s=2.0).passed == 1  # the machine still works


def test_sandbox_refuses_every_way_to_start_a_process() -> None:
    """Each route tried once (a broken guard cannot bomb): the refusal names the audit event (or the replaced
    ``_posixsubprocess.fork_exec``, which multiprocessing's spawn and forkserver call unaudited)."""
    routes = {  # action -> what the refusal names
        "os.fork()": "os.fork", "os.forkpty()": "os.forkpty", "pty.fork()": "os.fork",
        "os.system('true')": "os.system", "os.popen('true')": "subprocess.Popen",
        "os.posix_spawn('/bin/true', ['true'], {})": "os.posix_spawn",
        "os.posix_spawnp('true', ['true'], {})": "os.posix_spawn",
        "os.execv('/bin/true', ['true'])": "os.exec", "os.spawnv(os.P_WAIT, '/bin/true', ['true'])": "os.fork",
        "subprocess.run(['true'])": "subprocess.Popen",
        "multiprocessing.get_context('spawn').Process(target=print).start()": "_posixsubprocess.fork_exec",
        "multiprocessing.get_context('forkserver').Process(target=print).start()": "_posixsubprocess.fork_exec",
        "concurrent.futures.ProcessPoolExecutor(1).submit(print).result()": "os.fork",
        "_posixsubprocess.fork_exec()": "_posixsubprocess.fork_exec",
        "sys.modules.pop('_posixsubprocess') and importlib.import_module('_posixsubprocess')":
            "importing _posixsubprocess",
    }
    source = "import _posixsubprocess, concurrent.futures, importlib, multiprocessing, os, pty, subprocess, sys\n" + PROBE
    tests = [f"assert refused(lambda: {action}) == 'the sandbox refuses {what}'" for action, what in routes.items()]
    result = run_sandboxed(source, tests, timeout_s=5.0)
    assert (result.passed, result.failures, result.error) == (len(routes), (), None)


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
              "    s.close()\n"
              "def via_dns():\n    socket.getaddrinfo('localhost', 80)\n")
    kinds = ("via_create", "via_socket", "via_raw", "via_dns")
    try:
        # Control: without the guard the server is reachable, so 'blocked' below is the guard's doing.
        assert run_trusted(source, [f"assert probe({k}) == 'open'" for k in kinds]).passed == 4
        result = run_sandboxed(source, [f"assert probe({k}) == 'blocked'" for k in kinds], timeout_s=3.0)
        assert (result.passed, result.error) == (4, None)
    finally:
        server.close()


def test_sandbox_refuses_writes_outside_its_directory(tmp_path: Path, sandboxes: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "kept.txt").write_text("original")
    before = snapshot(outside)
    attempts = [
        "open(OUT + '/new.txt', 'w')", "open(OUT + '/kept.txt', 'a')", "open(OUT + '/kept.txt', 'r+')",
        "open('../escape.txt', 'x')", "os.open(OUT + '/new.txt', os.O_WRONLY | os.O_CREAT)",
        "pathlib.Path(OUT, 'new.txt').write_text('x')", "shutil.copy('inside.txt', OUT)",
        "os.remove(OUT + '/kept.txt')", "os.rename(OUT + '/kept.txt', 'stolen.txt')",
        "os.replace('inside.txt', OUT + '/kept.txt')", "os.mkdir(OUT + '/new')", "os.rmdir(OUT + '/sub')",
        "shutil.rmtree(OUT + '/sub')", "os.truncate(OUT + '/kept.txt', 0)", "os.chmod(OUT + '/kept.txt', 0o777)",
        "os.utime(OUT + '/kept.txt', (0, 0))", "os.link(OUT + '/kept.txt', 'hard.txt')",
        "os.symlink(OUT + '/kept.txt', 'soft.txt') or open('soft.txt', 'w')",  # the link is inside, its target not
        "os.remove('kept.txt', dir_fd=os.open(OUT, os.O_RDONLY))",
    ]
    source = (f"import os, pathlib, shutil, tempfile\nOUT = {str(outside)!r}\n" + PROBE
              + "open('inside.txt', 'w').write('mine')\n"
              "def save(path):\n    open(path, 'w').write('x')\n    return True\n"
              "def work_inside():\n"
              "    os.mkdir('sub')\n"
              "    save('sub/data.txt')\n"
              "    os.rename('sub/data.txt', 'moved.txt')\n"
              "    shutil.rmtree('sub')\n"
              "    with tempfile.TemporaryFile() as f:\n"
              "        f.write(b'x')\n"
              "    return tempfile.gettempdir() == os.getcwd() and sorted(os.listdir())\n")
    tests = [f"assert refused(lambda: {a}).startswith('the sandbox refuses ')" for a in attempts]
    tests += ["assert work_inside() == ['inside.txt', 'moved.txt', 'soft.txt']",
              "assert open(os.devnull, 'w').write('x') == 1",
              f"assert save({str(outside / 'new.txt')!r})"]
    result = run_sandboxed(source, tests, timeout_s=5.0)
    assert (result.passed, result.failures, result.error) == (len(tests) - 1, ((len(tests) - 1, "PermissionError"),),
                                                              None), result
    top = run_sandboxed(f"open({str(outside / 'new.txt')!r}, 'w').write('x')\n", ["assert True"], timeout_s=2.0)
    assert (top.passed, top.error) == (0, REFUSED + f"open outside its directory: {str(outside / 'new.txt')!r}")
    assert snapshot(outside) == before  # nothing outside was created, changed or removed
    assert list(sandboxes.iterdir()) == []  # no '../escape.txt' either


def test_sandbox_files_stay_in_a_removed_temp_dir(sandboxes: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    tests = ["assert open('data.txt').read() == 'hello'", "assert sorted(os.listdir('.')) == ['data.txt']",
             "assert set(os.environ) - {'LC_CTYPE'} == {'PATH'}",
             f"assert os.path.dirname(os.getcwd()) == {str(sandboxes)!r}"]
    result = run_sandboxed("import os\nopen('data.txt', 'w').write('hello')\n", tests, timeout_s=2.0)
    assert (result.passed, result.error) == (4, None), result
    assert list(sandboxes.iterdir()) == []
