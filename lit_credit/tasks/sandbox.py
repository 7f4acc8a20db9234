"""Run untrusted candidate code against assert tests in a throwaway subprocess (the ``code_revise`` verifier).

:func:`run_sandboxed` starts one fresh ``python -I`` per call, in a temporary directory that is deleted
afterwards, with resource limits (address space, CPU time, processes, file size, open files, no core dumps),
a minimal environment (``PATH`` only), stdin from ``/dev/null`` and its own session, so that on a timeout the
whole process group (grandchildren included) is killed. Before it runs any candidate code, the child installs
an audit hook (:pep:`578`, which Python code cannot remove) that raises ``PermissionError`` on sockets and DNS
look-ups, on starting processes (``os.fork``, ``subprocess``, ``multiprocessing``, ``os.exec*``, ...: the one
guard against fork bombs that also holds for root, whom RLIMIT_NPROC does not bind) and on file-system writes
outside the temporary directory.

This is a best-effort guard against accidents and reward hacking by a small policy, NOT a security boundary:
there is no kernel-level isolation (no namespaces, seccomp or cgroups). The hook sees only what Python audits:
``ctypes`` (or any C extension) calls libc directly and sidesteps it; ``os.mkfifo``, ``os.mknod`` and signals
to other processes are not audited; reads are never refused, and a descriptor opened outside the directory
(for reading) can still serve as ``dir_fd`` of ``os.open`` or with ``os.fchmod``; monkeypatching the modules
the hook relies on (``posixpath``, ``os``) can fool its path checks; and a process started past the hook can
leave the process group with ``setsid()``. Run truly hostile code in a container.
"""
from __future__ import annotations

import inspect
import json
import math
import os
import resource
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

