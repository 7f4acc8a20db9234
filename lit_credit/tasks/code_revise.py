"""Task ``code_revise``: TCPO's multi-turn code refinement.

The policy writes a small Python function; the verifier runs it against assert tests in a sandbox
(:func:`~lit_credit.tasks.sandbox.run_sandboxed`), scores the fraction that pass and, below 1, says how many
passed and which test failed first. With ``stop_on_success`` the episode stops at success or after
``max_turns`` turns; without it, it always runs ``max_turns`` turns, code that passes every test is answered
with the neutral ``"<n>/<n> tests passed."`` and the final turn decides (see :mod:`lit_credit.tasks.revise`).

Problems are synthetic: :data:`TEMPLATES` (12 kinds: add a constant, multiple-of, clamp, count a character,
reverse words, sum of the k largest, max with default, digit sum in base b, fizz, count greater, range sum,
shout), each with parameters, 4-5 asserts, a gold solution and a plausible bug (off-by-one, swapped operands,
a forgotten case) used for the revision demonstrations.
"""
from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import datasets

from lit_credit.tasks.base import Task, heldout_split
from lit_credit.tasks.revise import RevisionEnvironment, Verdict, check_stop_on_success
from lit_credit.tasks.sandbox import SandboxResult, run_sandboxed, run_trusted

