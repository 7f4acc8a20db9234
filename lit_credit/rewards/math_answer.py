"""Final-answer checking for math tasks (MATH / MATH-500 style) with the ``math-verify`` library.

* :func:`extract_answer` pulls the final answer out of a model reply (last ``\\boxed{}``, else "Answer: ...",
  else the last number).
* :func:`answers_match` decides whether a predicted answer is mathematically equivalent to the gold answer
  (a cheap normalised-string check first, then ``math_verify.parse`` + ``math_verify.verify``).
* :func:`math_score` is the 0/1 reward built from the two.
* :func:`load_math_jsonl` reads a local MATH-500-style JSONL file into chat-prompt rows.

Timeouts: math-verify guards parsing and comparison with ``signal.alarm``, which only works in the main
thread and, in a training process, is a wall-clock alarm: on a starved CPU it fired on ``$35$`` and a stray
SIGALRM ended the run. So :func:`answers_match` runs math-verify without timeouts by default
(``parsing_timeout=None``, ``timeout_seconds=None``); ``timeout_seconds=N`` turns them on in the main thread only.
Hangs on pathological answers (e.g. ``10^{10^{10^{10}}}``) are prevented instead by rejecting predictions that
look expensive for sympy (scored as not matching) before math-verify is called, in every thread, and plain
numbers never reach sympy.
"""
from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

__all__ = ["BOXED_INSTRUCTION", "answers_match", "extract_answer", "load_math_jsonl", "math_score"]

BOXED_INSTRUCTION = "Put the final answer in \\boxed{}."
"""The instruction line :func:`load_math_jsonl` appends to every problem."""

_BOXED_START = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.DOTALL)  # an escape pair (skipped) or a brace
_ANSWER_CUE = re.compile(r"answer\s*:|answer\s+is", re.IGNORECASE)
# A number: optional sign (not a hyphen glued to a word, e.g. "x-3"), integer or decimal, optional "/denominator".
_NUMBER = re.compile(r"(?:(?<![\w)\]}])-)?(?<![\d.])(?:\d+(?:\.\d+)?|\.\d+)(?:/\d+(?:\.\d+)?)?")

_EXTRACTION_CONFIG = (LatexExtractionConfig(), ExprExtractionConfig())
_PLAIN_NUMBER = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)")
_MAX_PRED_CHARS = 1000
_BIG_EXPONENT = re.compile(r"(?:\^|\*\*)\s*\{?\s*\d{4,}")  # x^{1000}, 9^{99999}: sympy can take minutes
_BIG_FACTORIAL = re.compile(r"\d{5,}\s*\}?\s*!")  # 1000000!: sympy evaluates it eagerly
_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")
_UNESCAPED_PERCENT = re.compile(r"(?<!\\)%")


def _balanced_group(text: str, open_idx: int) -> str | None:
    """Content of the brace group whose ``{`` is at ``open_idx``; None when it is never closed.

    A backslash escapes the next character, so ``\\{`` / ``\\}`` are literal braces, not group delimiters."""
    depth, i = 0, open_idx
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[open_idx + 1:i]
        i += 1
    return None


