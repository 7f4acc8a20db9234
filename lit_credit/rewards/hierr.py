"""HierR: SLCA-GRPO's two rewards, a tool process score and a summary score (methods.md §1).

``tool_process_score`` parses the Hermes ``<tool_call>`` blocks of a rollout and scores them against the
gold calls; :class:`HierRReward` adds the summary judge and the omission penalty and is a ``Reward``.
Nothing here raises on model output: malformed text scores 0 on the affected components.
"""
from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lit_credit.rewards.judges import RubricJudge, SummaryJudge

OPEN, CLOSE = "<tool_call>", "</tool_call>"
DEFAULT_WEIGHTS: dict[str, float] = {
    "format": 0.10, "name": 0.25, "key": 0.15, "value": 0.20, "parallel": 0.30}
COMPONENTS = tuple(DEFAULT_WEIGHTS)

# Innermost blocks: the body may not contain another open tag, so "<tool_call>a<tool_call>b</tool_call>"
# is one block "b" (and 2 open tags, 1 close tag).
_BLOCK = re.compile(r"<tool_call>((?:(?!<tool_call>).)*?)</tool_call>", re.S)


def _spans(text: str, open_tag: str, close_tag: str) -> list[tuple[int, int]]:
    """``(start, end)`` of every non-overlapping ``open_tag ... close_tag`` (shortest match, left to right),
    what ``re.finditer(open.*?close, re.S)`` finds, but with ``str.find``: linear, where the regex rescans
    to the end from every unclosed open tag (quadratic on a reply of many ``<think>`` tags)."""
    spans, i = [], 0
    while (start := text.find(open_tag, i)) >= 0:
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:
            break
        spans.append((start, end + len(close_tag)))
        i = end + len(close_tag)
    return spans


def strip_think(text: str) -> str:
    """Remove reasoning: every ``<think>...</think>``; then, if a ``</think>`` is left (the template opened
    the block in the prompt), everything up to it; then, if a ``<think>`` is left (truncated), everything
    from it on. Linear in ``len(text)``."""
    kept, i = [], 0
    for start, end in _spans(text, "<think>", "</think>"):
        kept.append(text[i:start])
        i = end
    text = "".join([*kept, text[i:]])
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    return text.split("<think>", 1)[0]


# ------------------------------------------------------------------------------------------------ parsing
@dataclass(frozen=True)
class ToolCallBlock:
    """One ``<tool_call>`` body; ``reason`` is "" when valid, else the first failure: ``json`` (not JSON),
    ``type`` (not a dict or a non-empty list of dicts), ``name`` (no string name), ``unknown_tool`` (name not
    allowed), ``arguments`` (``arguments``/``parameters`` missing or not a dict)."""

    raw: str
    valid: bool
    reason: str = ""
    calls: tuple[dict[str, Any], ...] = ()  # normalised {"name", "arguments"}; empty when invalid


@dataclass(frozen=True)
class ParsedCalls:
    """All blocks of a text, in order, and the raw tag counts (after ``<think>`` stripping)."""

    blocks: tuple[ToolCallBlock, ...] = ()
    n_open: int = 0
    n_close: int = 0

    @property
    def calls(self) -> list[dict[str, Any]]:
        """The calls of the valid blocks, in order (the predictions P)."""
        return [c for b in self.blocks for c in b.calls]

    @property
    def n_valid(self) -> int:
        return sum(b.valid for b in self.blocks)

    @property
    def first_valid(self) -> ToolCallBlock | None:
        return next((b for b in self.blocks if b.valid), None)


def _allowed_set(allowed_tools: Any) -> set[str] | None:
    if allowed_tools is None:
        return None
    if isinstance(allowed_tools, str):
        try:
            allowed_tools = json.loads(allowed_tools)
        except ValueError:
            return {allowed_tools}
        if isinstance(allowed_tools, str):
            return {allowed_tools}
    try:
        return {t for t in allowed_tools if isinstance(t, str)}
    except TypeError:  # not iterable: nothing is allowed
        return set()


