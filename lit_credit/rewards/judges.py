"""Summary judges for SLCA-GRPO's HierR summary reward (docs/methods.md §1).

A judge rates the final reply of a tool-using rollout 1..5 (very poor, poor, acceptable, good, excellent)
and maps the rating ``s`` to ``score = (s - 1) / 4`` in [0, 1]. Guards, shared by every backend
(:class:`SummaryJudge`): no tool response (none, or all blank), or a reply shorter than 10 characters after
trimming, scores 0 without asking the backend; a backend failure (an exception or no parsable rating) scores
0, sets ``failed`` and increments ``judge.failures``.

Noise (the misattribution setting): with ``noise = p > 0``, each rating the backend produced is replaced,
with probability p, by a uniform rating in 1..5. The draws come from the judge's own
``random.Random(seed)`` (one ``random()`` per rated reply, plus one ``randint`` when it fires), so a run is
reproducible and independent of the global RNG.

Backends: :class:`RubricJudge` (deterministic, CPU, the default) and :class:`LLMJudge` (any text generator).
"""
from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lit_credit.backends import BackendFailure, NotRetried, Retry

MIN_REPLY_CHARS = 10


@dataclass(frozen=True)
class JudgeResult:
    """``score = (rating - 1) / 4`` in [0, 1]; ``rating`` in 1..5, or None when none was produced.

    ``failed`` is True only for a backend failure; ``reason`` is ``"ok"``, ``"no_tool_response"``,
    ``"short_reply"``, ``"judge_failed"`` (optionally with detail after a colon), or ``"ok:noise"``.
    """

    score: float
    rating: int | None
    failed: bool
    reason: str


class SummaryJudge:
    """Base judge: applies the guards and the noise; subclasses implement :meth:`rate`."""

    def __init__(self, noise: float = 0.0, seed: int = 0):
        if not 0.0 <= noise <= 1.0:
            raise ValueError(f"noise must be in [0, 1], got {noise}")
        self.noise = noise
        self._rng = random.Random(seed)
        self.failures = 0

    def rate(self, question: str, tool_responses: list[str], reply: str) -> int | None:
        """The backend's rating 1..5, or None on failure."""
        raise NotImplementedError

    def __call__(self, question: str, tool_responses: Sequence[str], reply: str) -> JudgeResult:
        responses = [r if isinstance(r, str) else json.dumps(r, default=str) for r in tool_responses or []]
        reply = reply if isinstance(reply, str) else ""
        if not any(r.strip() for r in responses):
            return JudgeResult(0.0, None, False, "no_tool_response")
        if len(reply.strip()) < MIN_REPLY_CHARS:
            return JudgeResult(0.0, None, False, "short_reply")
        try:
            rating = self.rate(question if isinstance(question, str) else "", responses, reply)
        except NotRetried:
            raise
        except Exception as err:  # a judge failure is a score of 0, never a crash of the training step
            self.failures += 1
            return JudgeResult(0.0, None, True, f"judge_failed:{type(err).__name__}")
        if not (isinstance(rating, int) and 1 <= rating <= 5):
            self.failures += 1
            return JudgeResult(0.0, None, True, "judge_failed")
        reason = "ok"
        if self.noise > 0 and self._rng.random() < self.noise:
            rating, reason = self._rng.randint(1, 5), "ok:noise"
        return JudgeResult((rating - 1) / 4, rating, False, reason)


# ---------------------------------------------------------------------------------------------- rubric
_NUM = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?")
_QUOTED = re.compile(r"\"([^\"\n]{2,30})\"")
_CAPITAL = re.compile(r"\b[A-Z][A-Za-z0-9]+\b")
_WORD = re.compile(r"[^\W_]+")
_CAP_STOP = frozenset({
    "The", "This", "That", "These", "Those", "It", "Its", "In", "On", "At", "Of", "For", "And", "Or", "To",
    "Is", "Are", "Was", "Were", "Be", "No", "Yes", "If", "We", "You", "He", "She", "They", "An", "As", "By",
    "From", "With"
})
_Q_STOP = frozenset({
    "the", "and", "for", "are", "was", "were", "you", "your", "can", "could", "would", "should", "will",
    "how", "what", "who", "whom", "why", "when", "where", "which", "any", "get", "got", "all", "not", "but",
    "has", "had", "have", "its", "our", "out", "use", "did", "does", "doing", "done", "this", "that",
    "these", "those", "there", "their", "them", "they", "then", "than", "with", "from", "into", "about",
    "please", "tell", "give", "find", "show", "list", "more", "some", "want", "need", "know", "make",
    "like", "just", "each", "many", "much", "other", "over", "such", "only", "very", "also", "been", "being"
})
MAX_SHORT_LEAF = 30


def _leaves(x):
    stack = [x]  # iterative: JSON can nest deeper than Python's recursion limit allows here
    while stack:
        y = stack.pop()
        if isinstance(y, (dict, list)):
            stack.extend(y.values() if isinstance(y, dict) else y)
        else:
            yield y