def _brace_pairs(text: str) -> dict[int, int]:
    """Index of every ``{`` -> index of its matching ``}`` (unclosed ones absent), in one pass, with
    :func:`_balanced_group`'s rules (a backslash escapes the next character)."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for token in _BRACE_TOKEN.finditer(text):
        if token.group() == "{":
            stack.append(token.start())
        elif token.group() == "}" and stack:
            pairs[stack.pop()] = token.start()
    return pairs


def _last_boxed(text: str) -> str | None:
    """Content of the last complete, non-empty ``\\boxed{...}`` / ``\\fbox{...}``; None when there is none.

    Linear in ``len(text)``: the braces are matched once (:func:`_brace_pairs`), not rescanned from each
    ``\\boxed{`` (a truncated reply of 10k unclosed ``\\boxed{`` took ~40 s that way)."""
    starts = list(_BOXED_START.finditer(text))
    pairs = _brace_pairs(text) if starts else {}
    for match in reversed(starts):
        close = pairs.get(match.end() - 1)
        if close is not None and text[match.end():close].strip():
            return text[match.end():close].strip()
    return None


def _after_answer_cue(text: str) -> str | None:
    """Text after the last "Answer:" / "answer is" up to the end of its line, trimmed; None when absent or empty."""
    cues = list(_ANSWER_CUE.finditer(text))
    if not cues:
        return None
    rest = text[cues[-1].end():].split("\n", 1)[0]
    rest = rest.strip().lstrip(":").strip().strip("*").strip()  # "**Answer:** 42", "the answer is: 42"
    rest = rest.rstrip(".").strip()
    return rest or None


def extract_answer(text: str) -> str | None:
    """The final answer written in a model reply, as a string; None when the reply has none.

    In order of preference:

    1. the content of the last complete, non-empty ``\\boxed{...}`` or ``\\fbox{...}`` (nested braces kept, e.g.
       ``\\boxed{\\frac{1}{2}}`` -> ``\\frac{1}{2}``; an unclosed trailing ``\\boxed{`` is ignored);
    2. the text after the last "Answer:" or "answer is" (case-insensitive) up to the end of that line, with
       surrounding spaces, a leading ``:``, markdown ``**`` and trailing periods stripped;
    3. the last number in the text: integer, decimal, negative or a fraction such as ``3/4``.

    Never raises: a non-string or any internal error gives None.
    """
    try:
        if not isinstance(text, str) or not text:
            return None
        for finder in (_last_boxed, _after_answer_cue):
            found = finder(text)
            if found is not None:
                return found
        numbers = _NUMBER.findall(text)
        return numbers[-1] if numbers else None
    except Exception:
        return None


def _normalise(answer: str) -> str:
    """The fast-path form: no whitespace, ``$``, ``\\left``/``\\right``, ``\\!``/``\\,``; ``\\dfrac`` -> ``\\frac``;
    a trailing ``.0`` (``2.0`` -> ``2``) dropped."""
    s = re.sub(r"\\left(?![A-Za-z])|\\right(?![A-Za-z])|\\[!,;:]", "", answer)
    s = re.sub(r"\\[dt]frac(?![A-Za-z])", r"\\frac", s)
    s = re.sub(r"\s+", "", s).replace("$", "")
    return re.sub(r"(?<=\d)\.0+$", "", s)


def _too_expensive(pred: str) -> bool:
    """Whether sympy may take very long on ``pred``: very long text, a numeric exponent tower (``10^{10^{10}}``;
    a letter in the exponent, as in ``e^{x^2}``, is fine), an exponent with 4+ digits (``x^{1000}``), or the
    factorial of a 5+ digit number."""
    if len(pred) > _MAX_PRED_CHARS or _BIG_EXPONENT.search(pred) or _BIG_FACTORIAL.search(pred):
        return True
    for match in re.finditer(r"\^\s*\{", pred):
        exponent = _balanced_group(pred, match.end() - 1)
        if exponent is None:
            return True
        if ("^" in exponent or "**" in exponent) and not re.search(r"[A-Za-z]", re.sub(r"\\[A-Za-z]+", "", exponent)):
            return True
    return False


def _to_math_verify_input(answer: str) -> str:
    """``answer`` as one ``$...$`` LaTeX expression: inner ``$`` dropped, newlines to spaces, ``%`` -> ``\\%``
    (a bare ``%`` is a LaTeX comment and parses differently from ``\\%``)."""
    body = _UNESCAPED_DOLLAR.sub("", answer).replace("\n", " ").strip()
    return "$" + _UNESCAPED_PERCENT.sub(r"\\%", body) + "$"


def _parse(answer: str, timeout: int | None) -> list[Any]:
    """math-verify's parse of a bare answer (``$...$`` first, ``\\boxed{...}`` when that finds nothing)."""
    wrapped = _to_math_verify_input(answer)
    for candidate in (wrapped, "\\boxed{" + wrapped[1:-1] + "}"):
        parsed = parse(candidate, extraction_config=_EXTRACTION_CONFIG, parsing_timeout=timeout, raise_on_error=False)
        if parsed:
            return parsed
    return []


@contextmanager
def _keep_outer_alarm(active: bool) -> Iterator[None]:
    """Re-arm a ``SIGALRM`` timer set by someone else (e.g. pytest-timeout) after math-verify's ``signal.alarm``
    calls, which cancel it. No-op when ``active`` is false (no math-verify timeouts in use)."""
    if not active:
        yield
        return
    remaining, interval = signal.getitimer(signal.ITIMER_REAL)
    start = time.monotonic()
    try:
        yield
    finally:
        if remaining > 0:
            signal.setitimer(signal.ITIMER_REAL, max(remaining - (time.monotonic() - start), 1e-3), interval)


def answers_match(pred: str | None, gold: str, timeout_seconds: int | None = None) -> bool:
    """Whether the predicted answer ``pred`` is mathematically equivalent to the gold answer ``gold``.

    Both are bare answers (LaTeX or plain expressions such as ``\\frac{1}{2}``, ``0.5``, ``1/2``, ``x+1``), not
    whole replies; use :func:`extract_answer` first on a reply.

    1. Fast path: True when both normalised strings are equal (whitespace, ``$``, ``\\left``/``\\right``, ``\\!``
       removed, ``\\dfrac`` read as ``\\frac``, a trailing ``.0`` dropped), without calling math-verify.
    2. Both plain decimal numbers: compared as floats to 6 decimal places, without sympy (the common case of
       integer answers, and a large share of the verifier's cost otherwise).
    3. Otherwise both are wrapped as ``$...$`` and parsed with ``math_verify.parse`` (LaTeX and plain-expression
       extraction), then compared with ``math_verify.verify(gold, pred)`` (gold first: math-verify's comparison is
       not symmetric). Numbers compare to 6 decimal places (``\\frac{1}{3}`` matches ``0.333333``).

    False when ``pred`` is None or empty, ``gold`` is empty, ``pred`` looks too expensive for sympy (see the module
    docstring), or on any error: never raises.

    ``timeout_seconds`` bounds each math-verify parse/compare step, but only in the main thread (math-verify uses
    ``signal.alarm``; a ``SIGALRM`` timer set by the caller is re-armed afterwards with its remaining time); in
    other threads math-verify runs without timeouts. None disables them everywhere.
    """
    try:
        if not isinstance(pred, str) or not isinstance(gold, str):
            return False
        norm_pred, norm_gold = _normalise(pred), _normalise(gold)
        if not norm_pred or not norm_gold:
            return False
        if norm_pred == norm_gold:
            return True
        if _PLAIN_NUMBER.fullmatch(norm_pred) and _PLAIN_NUMBER.fullmatch(norm_gold):
            return round(float(norm_pred), 6) == round(float(norm_gold), 6)  # what math-verify does, sans sympy
        if _too_expensive(pred):
            return False
        timeout = timeout_seconds if threading.current_thread() is threading.main_thread() else None
        with _keep_outer_alarm(timeout is not None and timeout > 0):
            gold_parsed, pred_parsed = _parse(gold, timeout), _parse(pred, timeout)
            if not gold_parsed or not pred_parsed:
                return False
            return bool(verify(gold_parsed, pred_parsed, timeout_seconds=timeout, raise_on_error=False))
    except Exception:
        return False


def math_score(reply: str, gold: str) -> float:
    """1.0 when the answer extracted from ``reply`` (:func:`extract_answer`) matches ``gold`` (:func:`answers_match`),
    else 0.0."""
    return 1.0 if answers_match(extract_answer(reply), gold) else 0.0


def _field_error(path: Path, lineno: int, problem: str) -> ValueError:
    return ValueError(
        f"{path}, line {lineno}: {problem}. Each non-blank line must be one JSON object with at least a non-empty "
        f'"problem" and an "answer", e.g. {{"problem": "What is 1+1?", "answer": "2"}}; fix or delete that line.'
    )


def load_math_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rows of a local MATH-500-style JSONL file, ready to be chat prompts (never downloads anything).

    Each non-blank line is a JSON object with ``problem`` (non-empty string) and ``answer`` (any JSON scalar,
    kept as ``str(answer)``); ``unique_id``, ``level`` and ``subject`` are optional, ``solution`` and other keys are
    ignored. Each row is::

        {"prompt": [{"role": "user", "content": problem + "\\n\\n" + BOXED_INSTRUCTION}],
         "answer": str, "id": str, "level": str, "subject": str}

    ``id`` is ``unique_id`` when given, else ``"<file stem>-<line number>"`` (1-based physical line number);
    ``level``/``subject`` are ``str(value)`` or ``""`` when absent, so every row has the same keys and types.
    Blank lines are skipped; an empty file gives ``[]``.

    Raises FileNotFoundError when ``path`` is not an existing file, and ValueError (naming the file, the line
    number and the problem) for a line that is not a JSON object or lacks ``problem``/``answer``.
    """
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(
            f"MATH JSONL file not found: {file} (a local .jsonl path is required; nothing is downloaded)"
        )
    rows: list[dict[str, Any]] = []
    with file.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise _field_error(file, lineno, f"malformed JSON ({err.msg} at column {err.colno})") from None
            if not isinstance(record, dict):
                raise _field_error(file, lineno, f"expected a JSON object, got {type(record).__name__}")
            for field in ("problem", "answer"):
                if record.get(field) is None:
                    raise _field_error(file, lineno, f'missing required field "{field}"')
            problem = record["problem"]
            if not isinstance(problem, str) or not problem.strip():
                raise _field_error(file, lineno, 'field "problem" must be a non-empty string')
            answer = record["answer"]
            if isinstance(answer, (dict, list)):
                raise _field_error(file, lineno, 'field "answer" must be a string or a number')
            unique_id = record.get("unique_id")
            rows.append({
                "prompt": [{"role": "user", "content": f"{problem.rstrip()}\n\n{BOXED_INSTRUCTION}"}],
                "answer": str(answer).strip(),
                "id": str(unique_id) if unique_id is not None else f"{file.stem}-{lineno}",
                "level": "" if record.get("level") is None else str(record["level"]),
                "subject": "" if record.get("subject") is None else str(record["subject"]),
            })
    return rows