def _parse_block(raw: str, allowed: set[str] | None) -> ToolCallBlock:
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        return ToolCallBlock(raw, False, "json")
    items = obj if isinstance(obj, list) else [obj]
    if not items or not all(isinstance(c, dict) for c in items):
        return ToolCallBlock(raw, False, "type")
    calls = []
    for c in items:
        name, args = c.get("name"), c.get("arguments", c.get("parameters"))
        if not isinstance(name, str):
            return ToolCallBlock(raw, False, "name")
        if allowed is not None and name not in allowed:
            return ToolCallBlock(raw, False, "unknown_tool")
        if not isinstance(args, dict):
            return ToolCallBlock(raw, False, "arguments")
        calls.append({"name": name, "arguments": args})
    return ToolCallBlock(raw, True, "", tuple(calls))


def parse_tool_calls(text: str, allowed_tools: Any = None) -> ParsedCalls:
    """Parse the Hermes tool calls of ``text`` (never raises).

    ``<think>`` is stripped (:func:`strip_think`); every innermost ``<tool_call>BODY</tool_call>`` is a block.
    A block is valid when BODY is JSON that is a dict or a non-empty list of dicts (a list = parallel calls)
    and every call has a string ``name`` in ``allowed_tools`` and a dict ``arguments`` (``parameters`` is
    accepted and renamed; ``arguments`` wins when both are present). ``allowed_tools=None`` allows any name
    (a JSON-string list is parsed). Open and close tags are counted separately.
    """
    text = strip_think(text if isinstance(text, str) else "")
    allowed = _allowed_set(allowed_tools)
    blocks = tuple(_parse_block(body.strip(), allowed) for body in _BLOCK.findall(text))
    return ParsedCalls(blocks, text.count(OPEN), text.count(CLOSE))


# ------------------------------------------------------------------------------------------------ gold
def _as_list(x: Any, what: str) -> list:
    if x is None:
        return []
    if isinstance(x, (list, tuple)):
        return list(x)
    if hasattr(x, "tolist") and not isinstance(x, (str, bytes, dict)):  # numpy arrays from parquet/pandas
        out = x.tolist()
        return out if isinstance(out, list) else [out]
    raise ValueError(f"{what} must be a list, got {type(x).__name__}: {x!r:.80}; fix: gold_tool_calls is a "
                     "list of steps, each a list of {\"name\", \"arguments\"} dicts")


def _gold_call(c: Any) -> dict[str, Any]:
    if isinstance(c, str):
        return {"name": c, "arguments": {}}
    if not isinstance(c, Mapping):
        raise ValueError(f"gold call must be a tool name or a dict, got {c!r:.80}")
    if isinstance(c.get("function"), Mapping):  # OpenAI style {"type": "function", "function": {...}}
        c = c["function"]
    name, args = c.get("name"), c.get("arguments")
    if args is None:
        args = c.get("parameters")
    if not isinstance(name, str):
        raise ValueError(f"gold call without a string name: {c!r:.80}")
    if isinstance(args, str):  # HF datasets store heterogeneous arguments as JSON strings
        try:
            args = json.loads(args) if args.strip() else None
        except (ValueError, RecursionError) as err:
            raise ValueError(f"gold arguments of {name!r} are a string but not JSON ({err}): "
                             f"{args!r:.80}") from None
    if args is None:
        args = {}
    if not isinstance(args, Mapping):
        raise ValueError(f"gold arguments of {name!r} are not a dict: {args!r:.80}")
    return {"name": name, "arguments": dict(args)}