def _finite(x: int | float | str) -> float | None:
    try:
        f = float(x)
    except OverflowError:  # float() of a huge JSON integer
        return None
    return f if math.isfinite(f) else None


def _text_salient(text: str, nums: set[float], strs: set[str]) -> None:
    nums.update(f for m in _NUM.findall(text) if (f := _finite(m.replace(",", ""))) is not None)
    strs.update(q.strip().casefold() for q in _QUOTED.findall(text) if q.strip())
    strs.update(w.casefold() for w in _CAPITAL.findall(text) if w not in _CAP_STOP)


def salient_values(tool_responses: Sequence[str]) -> tuple[set[float], set[str]]:
    """Numbers and (casefolded) strings a good reply would cite, from all tool responses.

    A response that parses as a JSON dict/list contributes its leaves: numbers (not booleans/null) as
    numbers; strings of 2..30 characters (trimmed) whole; longer strings through the text rule. Any other
    response goes through the text rule: numbers (``1,234.5`` -> 1234.5; a leading ``-`` counts only when
    not glued to a word, so ``2026-11-30`` gives 2026, 11, 30), double-quoted strings of 2..30 characters,
    and capitalised words of 2+ characters except a few sentence starters (The, This, It, ...).
    """
    nums: set[float] = set()
    strs: set[str] = set()
    for resp in tool_responses:
        try:
            obj = json.loads(resp)
        except (ValueError, RecursionError):
            obj = None
        if not isinstance(obj, (dict, list)):
            _text_salient(resp, nums, strs)
            continue
        for leaf in _leaves(obj):
            if isinstance(leaf, bool) or leaf is None:
                continue
            if isinstance(leaf, (int, float)) and (f := _finite(leaf)) is not None:
                nums.add(f)
            elif isinstance(leaf, str):
                s = leaf.strip()
                if 2 <= len(s) <= MAX_SHORT_LEAF:
                    strs.add(s.casefold())
                elif len(s) > MAX_SHORT_LEAF:
                    _text_salient(s, nums, strs)
    return nums, strs


def _reply_numbers(reply: str) -> list[tuple[float, int]]:
    out = []
    for m in _NUM.findall(reply):
        digits = m.replace(",", "")
        decimals = len(digits.split(".")[1]) if "." in digits else 0
        if (f := _finite(digits)) is not None:
            out.append((f, decimals))
    return out


def rubric_parts(question: str, tool_responses: Sequence[str], reply: str, *, max_chars: int = 1500,
                 k_facts: int = 8) -> dict[str, float]:
    """The three rubric fractions, each in [0, 1]; a pure function.

    - ``use`` (tool facts): with S the salient values of :func:`salient_values` and H those found in the
      reply, ``use = min(1, |H| / min(|S|, k_facts))`` (1 when S is empty: nothing to cite). A string is
      found when it is a case-insensitive substring of the reply; a number x when the reply holds a number y
      with ``|x - y| <= 0.5 * 10**-d(y) + 1e-9``, d(y) = y's decimal places (23.456 is found as 23.5 or
      23: the reply may round).
    - ``complete`` (the question's key terms): terms = distinct casefolded words of the question with 3+
      characters that are not stop words; a term is addressed when its first 5 characters (all, if shorter)
      are a substring of the casefolded reply; ``complete = addressed / |terms|`` (1 without terms).
    - ``concise``: with n = len(reply.strip()), 1 when ``n <= max_chars``, else ``max_chars / n``.
    """
    nums, strs = salient_values(tool_responses)
    low = reply.casefold()
    rnums = _reply_numbers(reply)
    hits = sum(s in low for s in strs)
    hits += sum(any(abs(x - y) <= 0.5 * 10.0**-d + 1e-9 for y, d in rnums) for x in nums)
    n_salient = len(nums) + len(strs)
    use = min(1.0, hits / min(n_salient, k_facts)) if n_salient else 1.0
    terms = {w for w in _WORD.findall(question.casefold()) if len(w) >= 3 and w not in _Q_STOP}
    complete = sum(t[:5] in low for t in terms) / len(terms) if terms else 1.0
    n = len(reply.strip())
    concise = 1.0 if n <= max_chars else max_chars / n
    return {"use": use, "complete": complete, "concise": concise}


def rubric_rating(question: str, tool_responses: Sequence[str], reply: str, *, max_chars: int = 1500,
                  k_facts: int = 8, weights: tuple[float, float, float] = (0.5, 0.3, 0.2)) -> int:
    """``rating = 1 + floor(4 q + 0.5)``, ``q = w_use use + w_complete complete + w_concise concise``.

    The parts come from :func:`rubric_parts`; weights default to (0.5, 0.3, 0.2) and should sum to 1 (q is
    clipped to [0, 1]). q = 0 -> 1, q = 1 -> 5, ties round up (a 1e-9 slack absorbs float error).
    """
    p = rubric_parts(question, tool_responses, reply, max_chars=max_chars, k_facts=k_facts)
    q = weights[0] * p["use"] + weights[1] * p["complete"] + weights[2] * p["concise"]
    return 1 + math.floor(4 * min(1.0, max(0.0, q)) + 0.5 + 1e-9)