INSTRUCTION = "Answer with only the code in a ```python block."
WORDS = ("apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "orbit", "maple", "ember", "quartz", "delta")


@dataclass(frozen=True)
class Problem:
    """One programming problem: the statement, a gold solution, a plausibly buggy one and the assert tests."""

    id: str
    entry_point: str
    statement: str
    solution: str
    bug: str
    tests: tuple[str, ...]

    def row(self) -> dict[str, Any]:
        """The dataset row: ``prompt``, ``tests``, ``entry_point``, ``solution``, ``id``."""
        return {"prompt": [{"role": "user", "content": f"{self.statement}\n\n{INSTRUCTION}"}],
                "tests": list(self.tests), "entry_point": self.entry_point, "solution": self.solution, "id": self.id}


def _fn(name: str, arg: str, body: str) -> str:
    return f"def {name}({arg}):\n" + "".join(f"    {line}\n" for line in body.splitlines())


def _asserts(name: str, cases: Iterable[tuple[tuple[Any, ...], Any]]) -> tuple[str, ...]:
    return tuple(f"assert {name}({', '.join(map(repr, args))}) == {want!r}" for args, want in cases)


# Each builder: (rng, *params) -> (statement, solution body, bug body, [(args, expected), ...]).
Built = tuple[str, str, str, list[tuple[tuple[Any, ...], Any]]]


def _add_k(rng: random.Random, k: int) -> Built:
    return (f"Write a Python function `add_k(x)` that returns x plus {k}.", f"return x + {k}", f"return x + {k - 1}",
            [((x,), x + k) for x in (0, 5, -3, rng.randint(10, 99))])


def _is_multiple(rng: random.Random, m: int) -> Built:
    return (f"Write a Python function `is_multiple(n)` that returns True when the integer n is a multiple of {m}, "
            f"else False.", f"return n % {m} == 0", f"return {m} % n == 0",
            [((m,), True), ((3 * m,), True), ((m + 1,), False), ((0,), True), ((1,), False)])


def _clamp(rng: random.Random, lo: int, hi: int) -> Built:
    return (f"Write a Python function `clamp(x)` that returns x limited to the range [{lo}, {hi}]: {lo} if x is "
            f"below {lo}, {hi} if x is above {hi}, else x.", f"return max({lo}, min({hi}, x))", f"return max({lo}, x)",
            [((x,), max(lo, min(hi, x))) for x in (lo - 5, lo, (lo + hi) // 2, hi, hi + rng.randint(1, 9))])


def _count_char(rng: random.Random, c: str) -> Built:
    f, g = rng.sample([x for x in "abcdefghijklmnopqrstuvwxyz" if x != c], 2)
    return (f"Write a Python function `count_char(s)` that returns how many times the character {c!r} occurs in "
            f"the string s (case-sensitive).", f"return s.count({c!r})", f"return int({c!r} in s)",
            [((s,), s.count(c)) for s in ("", c, f + c + c + g + c, c.upper() + c + f, f * 3)])


def _reverse_words(rng: random.Random, sep: str) -> Built:
    a, b, c, d = sorted(rng.sample(WORDS, 4))
    return (f"Write a Python function `reverse_words(s)` that splits the string s on {sep!r} and returns the pieces "
            f"in reverse order, joined by {sep!r}.", f"return {sep!r}.join(reversed(s.split({sep!r})))",
            f"return {sep!r}.join(sorted(s.split({sep!r}), reverse=True))",
            [((sep.join(w),), sep.join(reversed(w))) for w in ([a], [a, b], [b, c, a], [d, a, c, b])])


def _top_k_sum(rng: random.Random, k: int) -> Built:
    lists = [rng.sample(range(-20, 50), 8), [], rng.sample(range(-9, 9), max(1, k - 1)), rng.sample(range(100), 7)]
    return (f"Write a Python function `top_k_sum(xs)` that returns the sum of the {k} largest numbers in the list xs "
            f"(the sum of all of them if xs has fewer than {k}).", f"return sum(sorted(xs, reverse=True)[:{k}])",
            f"return sum(sorted(xs)[:{k}])", [((xs,), sum(sorted(xs, reverse=True)[:k])) for xs in lists])


def _max_or_default(rng: random.Random, d: int) -> Built:
    lists = [[3, 9, 2], [-50], [], rng.sample(range(-40, 40), 6)]
    return (f"Write a Python function `max_or_default(xs)` that returns the largest number in the list xs, or {d} "
            f"if xs is empty.", f"return max(xs) if xs else {d}", "return max(xs)",
            [((xs,), max(xs) if xs else d) for xs in lists])


def _digit_sum(rng: random.Random, b: int) -> Built:
    def digits(n: int) -> int:
        total = 0
        while n:
            n, r = divmod(n, b)
            total += r
        return total

    return (f"Write a Python function `digit_sum(n)` that returns the sum of the digits of the non-negative integer "
            f"n written in base {b}.", f"total = 0\nwhile n:\n    total += n % {b}\n    n //= {b}\nreturn total",
            "return sum(int(d) for d in str(n))",
            [((n,), digits(n)) for n in (0, b, b * b - 1, rng.randint(10, 999), rng.randint(1000, 99999))])


def _fizz(rng: random.Random, a: int, b: int) -> Built:
    def ref(n: int) -> str:
        return "FizzBuzz" if n % a == 0 and n % b == 0 else "Fizz" if n % a == 0 else "Buzz" if n % b == 0 else str(n)

    other = rng.choice([n for n in range(2, 100) if n % a and n % b])
    return (f"Write a Python function `fizz(n)` that returns 'FizzBuzz' if n is a multiple of both {a} and {b}, "
            f"'Fizz' if it is a multiple of {a} only, 'Buzz' if it is a multiple of {b} only, and str(n) otherwise.",
            f"if n % {a} == 0 and n % {b} == 0:\n    return 'FizzBuzz'\nif n % {a} == 0:\n    return 'Fizz'\n"
            f"if n % {b} == 0:\n    return 'Buzz'\nreturn str(n)",
            f"if n % {a} == 0:\n    return 'Fizz'\nif n % {b} == 0:\n    return 'Buzz'\n"
            f"if n % {a} == 0 and n % {b} == 0:\n    return 'FizzBuzz'\nreturn str(n)",
            [((n,), ref(n)) for n in (a, b, a * b, 1, other)])


def _count_greater(rng: random.Random, t: int) -> Built:
    lists = [[], [t], [t - 1, t, t + 1, t + 5], [rng.randint(t - 10, t + 10) for _ in range(6)]]
    return (f"Write a Python function `count_greater(xs)` that returns how many numbers in the list xs are strictly "
            f"greater than {t}.", f"return sum(1 for x in xs if x > {t})", f"return sum(1 for x in xs if x >= {t})",
            [((xs,), sum(x > t for x in xs)) for xs in lists])


def _sum_to(rng: random.Random, a: int) -> Built:
    return (f"Write a Python function `sum_to(n)` that returns the sum of the integers from {a} to n inclusive, "
            f"or 0 if n < {a}.", f"return sum(range({a}, n + 1))", f"return sum(range({a}, n))",
            [((n,), sum(range(a, n + 1))) for n in (a - 1, a, a + 3, a + rng.randint(5, 20))])


def _shout(rng: random.Random, k: int) -> Built:
    return (f"Write a Python function `shout(s)` that returns s in upper case followed by {k} exclamation marks.",
            f"return s.upper() + '!' * {k}", f"return s.capitalize() + '!' * {k}",
            [((s,), s.upper() + "!" * k) for s in ("hi", "", "Go team", rng.choice(WORDS))])


# name -> (argument, builder, every parameter tuple)
TEMPLATES: dict[str, tuple[str, Callable[..., Built], list[tuple[Any, ...]]]] = {
    "add_k": ("x", _add_k, [(k,) for k in range(1, 100)]),
    "is_multiple": ("n", _is_multiple, [(m,) for m in range(2, 51)]),
    "clamp": ("x", _clamp, [(lo, lo + w) for lo in range(-20, 21) for w in range(1, 16)]),
    "count_char": ("s", _count_char, [(c,) for c in "abcdefghijklmnopqrstuvwxyz"]),
    "reverse_words": ("s", _reverse_words, [(sep,) for sep in (" ", "-", "_", ",", "|", "/", ";", "+")]),
    "top_k_sum": ("xs", _top_k_sum, [(k,) for k in range(1, 7)]),
    "max_or_default": ("xs", _max_or_default, [(d,) for d in range(-30, 31)]),
    "digit_sum": ("n", _digit_sum, [(b,) for b in range(2, 10)]),
    "fizz": ("n", _fizz, [(a, b) for a in range(2, 10) for b in range(a + 1, 16) if b % a]),
    "count_greater": ("xs", _count_greater, [(t,) for t in range(-20, 31)]),
    "sum_to": ("n", _sum_to, [(a,) for a in range(-10, 21)]),
    "shout": ("s", _shout, [(k,) for k in range(1, 10)]),
}
SPACE = sum(len(params) for _, _, params in TEMPLATES.values())


def problem_id(name: str, params: Sequence[Any]) -> str:
    """``"<template>:<repr of each parameter>"``, e.g. ``"clamp:-3,5"``."""
    return f"{name}:{','.join(map(repr, params))}"


def make_problem(name: str, params: Sequence[Any]) -> Problem:
    """The problem of template ``name`` with ``params``; its random test inputs are seeded by its id alone."""
    arg, build, _ = TEMPLATES[name]
    pid = problem_id(name, params)
    statement, solution, bug, cases = build(random.Random(pid), *params)
    return Problem(pid, name, statement, _fn(name, arg, solution), _fn(name, arg, bug), _asserts(name, cases))


def content_key(row: dict[str, Any]) -> str:
    """A row's content key: its gold solution (the function's name, argument and body, which carry the
    template and every parameter), so two rows are one problem exactly when they ask for the same program.
    The statement's wording and the test inputs (seeded by the id) are not part of it."""
    return row["solution"]


def draw_problems(rng: random.Random) -> Iterator[Problem]:
    """Endless draws: a uniform template, then uniform parameters (repeats possible)."""
    names = sorted(TEMPLATES)
    while True:
        name = rng.choice(names)
        yield make_problem(name, rng.choice(TEMPLATES[name][2]))


_FENCE = re.compile(r"```([^\n`]*)\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(reply: str) -> str:
    """The code of a reply: the last ```python (or ```py / ```python3) fenced block, else the last fenced block
    of any language, else the whole reply stripped. An unclosed final fence (a truncated reply) runs to the end."""
    blocks = [(lang.strip().lower(), body) for lang, body in _FENCE.findall(reply)]
    python = [body for lang, body in blocks if lang in ("python", "py", "python3")]
    if python or blocks:
        return (python or [body for _, body in blocks])[-1]
    return reply.strip()


def code_feedback(result: SandboxResult, tests: Sequence[str]) -> str:
    """The verifier's message for a sandbox result, e.g. ``"2/4 tests passed. First failing test:
    `assert f(1) == 2` (raised TypeError). Fix the code."`` (the ``(raised ...)`` part only when the test did not
    simply fail its assert), ``"Your code timed out. Fix the code."``, or ``"4/4 tests passed."``."""
    error = result.error or ""
    if error == "syntax error":
        return "Your code has a syntax error. Fix the code."
    if error == "timeout":
        return "Your code timed out. Fix the code."
    if error == "crashed":
        return "Your code crashed. Fix the code."
    if error.startswith("exception: "):
        return f"Your code raised {error.removeprefix('exception: ')} Fix the code."
    text = f"{result.passed}/{result.total} tests passed."
    if result.failures:
        index, kind = result.failures[0]
        raised = "" if kind == "AssertionError" else f" (raised {kind})"
        text += f" First failing test: `{tests[index]}`{raised}."
    if error == "memory":
        text += " Your code ran out of memory."
    return text if result.total and result.passed == result.total else f"{text} Fix the code."


def code_verdict(row: dict[str, Any], reply: str, *, timeout_s: float = 2.0, memory_mb: int = 256) -> Verdict:
    """Run the reply's code (:func:`extract_code`) against ``row["tests"]`` in the sandbox: score = fraction of
    tests passed, feedback = :func:`code_feedback`."""
    tests = list(row["tests"])
    result = run_sandboxed(extract_code(reply), tests, timeout_s=timeout_s, memory_mb=memory_mb)
    return Verdict(result.score, code_feedback(result, tests))


def gold_reply(source: str) -> str:
    """An assistant turn that answers with ``source`` as instructed: one ```python block."""
    return f"```python\n{source}```"


class CodeReviseTask(Task):
    """Small Python functions written over up to ``max_turns`` turns against a sandboxed test verifier.

    Problems come from :data:`TEMPLATES` (:data:`SPACE` distinct ones); train and test are disjoint in content
    (:func:`content_key`, the gold program: :func:`~lit_credit.tasks.base.heldout_split`) and deterministic in
    ``seed``. Rows: ``prompt``, ``tests`` (assert statements), ``entry_point``, ``solution``,
    ``id``. Each verification runs one subprocess limited to ``timeout_s`` seconds and ``memory_mb`` MiB.

    Demonstrations (never on test problems): a share ``revise_frac`` (when ``max_turns > 1``) first answers
    with the template's bug, sees exactly the feedback the environment gives that code, then answers right.
    Without ``stop_on_success`` every demonstration then runs to ``max_turns`` turns: the verifier's
    all-passed message, then the same right code again (a kept answer).
    """

    name = "code_revise"

    def __init__(self, num_train: int = 500, num_test: int = 50, max_turns: int = 3, timeout_s: float = 2.0,
                 memory_mb: int = 256, seed: int = 0, revise_frac: float = 0.3,
                 stop_on_success: bool = True) -> None:
        if num_train < 1 or num_test < 1 or num_train + num_test > SPACE:
            raise ValueError(f"task.num_train={num_train}, task.num_test={num_test}: both must be >= 1 and their sum "
                             f"at most the {SPACE} distinct problems; lower the counts")
        if max_turns < 1:
            raise ValueError(f"task.max_turns={max_turns}: must be >= 1")
        if timeout_s <= 0:
            raise ValueError(f"task.timeout_s={timeout_s}: must be > 0")
        if memory_mb < 64:
            raise ValueError(f"task.memory_mb={memory_mb}: must be >= 64 (the interpreter alone needs ~30 MiB)")
        if not 0.0 <= revise_frac <= 1.0:
            raise ValueError(f"task.revise_frac={revise_frac}: must be in [0, 1]")
        self.num_train, self.num_test, self.max_turns = num_train, num_test, max_turns
        self.timeout_s, self.memory_mb, self.seed, self.revise_frac = timeout_s, memory_mb, seed, revise_frac
        # a plain attribute, so part of the embedded policy's cache key: it changes the demonstrations
        self.stop_on_success = check_stop_on_success(stop_on_success)
        self._splits: dict[str, datasets.Dataset] = {}

    def dataset(self, split: str) -> datasets.Dataset:
        if split not in ("train", "test"):
            raise ValueError(f"split={split!r}: use 'train' or 'test'")
        if not self._splits:
            # every problem has a positive chance and the counts fit SPACE (checked above): no miss budget
            rows = (p.row() for p in draw_problems(random.Random(self.seed)))
            splits = heldout_split(rows, content_key, self.num_train, self.num_test, fix="lower the counts",
                                   distinct=content_key, max_misses=math.inf)
            self._splits = {k: datasets.Dataset.from_list(v) for k, v in splits.items()}
        return self._splits[split]

    def environment(self) -> RevisionEnvironment:
        verifier = partial(code_verdict, timeout_s=self.timeout_s, memory_mb=self.memory_mb)
        return RevisionEnvironment(verifier, max_turns=self.max_turns, stop_on_success=self.stop_on_success)

    def demonstrations(self, num: int, seed: int) -> Iterable[dict[str, Any]]:
        held_out = {content_key(row) for row in self.dataset("test")}
        rng, made = random.Random(f"demo:{self.seed}:{seed}"), 0
        for problem in draw_problems(random.Random(f"demo-rows:{self.seed}:{seed}")):
            if made == num:
                return
            if problem.solution in held_out:  # content_key(problem.row())
                continue
            messages = list(problem.row()["prompt"])
            if self.max_turns > 1 and rng.random() < self.revise_frac:
                feedback = code_feedback(run_trusted(problem.bug, problem.tests), problem.tests)
                messages += [{"role": "assistant", "content": gold_reply(problem.bug)},
                             {"role": "user", "content": feedback}]
            right = {"role": "assistant", "content": gold_reply(problem.solution)}
            messages.append(right)
            if not self.stop_on_success:  # kept to max_turns turns after the environment's all-passed message
                passed = {"role": "user", "content": code_feedback(run_trusted(problem.solution, problem.tests),
                                                                   problem.tests)}
                messages += [passed, right] * (self.max_turns - sum(m["role"] == "assistant" for m in messages))
            yield {"messages": messages}
            made += 1