def normalize_gold_calls(gold: Any) -> list[list[dict[str, Any]]]:
    """Gold calls in the nested form, steps x calls of ``{"name": str, "arguments": dict}``.

    Accepts the nested form (idempotent), the older flat forms, and mixtures: each top-level element that
    is a list is one step; a bare tool name ``"f"`` or a call dict is a step of its own (the flat forms give
    no parallelism, so they are read as sequential single-call steps). Names become ``{"name": "f",
    "arguments": {}}``; arguments given as a JSON string are parsed, ``parameters`` is renamed, and an
    OpenAI ``{"function": {...}}`` wrapper is unwrapped. None, ``[]`` -> ``[]``; a JSON string of the whole
    is parsed first. Gold is data, not model output: an uninterpretable gold raises ``ValueError`` naming
    ``gold_tool_calls`` (or the gold call) and the expected form.
    """
    if isinstance(gold, str):
        try:
            gold = json.loads(gold)
        except (ValueError, RecursionError) as err:
            raise ValueError(f"gold_tool_calls is a string but not JSON ({err}): {gold!r:.80}; fix: store "
                             "the nested list of steps (or its JSON)") from None
    steps = []
    for i, step in enumerate(_as_list(gold, "gold_tool_calls")):
        if isinstance(step, (str, Mapping)):
            steps.append([_gold_call(step)])
        else:
            steps.append([_gold_call(c) for c in _as_list(step, f"gold_tool_calls[{i}]")])
    return steps


# ------------------------------------------------------------------------------------------------ scores
_TRUE, _FALSE = frozenset({"true", "1"}), frozenset({"false", "0"})


def _as_bool(x: Any) -> bool | None:
    if isinstance(x, bool):
        return x
    if isinstance(x, (int, float)) and x in (0, 1):
        return bool(x)
    if isinstance(x, str):
        s = x.strip().lower()
        return True if s in _TRUE else False if s in _FALSE else None
    return None


def _as_float(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float, str)):
        return None
    try:
        return float(x.strip() if isinstance(x, str) else x)
    except (ValueError, OverflowError):
        return None