class RubricJudge(SummaryJudge):
    """Deterministic CPU judge: :func:`rubric_rating` behind the :class:`SummaryJudge` guards and noise."""

    def __init__(self, max_chars: int = 1500, k_facts: int = 8,
                 weights: tuple[float, float, float] = (0.5, 0.3, 0.2), noise: float = 0.0, seed: int = 0):
        super().__init__(noise=noise, seed=seed)
        self.max_chars, self.k_facts, self.weights = max_chars, k_facts, tuple(weights)

    def rate(self, question: str, tool_responses: list[str], reply: str) -> int:
        return rubric_rating(question, tool_responses, reply, max_chars=self.max_chars, k_facts=self.k_facts,
                             weights=self.weights)


# ---------------------------------------------------------------------------------------------- LLM
RATING_WORDS = {"very poor": 1, "poor": 2, "acceptable": 3, "good": 4, "excellent": 5}
_RATING = re.compile(r"<rating>\s*([1-5](?:\.0+)?|very\s+poor|poor|acceptable|good|excellent)\s*</rating>", re.I)

JUDGE_PROMPT = """You are grading the final reply of an assistant that called tools to answer a user.

## Question
{question}

## Tool responses
{responses}

## Final reply
{reply}

Rate the final reply from 1 to 5 (1 very poor, 2 poor, 3 acceptable, 4 good, 5 excellent) on: how \
faithfully it interprets the tool results, whether it answers the question completely, and how clearly \
and concisely it is expressed. Answer exactly in this format:
<response_quality><reasoning>one short paragraph</reasoning><rating>N</rating></response_quality>"""


def parse_rating(text: str) -> int | None:
    """The rating in the last ``<rating>N</rating>`` tag, else None. N is a digit 1..5 (``4.0`` allowed) or,
    as the official judge answers, one of the words very poor / poor / acceptable / good / excellent
    (1..5, any case).

    The ``<response_quality>``/``<reasoning>`` wrapper is not required; anything else (out of range,
    ``3.5``, ``five``, no tag, not a string) is None.
    """
    if not isinstance(text, str):
        return None
    found = _RATING.findall(text)
    if not found:
        return None
    last = " ".join(found[-1].lower().split())
    return RATING_WORDS[last] if last in RATING_WORDS else int(float(last))


def build_judge_prompt(question: str, tool_responses: Sequence[str], reply: str,
                       max_response_chars: int = 4000) -> str:
    """The judge prompt: question, tool responses numbered ``[1]``, ``[2]``, ... (each cut to
    ``max_response_chars`` with a ``...[truncated]`` marker), the final reply, and the answer format."""
    def cut(r: str) -> str:
        return r if len(r) <= max_response_chars else r[:max_response_chars] + " ...[truncated]"
    responses = "\n".join(f"[{i}] {cut(r.strip())}" for i, r in enumerate(tool_responses, 1))
    return JUDGE_PROMPT.format(question=question.strip(), responses=responses, reply=reply.strip())


class LLMJudge(SummaryJudge):
    """A frozen LLM as judge: ``generate_fn(prompt) -> text`` (wrap an HF model, a vLLM engine, an API).

    One rating = up to ``1 + max_retries`` calls through :class:`~lit_credit.backends.Retry` (name ``judge``):
    a call that raises, runs past ``timeout`` seconds or whose text has no parsable rating
    (:func:`parse_rating`) is retried, retry r (1-based) after sleeping ``backoff * 2**(r-1)`` seconds. When
    every call fails the rating is a failure: score 0, ``failed=True``, ``self.failures += 1`` (and
    ``backend/judge/failures`` in the run's metrics). ``self.calls`` counts generate_fn calls. The judge's
    sampling settings (greedy decoding is advisable) belong to ``generate_fn``.
    """

    def __init__(self, generate_fn: Callable[[str], str], max_retries: int = 2, backoff: float = 0.5,
                 timeout: float | None = None, max_response_chars: int = 4000, noise: float = 0.0, seed: int = 0):
        super().__init__(noise=noise, seed=seed)
        self.generate_fn, self.retry = generate_fn, Retry("judge", max_retries, backoff, timeout)
        self.max_response_chars = max_response_chars
        self.calls = 0

    def rate(self, question: str, tool_responses: list[str], reply: str) -> int | None:
        prompt = build_judge_prompt(question, tool_responses, reply, self.max_response_chars)

        def ask() -> int | None:
            self.calls += 1
            return parse_rating(self.generate_fn(prompt))

        try:
            return self.retry(ask, accept=lambda rating: rating is not None)
        except BackendFailure:
            return None