OUTPUT_LIMIT = 64 * 1024  # bytes of the child's result stream the parent reads (from the end)
FILE_LIMIT_MB = 4  # RLIMIT_FSIZE: largest file the child may write


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one sandboxed run.

    ``passed`` of ``total`` tests held. ``error``: ``None``, ``"syntax error"``, ``"timeout"``, ``"memory"``
    (a ``MemoryError`` in the source or a test), ``"crashed"`` (the child died without reporting, e.g. a
    signal or ``os._exit``) or ``"exception: <Type>: <message>"`` (the source itself raised while being
    defined; no test ran). ``failures``: ``(test index, exception type name)`` for each failing test that ran,
    in order (``AssertionError`` when the assert was false).
    """

    passed: int
    total: int
    error: str | None = None
    failures: tuple[tuple[int, str], ...] = ()

    @property
    def score(self) -> float:
        """``passed / total``; 0 when there are no tests."""
        return self.passed / self.total if self.total else 0.0


# ---------------------------------------------------------------------------------------------- child side
# The three functions below run inside the child: the runner script is their source (inspect.getsource), so
# they must only use builtins and what they import themselves. ``_check`` is also used in-process by
# :func:`run_trusted`.

def _check(source: str, tests: list) -> dict:
    """Exec ``source`` in a fresh namespace, then each test in that namespace; a JSON-able outcome dict."""
    try:
        code = compile(source, "<solution>", "exec")
    except (SyntaxError, ValueError):  # ValueError: null bytes, unencodable characters
        return {"passed": 0, "failures": [], "error": "syntax error"}
    namespace = {"__name__": "__solution__"}
    try:
        exec(code, namespace)
    except MemoryError:
        return {"passed": 0, "failures": [], "error": "memory"}
    except BaseException as err:  # SystemExit and friends included: the candidate never ends the check
        return {"passed": 0, "failures": [], "error": f"exception: {type(err).__name__[:80]}: {err}"[:300]}
    passed, failures, error = 0, [], None
    for index, test in enumerate(tests):
        try:
            exec(compile(test, f"<test {index}>", "exec"), namespace)
            passed += 1
        except MemoryError:
            failures.append([index, "MemoryError"])
            error = "memory"
        except BaseException as err:
            failures.append([index, type(err).__name__[:80]])
    return {"passed": passed, "failures": failures, "error": error}


def _install_guard(allow_processes: bool) -> None:
    """Install an audit hook (PEP 578; the candidate cannot remove it) that raises ``PermissionError`` on sockets
    and DNS look-ups, on process creation unless ``allow_processes``, and on file-system writes whose path
    resolves (symlinks and ``dir_fd`` included) outside the current directory. Best-effort, in-process only."""
    import os
    import sys

    realpath, fsdecode, join = os.path.realpath, os.fsdecode, os.path.join  # bound before any monkeypatching
    root = realpath(os.getcwd())
    refused = {"socket.__new__", "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr",
               "socket.getnameinfo"}
    if not allow_processes:
        refused |= {"os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn", "os.system", "os.startfile",
                    "subprocess.Popen", "_posixsubprocess"}  # as an "import": its fork_exec is replaced below
    # write events -> (index of a path argument, index of its dir_fd argument or None) for each path they touch
    writes = {"open": ((0, None),), "os.truncate": ((0, None),), "os.remove": ((0, 1),), "os.rmdir": ((0, 1),),
              "os.mkdir": ((0, 2),), "os.rename": ((0, 2), (1, 3)), "os.link": ((0, 2), (1, 3)),
              "os.symlink": ((1, 2),), "os.chmod": ((0, 2),), "os.chown": ((0, 3),), "os.utime": ((0, 3),),
              "os.setxattr": ((0, None),), "os.removexattr": ((0, None),), "shutil.rmtree": ((0, 1),)}
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC

    def refuse(what: str) -> None:
        raise PermissionError(f"the sandbox refuses {what}")

    def inside(path, dir_fd) -> bool:
        if isinstance(path, int):  # an already open descriptor
            return True
        path = fsdecode(path)
        if isinstance(dir_fd, int) and dir_fd >= 0:
            path = join(f"/proc/self/fd/{dir_fd}", path)  # ignored when path is absolute
        real = realpath(path)
        return real in (root, "/dev/null") or real.startswith(root + "/")

    def hook(event: str, args: tuple) -> None:
        if event in refused or (event == "import" and args[0] in refused):
            refuse(event if event != "import" else f"importing {args[0]}")
        rule = writes.get(event)
        if rule and (event != "open" or args[2] & write_flags):
            for at, dir_at in rule:
                if not inside(args[at], None if dir_at is None else args[dir_at]):
                    refuse(f"{event} outside its directory: {args[at]!r}")

    if not allow_processes:  # multiprocessing's spawn and forkserver start methods call it without an audit event
        import _posixsubprocess

        def fork_exec(*args):
            refuse("_posixsubprocess.fork_exec")

        _posixsubprocess.fork_exec = fork_exec
    sys.addaudithook(hook)


def _child_main() -> None:
    """Read and delete the payload, point fds 1 and 2 at /dev/null (the candidate's prints go nowhere), install
    the guard, run :func:`_check`, and write ``<nonce> <json>`` on a private duplicate of the original stdout."""
    import json
    import os
    import signal
    import sys

    path = sys.argv[1]
    with open(path, encoding="utf-8") as f:
        payload = json.load(f)
    os.remove(path)
    nonce = payload.pop("nonce")
    out = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversized writes fail with OSError instead of killing us
    write, dumps, exit_now = os.write, json.dumps, os._exit  # bound before the candidate can monkeypatch them
    _install_guard(payload["allow_processes"])
    outcome = _check(payload["source"], payload["tests"])
    write(out, (nonce + " " + dumps(outcome) + "\n").encode())
    exit_now(0)  # skip atexit handlers and lingering threads of the candidate


_RUNNER = "from __future__ import annotations\n" + "\n\n".join(
    inspect.getsource(f) for f in (_check, _install_guard, _child_main)) + "\n\n_child_main()\n"


# --------------------------------------------------------------------------------------------- parent side
def _set_limits(limits: tuple[tuple[int, int, int], ...]) -> None:
    """``preexec_fn``: apply precomputed ``(resource, soft, hard)`` limits in the forked child before exec."""
    for which, soft, hard in limits:
        resource.setrlimit(which, (soft, hard))


def _within_hard(which: int, soft: int, hard: int) -> tuple[int, int]:
    """``(soft, hard)`` lowered to this process's hard limit, which an unprivileged child cannot exceed."""
    ceiling = resource.getrlimit(which)[1]
    return (soft, hard) if ceiling == resource.RLIM_INFINITY else (min(soft, ceiling), min(hard, ceiling))


def _wait_unreaped(pid: int, timeout_s: float) -> bool:
    """Wait until ``pid`` exits without reaping it (its pid, hence its process group id, stays reserved so a
    later ``killpg`` cannot hit an unrelated group); False when ``timeout_s`` passes first."""
    deadline, delay = time.monotonic() + timeout_s, 0.001
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:  # already reaped elsewhere
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(2 * delay, 0.02)


def _outcome(raw: bytes, nonce: str, total: int) -> SandboxResult | None:
    """The result line ``<nonce> <json>`` (the last one carrying the nonce) as a SandboxResult; None when
    absent or malformed."""
    prefix = nonce.encode() + b" "
    line = next((ln for ln in reversed(raw.splitlines()) if ln.startswith(prefix)), None)
    if line is None:
        return None
    try:
        data = json.loads(line[len(prefix):])
        passed, error = int(data["passed"]), data["error"]
        failures = tuple((int(i), str(kind)) for i, kind in data["failures"])
    except (ValueError, TypeError, KeyError):
        return None
    if not 0 <= passed <= total or not (error is None or isinstance(error, str)):
        return None
    return SandboxResult(passed, total, error, failures)


def run_sandboxed(source: str, tests: Sequence[str], *, timeout_s: float = 2.0, memory_mb: int = 256,
                  max_processes: int = 32, allow_processes: bool = False) -> SandboxResult:
    """Run ``source`` and then each test (one Python statement, typically ``assert f(2) == 5``) in one fresh,
    resource-limited ``python -I`` subprocess; count the tests that pass.

    Limits: wall clock ``timeout_s`` (then the whole process group is SIGKILLed: ``error="timeout"``, 0 passed),
    RLIMIT_CPU ``ceil(timeout_s) + 1`` s, RLIMIT_AS ``memory_mb`` MiB, RLIMIT_NPROC ``max_processes`` (Linux
    counts all processes and threads of the user, so for a busy user this forbids forking; root is exempt),
    RLIMIT_FSIZE :data:`FILE_LIMIT_MB` MiB, 64 open files, no core dumps. The working directory is a fresh
    temporary directory, removed afterwards; the environment holds only ``PATH``. Process-group members left
    behind by a run that exits normally are killed too.

    Refused in the child, with ``PermissionError("the sandbox refuses <what>")`` (so a refusal in the source
    gives ``error="exception: PermissionError: the sandbox refuses <what>"``, one in a test a failure of type
    ``PermissionError``): sockets and DNS look-ups; starting processes unless ``allow_processes`` (then only
    RLIMIT_NPROC caps them); opening for writing, creating, removing, renaming, linking, truncating or changing
    the metadata of a path that resolves outside the working directory (``/dev/null`` excepted).

    Whatever the candidate prints is discarded; the child reports on a duplicated stdout, tagged with a random
    nonce, and only the last tagged line counts, so printed fake results do not change the count.
    Bad candidate code never raises here; only a failure to start the interpreter does.
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s={timeout_s}: must be > 0")
    if memory_mb < 64:
        raise ValueError(f"memory_mb={memory_mb}: must be >= 64 (the interpreter alone needs ~30 MiB)")
    tests = [str(t) for t in tests]
    cpu = math.ceil(timeout_s) + 1
    wanted = ((resource.RLIMIT_AS, memory_mb << 20, memory_mb << 20), (resource.RLIMIT_CPU, cpu, cpu + 1),
              (resource.RLIMIT_NPROC, max_processes, max_processes),
              (resource.RLIMIT_FSIZE, FILE_LIMIT_MB << 20, FILE_LIMIT_MB << 20),
              (resource.RLIMIT_NOFILE, 64, 64), (resource.RLIMIT_CORE, 0, 0))
    limits = tuple((which, *_within_hard(which, soft, hard)) for which, soft, hard in wanted)
    nonce = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="lit-credit-sandbox-") as work, tempfile.TemporaryFile() as out:
        payload = os.path.join(work, ".payload.json")
        with open(payload, "w", encoding="utf-8") as f:
            json.dump({"nonce": nonce, "source": source, "tests": tests, "allow_processes": allow_processes}, f)
        proc = subprocess.Popen([sys.executable, "-I", "-c", _RUNNER, payload], cwd=work,
                                env={"PATH": os.environ.get("PATH", os.defpath)}, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=lambda: _set_limits(limits))
        try:
            finished = _wait_unreaped(proc.pid, timeout_s)
        finally:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if not finished or proc.returncode == -signal.SIGXCPU:
            return SandboxResult(0, len(tests), "timeout")
        out.seek(max(0, out.seek(0, os.SEEK_END) - OUTPUT_LIMIT))
        result = _outcome(out.read(OUTPUT_LIMIT), nonce, len(tests))
    return result if result is not None else SandboxResult(0, len(tests), "crashed")


def run_trusted(source: str, tests: Sequence[str]) -> SandboxResult:
    """The same check as :func:`run_sandboxed`, in this process, with NO isolation, limits or timeout: only for
    code this repository wrote (gold solutions, template bugs), e.g. to render demonstration feedback cheaply.
    For terminating code its result equals the sandbox's."""
    outcome: dict[str, Any] = _check(source, [str(t) for t in tests])
    failures = tuple((int(i), str(kind)) for i, kind in outcome["failures"])
    return SandboxResult(outcome["passed"], len(tests), outcome["error"], failures)