def _canon(x: Any) -> str:
    if isinstance(x, str):
        try:
            x = json.loads(x)
        except (ValueError, RecursionError):
            return x
    try:
        return json.dumps(x, sort_keys=True, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        return repr(x)


def loose_equal(gold: Any, pred: Any) -> bool:
    """Loose equality of two argument values, tried in this order:

    1. either is a bool: both read as booleans (bools; numbers 0/1; strings "true"/"false"/"1"/"0", trimmed,
       any case) and equal;
    2. either is a number: both read as floats (numbers; numeric strings) and ``|a - b| <= 1e-9``;
    3. both strings: equal after trimming and casefolding;
    4. either is a list/dict: equal sorted-key JSON (a string side is JSON-parsed first);
    5. otherwise ``==`` (e.g. None == None).
    """
    if isinstance(gold, bool) or isinstance(pred, bool):
        a, b = _as_bool(gold), _as_bool(pred)
        return a is not None and a == b
    if isinstance(gold, (int, float)) or isinstance(pred, (int, float)):
        a, b = _as_float(gold), _as_float(pred)
        return a is not None and b is not None and (a == b or abs(a - b) <= 1e-9)
    if isinstance(gold, str) and isinstance(pred, str):
        return gold.strip().casefold() == pred.strip().casefold()
    if isinstance(gold, (list, dict)) or isinstance(pred, (list, dict)):
        return _canon(gold) == _canon(pred)
    return gold == pred


def name_f1(pred_names: Sequence[str], gold_names: Sequence[str]) -> float:
    """Multiset F1: with tp = |pred ∩ gold| (multiset), P = tp/|pred|, R = tp/|gold|,
    ``F1 = 2PR/(P+R) = 2 tp / (|pred| + |gold|)``; both empty -> 1, exactly one empty (or tp = 0) -> 0."""
    if not pred_names and not gold_names:
        return 1.0
    tp = sum((Counter(pred_names) & Counter(gold_names)).values())
    return 2 * tp / (len(pred_names) + len(gold_names))


def _pair_scores(gold_args: dict, pred_args: dict) -> tuple[float, float]:
    gk, pk = set(gold_args), set(pred_args)
    shared = gk & pk
    return len(shared) / len(gk | pk), sum(loose_equal(gold_args[k], pred_args[k]) for k in shared) / len(gk)


def key_value_scores(pred: Sequence[dict], gold: Sequence[dict]) -> tuple[float, float]:
    """(key, value) over the gold calls G with non-empty arguments (flat, in step order).

    G empty -> (1, 1); no predicted calls -> (0, 0). Otherwise each gold call g, in order, takes the unused
    prediction p with ``p.name == g.name`` that maximises ``key + value`` (first one on a tie) and uses it
    up; ``key = |K_g ∩ K_p| / |K_g ∪ K_p|`` (Jaccard of key sets), ``value = #{k in K_g ∩ K_p :
    loose_equal(g[k], p[k])} / |K_g|``; an unmatched gold call scores (0, 0). Both are averaged over G.
    """
    targets = [g for g in gold if g["arguments"]]
    if not targets:
        return 1.0, 1.0
    if not pred:
        return 0.0, 0.0
    used: set[int] = set()
    key = value = 0.0
    for g in targets:
        best = None
        for j, p in enumerate(pred):
            if j not in used and p["name"] == g["name"]:
                k, v = _pair_scores(g["arguments"], p["arguments"])
                if best is None or k + v > best[0] + best[1]:
                    best = (k, v, j)
        if best is not None:
            used.add(best[2])
            key, value = key + best[0], value + best[1]
    return key / len(targets), value / len(targets)


def _weights(weights: Mapping[str, float] | None) -> dict[str, float]:
    """DEFAULT_WEIGHTS updated with ``weights``; unknown names and non-finite values (a NaN weight would make
    every process score NaN) raise ``ValueError``."""
    extra = set(weights or {}) - set(COMPONENTS)
    if extra:
        raise ValueError(f"unknown HierR weight(s) {sorted(extra)}; valid: {list(COMPONENTS)}")
    out = {**DEFAULT_WEIGHTS, **{k: float(v) for k, v in (weights or {}).items()}}
    bad = {k: v for k, v in out.items() if not math.isfinite(v)}
    if bad:
        raise ValueError(f"HierR weight(s) {bad} are not finite; fix: give each weight a finite float")
    return out


def tool_process_score(text: str, gold_calls: Any, allowed_tools: Any,
                       weights: Mapping[str, float] | None = None) -> dict[str, float]:
    """HierR's tool process score of one rollout text (methods.md §1); never raises on ``text``.

    With the blocks of :func:`parse_tool_calls`, P the calls of the valid blocks and G the gold calls
    (:func:`normalize_gold_calls`, so the flat form works too):

    - ``format = #valid blocks / max(#open, #close)``; 0 when there is no tag.
    - ``name = name_f1(names(P), names(G))``, multiset F1 (both empty -> 1).
    - ``key``, ``value``: :func:`key_value_scores` (greedy one-to-one matching, Jaccard, loose values).
    - ``parallel = 1[n_first == n_gold0]``, n_first = #calls of the first valid block (0 when none is
      valid), n_gold0 = #calls of gold step 0 (0 when gold has no steps). So with gold ``[]`` (the
      irrelevant subset) parallel is 1 exactly when no valid block was emitted.
    - ``process = 0.10 format + 0.25 name + 0.15 key + 0.20 value + 0.30 parallel``; ``weights`` overrides
      any of these (unknown names raise). With weights summing to 1, process is in [0, 1].
    """
    w = _weights(weights)
    parsed = parse_tool_calls(text, allowed_tools)
    gold_steps = normalize_gold_calls(gold_calls)
    gold = [c for step in gold_steps for c in step]
    n_tags = max(parsed.n_open, parsed.n_close)
    first, pred = parsed.first_valid, parsed.calls
    key, value = key_value_scores(pred, gold)
    parts = {
        "format": parsed.n_valid / n_tags if n_tags else 0.0,
        "name": name_f1([c["name"] for c in pred], [c["name"] for c in gold]),
        "key": key,
        "value": value,
        "parallel": float(len(first.calls if first else ()) == len(gold_steps[0] if gold_steps else ())),
    }
    parts["process"] = sum(w[k] * parts[k] for k in COMPONENTS)
    return parts


def step_plan(gold_steps: Sequence[Sequence[dict[str, Any]]], turn: int) -> list[list[dict[str, Any]]]:
    """Gold step ``turn`` as a one-step plan ``[step]``; ``[]`` (the empty plan) beyond the gold steps."""
    return [list(gold_steps[turn])] if 0 <= turn < len(gold_steps) else []


def tool_turn_scores(tool_turns: Sequence[str], gold_calls: Any, allowed_tools: Any,
                     weights: Mapping[str, float] | None = None) -> list[dict[str, float]]:
    """Per-turn HierR scores of the tool turns of a rollout (SLCA x TCPO, methods.md §1-§2).

    Tool turn k (0-based) is scored alone against gold step k: ``tool_process_score(turn_k,
    step_plan(gold, k))``, so a turn beyond the gold steps is scored against the empty plan (an extra call
    loses name and parallel; stopping would have scored 0.9). Each dict also holds
    ``exact = 1[name = key = value = 1]``: the turn's calls are exactly gold step k's (names as a multiset,
    every key and value).
    """
    gold = normalize_gold_calls(gold_calls)
    out = []
    for k, text in enumerate(tool_turns):
        parts = tool_process_score(text, step_plan(gold, k), allowed_tools, weights)
        exact = k < len(gold) and parts["name"] == 1 and parts["key"] == 1 and parts["value"] == 1
        out.append({**parts, "exact": float(exact)})
    return out


# ------------------------------------------------------------------------------------------------ reward
def final_reply(text: str) -> str:
    """The reply the summary judge sees: ``<think>`` stripped, then the text after the last
    ``</tool_response>``, else after the last ``</tool_call>``, else all of it; trimmed."""
    text = strip_think(text if isinstance(text, str) else "")
    for tag in ("</tool_response>", CLOSE):
        if tag in text:
            return text.rsplit(tag, 1)[1].strip()
    return text.strip()


def extract_tool_responses(text: str) -> list[str]:
    """The bodies of every ``<tool_response>...</tool_response>`` in ``text``, trimmed, in order."""
    text = text if isinstance(text, str) else ""
    spans = _spans(text, "<tool_response>", "</tool_response>")
    return [text[s + len("<tool_response>"):e - len("</tool_response>")].strip() for s, e in spans]


def _field(row: Mapping[str, Any], *keys: str) -> Any:
    """The first of ``keys`` in ``row``, else in ``row["reward_model"]["ground_truth"]`` (the parquet)."""
    rm = row.get("reward_model")
    gt = rm.get("ground_truth") if isinstance(rm, Mapping) else None
    for source in (row, gt if isinstance(gt, Mapping) else {}):
        for k in keys:
            if source.get(k) is not None:
                return source[k]
    return None


def _question(row: Mapping[str, Any]) -> str:
    q = _field(row, "question", "question_content")
    if q is None:  # fall back to the last user message of a chat prompt
        prompt = row.get("prompt")
        messages = prompt if isinstance(prompt, (list, tuple)) else []
        users = [m.get("content") for m in messages if isinstance(m, Mapping) and m.get("role") == "user"]
        q = users[-1] if users else ""
    return q if isinstance(q, str) else str(q)


class HierRReward:
    """SLCA-GRPO's reward: ``score = w_process * process + w_summary * summary`` (methods.md §1).

    Row keys (each looked up in the row, then in ``row["reward_model"]["ground_truth"]``):
    ``gold_tool_calls`` (nested or flat form), ``allowed_tools`` (absent: any name), ``question`` (or
    ``question_content``, else the last user message of ``row["prompt"]``).

    The rollout text is ``"\\n".join(strip_think(r) for r in replies)``: each turn is stripped on its own,
    so a template that opens ``<think>`` in every turn's prompt loses no call. ``process`` and its five
    components come from :func:`tool_process_score`. Tool responses for the judge, the first found of: the
    ``tool_responses`` keyword, ``row["_tool_responses"]`` (set by the environment, which injects them and
    so knows them), the ``<tool_response>`` blocks inside the replies (a caller that passes a whole
    transcript as the replies). The judge sees
    the question, those responses and ``final_reply(replies[-1])``; ``summary`` is its score (0 with no
    tool response, a reply under 10 characters, or a judge failure: ``judge_failed = 1``).

    Omission: when gold has at least one call and the think-stripped text has no ``<tool_call>`` or
    ``</tool_call>`` tag, ``should_call_but_no_call = 1`` and ``score = omission_score`` (-0.5); the judge is
    not called then (``summary = 0``), as the estimator replaces the summary score by ``score`` anyway.

    Per turn (lists, one entry per tool turn: every reply but the last, the SLCA segment rule; the rollout
    batch pads them into [B, K]): ``tool_scores`` (each turn's process score against its gold step,
    :func:`tool_turn_scores`), ``tool_turn_mask`` (1 per tool turn) and ``tool_exact``; plus ``gold_steps``,
    the number of gold steps. :meth:`turn_score` scores one alternative turn the same way.

    ``replies`` given as one str (not a list) is a caller error, a ``ValueError``; it would otherwise be read
    as one reply per character.
    """

    def __init__(self, w_process: float = 1.0, w_summary: float = 1.0, judge: SummaryJudge | None = None,
                 weights: Mapping[str, float] | None = None, omission_score: float = -0.5):
        self.w_process, self.w_summary, self.omission_score = w_process, w_summary, omission_score
        self.judge = judge if judge is not None else RubricJudge()
        self.weights = _weights(weights)

    def __call__(self, row: dict[str, Any], replies: list[str],
                 tool_responses: Sequence[str] | None = None,
                 turn_scores: Sequence[float | None] | None = None) -> dict[str, float]:
        if isinstance(replies, str):
            raise ValueError("replies must be a list of reply strings, one per assistant turn, got one str; "
                             "fix: pass [text]")
        replies = [strip_think(r) if isinstance(r, str) else "" for r in replies or []]
        text = "\n".join(replies)
        gold = normalize_gold_calls(_field(row, "gold_tool_calls"))
        parts = tool_process_score(text, gold, _field(row, "allowed_tools"), self.weights)
        omitted = any(gold) and OPEN not in text and CLOSE not in text
        summary, failed = 0.0, False
        if not omitted:
            if tool_responses is None:
                tool_responses = row.get("_tool_responses")
            if tool_responses is None:
                tool_responses = extract_tool_responses(text)
            reply = final_reply(replies[-1] if replies else "")
            result = self.judge(_question(row), list(tool_responses), reply)
            summary, failed = result.score, result.failed
        score = self.w_process * parts["process"] + self.w_summary * summary
        if omitted:
            score = self.omission_score
        turns = tool_turn_scores(replies[:-1], gold, _field(row, "allowed_tools"), self.weights)
        return {"score": score, **parts, "summary": summary, "should_call_but_no_call": float(omitted),
                "judge_failed": float(failed), "gold_steps": float(len(gold)),
                "tool_scores": [t["process"] for t in turns], "tool_turn_mask": [1.0] * len(turns),
                "tool_exact": [t["exact"] for t in turns]}

    def turn_score(self, row: dict[str, Any], turn: int, reply: str) -> float:
        """The process score of ``reply`` as tool turn ``turn`` (0-based) of ``row``, against gold step
        ``turn`` (:func:`tool_turn_scores`): how TCPO's counterfactual alternatives of a tool turn are scored."""
        gold = normalize_gold_calls(_field(row, "gold_tool_calls"))
        text = strip_think(reply) if isinstance(reply, str) else ""
        return tool_process_score(text, step_plan(gold, turn), _field(row, "allowed_tools"), self.weights)["process"]
