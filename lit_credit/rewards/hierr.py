"""HierR: SLCA-GRPO's two rewards, a tool process score and a summary score (docs/methods.md §1).

``tool_process_score`` parses the Hermes ``<tool_call>`` blocks of a rollout and scores them against the
gold calls; :class:`HierRReward` adds the summary judge and the omission penalty and is a ``Reward``.
Nothing here raises on model output: malformed text scores 0 on the affected components.

Parsing, gold reading, value comparison and the omission rule are the official reward's (SLCA-GRPO
``reward_fn.py``). What still differs, on purpose:

- the judge sees only *real* tool responses, the results of executed calls; the official judge also sees
  the environment's error answers (unknown tool, bad arguments), a reward for debris. No key: it is the
  reward hack this module closes.
- ``reward.no_call_summary`` (default ``zero``; ``judge`` = official): the summary on prompts whose gold
  has no call.
- ``reward.needless_calls`` (default ``attempted``; ``valid`` = official): on a prompt (or a tool turn) whose
  gold has no call, any tool tag counts as a call for ``name`` and ``parallel``, so a broken needless call
  (an unknown tool, a list mixing a good and a bad item, a stray tag) scores 0.35 below the clean needless
  call's 0.45; officially only valid blocks' calls count there and a broken needless call scores 0.90, as
  much as the right direct answer.
- the final reply is the last assistant turn after its last ``</tool_call>``; officially it is the
  transcript after its last ``</tool_response>``. The two agree unless the last turn holds a tool tag
  (debris that ended the episode, or the turn limit).
- the LLM judge prompt is this project's (a digit 1-5; the official asks for a word, very poor ..
  excellent; :func:`~lit_credit.rewards.judges.parse_rating` reads both).
- a value ``float()`` cannot hold is "not equal" (officially a crash); a gold that mixes the nested and
  flat forms raises (officially the odd parts are dropped).

On a BFCL row (one with a ``possible_answer``, ``task=bfcl``) the arguments follow BFCL's AST rules
(:mod:`~lit_credit.rewards.bfcl_checker`, a port of the ``bfcl-eval`` wheel's checker): ``key``, ``value``,
``toolpo_correct_ratio`` and a ``bfcl_valid`` part (:meth:`HierRReward.bfcl_parts`).
"""
from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lit_credit.rewards import bfcl_checker
from lit_credit.rewards.judges import RubricJudge, SummaryJudge
from lit_credit.rewards.pairing import greedy_pair_means
from lit_credit.types import RewardResult

OPEN, CLOSE = "<tool_call>", "</tool_call>"
DEFAULT_WEIGHTS: dict[str, float] = {
    "format": 0.10, "name": 0.25, "key": 0.15, "value": 0.20, "parallel": 0.30}
COMPONENTS = tuple(DEFAULT_WEIGHTS)

_THINK_OPEN, _THINK_CLOSE = re.compile(r"<think(?:ing)?>"), re.compile(r"</think(?:ing)?>")


def _spans(text: str, open_tag: str, close_tag: str) -> list[tuple[int, int]]:
    """``(start, end)`` of every non-overlapping ``open_tag ... close_tag`` (shortest match, left to right),
    what ``re.finditer(open.*?close, re.S)`` finds, but with ``str.find``: linear, where the regex rescans
    to the end from every unclosed open tag (quadratic on a reply of many open tags)."""
    spans, i = [], 0
    while (start := text.find(open_tag, i)) >= 0:
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:
            break
        spans.append((start, end + len(close_tag)))
        i = end + len(close_tag)
    return spans


def strip_think(text: str) -> str:
    """Remove every complete reasoning block, as the official reward's
    ``re.sub(r"<think(?:ing)?>.*?</think(?:ing)?>", "", text, flags=re.S)`` does (``<think>`` or
    ``<thinking>``, closed by either); a dangling open or close tag is kept with the text around it. Linear
    in ``len(text)`` (the regex is quadratic on many unclosed tags)."""
    closes = [m.span() for m in _THINK_CLOSE.finditer(text)]
    kept, i, j = [], 0, 0
    for m in _THINK_OPEN.finditer(text):
        if m.start() < i:  # inside a block already removed
            continue
        while j < len(closes) and closes[j][0] < m.end():
            j += 1
        if j == len(closes):  # no close after this open, so none after any later one
            break
        kept.append(text[i:m.start()])
        i = closes[j][1]
        j += 1
    return "".join(kept) + text[i:]


# ------------------------------------------------------------------------------------------------ parsing
@dataclass(frozen=True)
class ToolCallBlock:
    """One ``<tool_call>`` body; ``reason`` is "" when valid, else the first failure: ``json`` (not JSON),
    ``type`` (not a dict or list, or an item of the list not a dict), ``name`` (no non-empty string name),
    ``unknown_tool`` (name not allowed), ``arguments`` (``arguments or parameters or {}`` not a dict),
    ``empty`` (the list ``[]``: valid in the official reward, where it scores format 1 with no call, so on a
    no-call prompt it beat the right direct answer; here it is debris).
    ``items`` holds each item's ``(call, reason)`` (call None when the item fails), empty on
    ``json``/``type``/``empty`` of the whole body; ``calls`` the calls of a valid block (empty when any item
    fails)."""

    raw: str
    valid: bool
    reason: str = ""
    calls: tuple[dict[str, Any], ...] = ()  # normalised {"name", "arguments"}; empty when invalid
    items: tuple[tuple[dict[str, Any] | None, str], ...] = ()


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
    def executed(self) -> list[dict[str, Any]]:
        """The calls an environment executes: every good item, also of a block with a bad one (the official
        environment runs the valid items of such a list block; the reward scores the block invalid)."""
        return [c for b in self.blocks for c, _ in b.items if c is not None]

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


def _parse_item(obj: Any, allowed: set[str] | None) -> tuple[dict[str, Any] | None, str]:
    if not isinstance(obj, dict):
        return None, "type"
    name = obj.get("name")
    if not name or not isinstance(name, str):
        return None, "name"
    if allowed is not None and name not in allowed:
        return None, "unknown_tool"
    args = obj.get("arguments") or obj.get("parameters") or {}  # official: missing/null/falsy -> {}
    if not isinstance(args, dict):
        return None, "arguments"
    return {"name": name, "arguments": args}, ""


def _parse_block(raw: str, allowed: set[str] | None) -> ToolCallBlock:
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        return ToolCallBlock(raw, False, "json")
    if not isinstance(obj, (dict, list)):
        return ToolCallBlock(raw, False, "type")
    if obj == []:  # officially a valid block with no call: it would out-score the direct answer (format 1)
        return ToolCallBlock(raw, False, "empty")
    items = tuple(_parse_item(c, allowed) for c in (obj if isinstance(obj, list) else [obj]))
    reason = next((r for _, r in items if r), "")
    return ToolCallBlock(raw, not reason, reason, () if reason else tuple(c for c, _ in items), items)


def parse_tool_calls(text: str, allowed_tools: Any = None) -> ParsedCalls:
    """Parse the Hermes tool calls of ``text`` (never raises), as the official reward does.

    ``<think>`` blocks are stripped (:func:`strip_think`); each ``<tool_call>BODY</tool_call>``, from an
    open tag to the first close tag after it (``<tool_call>(.*?)</tool_call>``, so a second open tag inside
    is part of BODY), is a block. A block is valid when BODY is a JSON dict or list of dicts (a list =
    parallel calls; ``[]`` is the invalid ``empty`` block, officially valid) and every call has a non-empty string ``name`` in
    ``allowed_tools`` and ``arguments or parameters or {}`` a dict (missing, null or empty arguments read
    as ``{}``; empty ``arguments`` fall back to ``parameters``). ``allowed_tools=None`` allows any name (a
    JSON-string list is parsed). Open and close tags are counted separately.
    """
    text = strip_think(text if isinstance(text, str) else "")
    allowed = _allowed_set(allowed_tools)
    blocks = tuple(_parse_block(text[s + len(OPEN):e - len(CLOSE)].strip(), allowed)
                   for s, e in _spans(text, OPEN, CLOSE))
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
                     "list of steps, each a list of {\"name\", \"arguments\"} dicts (or a flat list of calls: "
                     "one parallel step)")


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


def _is_list(x: Any) -> bool:
    return isinstance(x, (list, tuple)) or (hasattr(x, "tolist") and not isinstance(x, (str, bytes, Mapping)))


def normalize_gold_calls(gold: Any) -> list[list[dict[str, Any]]]:
    """Gold calls in the nested form, steps x calls of ``{"name": str, "arguments": dict}``, read as the
    official reward reads them.

    Nested (the first element is a list): each element is one step (idempotent); an empty step is dropped
    (``[[], [f]]`` -> ``[[f]]``). Flat (the first element is a tool name or a call dict): the whole list is
    ONE step of parallel calls (``["f", "g"]`` -> ``[[f, g]]``). Names become ``{"name": "f", "arguments":
    {}}``; arguments given as a JSON string are parsed, ``parameters`` is renamed, and an OpenAI
    ``{"function": {...}}`` wrapper is unwrapped. None, ``[]`` -> ``[]``; a JSON string of the whole is
    parsed first. Gold is data, not model output: an uninterpretable gold (also a mixture of the two forms)
    raises ``ValueError`` naming ``gold_tool_calls`` (or the gold call) and the expected form, where the
    official reward silently drops what it cannot read.
    """
    if isinstance(gold, str):
        try:
            gold = json.loads(gold)
        except (ValueError, RecursionError) as err:
            raise ValueError(f"gold_tool_calls is a string but not JSON ({err}): {gold!r:.80}; fix: store "
                             "the nested list of steps (or its JSON)") from None
    top = _as_list(gold, "gold_tool_calls")
    if top and not _is_list(top[0]):  # flat: one parallel step
        return [[_gold_call(c) for c in top]]
    steps = []
    for i, step in enumerate(top):
        calls = [_gold_call(c) for c in _as_list(step, f"gold_tool_calls[{i}]")]
        if calls:  # an empty step is dropped, as the official reward does
            steps.append(calls)
    return steps


# ------------------------------------------------------------------------------------------------ scores
_BOOL_STRINGS = {"true": True, "false": False, "1": True, "0": False}


def loose_equal(gold: Any, pred: Any) -> bool:
    """Loose equality of two argument values, the official HierR rule, tried in this order:

    1. None: equal only to None;
    2. the string forms ``str(x).strip().lower()`` are equal (so gold ``"True"`` matches ``True``, ``[1, 2]``
       matches ``"[1, 2]"``, ``"NaN"`` matches ``"nan"``);
    3. both convert with ``float()`` (numbers, bools, numeric strings) and ``|a - b| < 1e-9``;
    4. both string forms are in {"true", "false", "1", "0"} and read as the same boolean (gold ``"True"``
       matches ``1``; ``"1"`` matches ``"true"``);
    5. both are lists/dicts with equal sorted-key JSON;
    6. otherwise not equal.

    Never raises: a value ``float()`` cannot hold (``10**400``) or too deep to print is simply not equal at
    that step (the official code would raise on the former).
    """
    if gold is None or pred is None:
        return gold is None and pred is None
    try:
        g, p = str(gold).strip().lower(), str(pred).strip().lower()
    except (RecursionError, ValueError):  # ValueError: an int too long for str()
        return False
    if g == p:
        return True
    try:
        if abs(float(pred) - float(gold)) < 1e-9:
            return True
    except (ValueError, TypeError, OverflowError):
        pass
    gb, pb = _BOOL_STRINGS.get(g), _BOOL_STRINGS.get(p)
    if gb is not None and pb is not None:
        return gb == pb
    if isinstance(gold, (list, dict)) and isinstance(pred, (list, dict)):
        try:
            return json.dumps(pred, sort_keys=True) == json.dumps(gold, sort_keys=True)
        except (TypeError, ValueError, RecursionError):
            return False
    return False


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
    prediction p with ``p.name == g.name`` that maximises ``key + value``, and only when that sum is above 0
    (first one on a tie); the pair uses p up. ``key = |K_g ∩ K_p| / |K_g ∪ K_p|`` (Jaccard of key sets),
    ``value = #{k in K_g ∩ K_p : loose_equal(g[k], p[k])} / |K_g|``; a gold call left unpaired scores (0, 0).
    Both are averaged over G. So a same-name prediction that matches nothing of g is left for a later gold
    call: gold ``[f(a=1), f(b=2)]``, prediction ``[f(b=2)]`` -> f(a=1) pairs with nothing (0 + 0 is not
    above 0), f(b=2) takes it (1, 1): key = value = (0 + 1) / 2 = 0.5.
    """
    targets = [g for g in gold if g["arguments"]]
    if not targets:
        return 1.0, 1.0
    if not pred:
        return 0.0, 0.0
    return greedy_pair_means(targets, pred, lambda g, p: _pair_scores(g["arguments"], p["arguments"])
                             if p["name"] == g["name"] else None)


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


NEEDLESS_CALLS = ("attempted", "valid")


def _check_needless(needless_calls: str) -> None:
    if needless_calls not in NEEDLESS_CALLS:
        raise ValueError(f"reward.needless_calls={needless_calls!r}: use 'attempted' (on a no-call prompt any tool "
                         "tag is a call: a broken needless call scores below a clean one; the default) or 'valid' "
                         "(the official reward: only valid blocks are calls, a broken needless call scores 0.90)")


def tool_process_score(text: str, gold_calls: Any, allowed_tools: Any,
                       weights: Mapping[str, float] | None = None,
                       needless_calls: str = "attempted") -> dict[str, float]:
    """HierR's tool process score of one rollout text (docs/methods.md §1); never raises on ``text``.

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
    - Needless calls (G has no call): ``needless_calls="attempted"`` (default) counts every tool tag as a
      call there, so ``name = parallel = 0`` whenever the text holds a ``<tool_call>`` or ``</tool_call>``
      tag, valid or not. Then the right direct answer scores ``0.25 + 0.15 + 0.20 + 0.30 = 0.90``, a clean
      needless call ``0.10 * 1 + 0.35 = 0.45`` and a broken one (an unknown tool, a list mixing a good and a
      bad item, bad JSON, a stray tag: format 0) ``0.35``; a mixture lies between (format in (0, 1)), so a
      broken needless call never scores above a clean one. ``"valid"`` (the official reward) counts only the
      calls of valid blocks: a broken needless call then has no prediction, name 1 and parallel 1 (0 == 0),
      and scores 0.90 like the direct answer.
    """
    _check_needless(needless_calls)
    return _process_parts(parse_tool_calls(text, allowed_tools), normalize_gold_calls(gold_calls), _weights(weights),
                          needless_calls)


def _process_parts(parsed: ParsedCalls, gold_steps: list[list[dict[str, Any]]],
                   w: Mapping[str, float], needless_calls: str = "attempted") -> dict[str, float]:
    """:func:`tool_process_score` of an already parsed text, normalised gold and checked weights."""
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
    if not gold and n_tags and needless_calls == "attempted":  # a broken needless call is still a call
        parts["name"] = parts["parallel"] = 0.0
    parts["process"] = sum(w[k] * parts[k] for k in COMPONENTS)
    return parts


def strict_correct_ratio(pred: Sequence[dict[str, Any]], gold: Sequence[dict[str, Any]]) -> float:
    """ToolPO's action reward ``R_action = sum_g C(g) / |G|`` (the official ``toolpo_correct_ratio``).

    G the gold calls (flat, in step order), P the predictions (calls of valid blocks, in order). Each gold
    call g, in order, takes the *first* unused p with ``p.name == g.name`` and, when g has arguments, every
    key of g in p with ``loose_equal(g[k], p[k])`` (extra keys of p allowed); ``C(g) = 1`` when one is found
    (it is used up), else 0. G empty -> 1 (nothing to verify); P empty -> 0. Gold ``[f(a=1), f(a=2)]``,
    predictions ``[f(a=2, b=0), f(a=1)]``: f(a=1) skips the first (a = 2) and takes the second, f(a=2) takes
    the first: 2 / 2 = 1; predictions ``[f(a=1)]``: 1 / 2.
    """
    if not gold:
        return 1.0
    if not pred:
        return 0.0
    used: set[int] = set()
    correct = 0
    for g in gold:
        args = g["arguments"]
        for j, p in enumerate(pred):
            if j in used or p["name"] != g["name"]:
                continue
            if all(k in p["arguments"] and loose_equal(v, p["arguments"][k]) for k, v in args.items()):
                used.add(j)
                correct += 1
                break
    return correct / len(gold)


def step_plan(gold_steps: Sequence[Sequence[dict[str, Any]]], turn: int) -> list[list[dict[str, Any]]]:
    """Gold step ``turn`` as a one-step plan ``[step]``; ``[]`` (the empty plan) beyond the gold steps."""
    return [list(gold_steps[turn])] if 0 <= turn < len(gold_steps) else []


def tool_turn_scores(tool_turns: Sequence[str], gold_calls: Any, allowed_tools: Any,
                     weights: Mapping[str, float] | None = None,
                     needless_calls: str = "attempted") -> list[dict[str, float]]:
    """Per-turn HierR scores of the tool turns of a rollout (SLCA x TCPO, docs/methods.md §4).

    Tool turn k (0-based) is scored alone against gold step k: ``tool_process_score(turn_k,
    step_plan(gold, k))``, so a turn beyond the gold steps is scored against the empty plan (an extra call
    loses name and parallel, a broken one too with ``needless_calls="attempted"``; stopping would have scored
    0.9). Each dict also holds
    ``exact = 1[name = key = value = 1]``: the turn's calls are exactly gold step k's (names as a multiset,
    every key and value).
    """
    gold = normalize_gold_calls(gold_calls)
    out = []
    for k, text in enumerate(tool_turns):
        parts = tool_process_score(text, step_plan(gold, k), allowed_tools, weights, needless_calls)
        exact = k < len(gold) and parts["name"] == 1 and parts["key"] == 1 and parts["value"] == 1
        out.append({**parts, "exact": float(exact)})
    return out


# ------------------------------------------------------------------------------------------------ BFCL's rules
def decode_calls(calls: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Parsed ``{"name", "arguments"}`` calls as BFCL's model output ``[{name: {param: value}}]``."""
    return [{c["name"]: dict(c["arguments"])} for c in calls]


def bfcl_verdict(row: Mapping[str, Any], text: str) -> dict[str, Any]:
    """BFCL's verdict on the calls of ``text`` (the rollout's replies joined) for a BFCL single-turn ``row``
    (``subset``: its category; ``bfcl_functions`` and ``possible_answer``: JSON strings).

    The calls are those of every ``<tool_call>`` block (:func:`parse_tool_calls`, ``<think>`` stripped). An AST
    category's answer is decoded only when every block parses and every tag is matched (else
    ``ast_decoder:decoder_failed``, as a reply BFCL cannot decode), then checked by
    :func:`~lit_credit.rewards.bfcl_checker.safe_ast_checker`. An irrelevance category is right when no valid
    call was made (BFCL: the reply does not decode to a call; broken call text decodes to none)."""
    parsed = parse_tool_calls(strip_think(text))  # any name: a call to no listed function is still a call
    category = str(row.get("subset", ""))
    calls = decode_calls(parsed.calls)
    if "irrelevance" in category:
        ok = not calls
        return {"valid": ok, "error_type": "" if ok else "irrelevance_error:decoder_success", "calls": calls}
    if not parsed.blocks or parsed.n_valid < len(parsed.blocks) or max(parsed.n_open, parsed.n_close) > len(parsed.blocks):
        return {"valid": False, "error_type": "ast_decoder:decoder_failed", "calls": calls}
    result = bfcl_checker.safe_ast_checker(json.loads(row["bfcl_functions"]), calls,
                                           json.loads(row["possible_answer"]), category)
    return {"valid": bool(result["valid"]), "error_type": result.get("error_type", "") if not result["valid"] else "",
            "calls": calls}


def is_bfcl_row(row: Mapping[str, Any]) -> bool:
    """Whether ``row`` is a BFCL single-turn row (it carries a ``possible_answer``, ``task=bfcl``)."""
    return row.get("possible_answer") is not None


def _refuse_multi_turn(row: Mapping[str, Any]) -> None:
    if row.get("bfcl_ground_truth") is not None:
        raise ValueError(f"row {row.get('id')!r} is a BFCL multi-turn row: reward=hierr scores tool calls against "
                         "gold calls and cannot score it; use reward=bfcl (task=bfcl's default), which scores "
                         "each user turn by BFCL's state and response checks")


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


NO_CALL_SUMMARY = ("zero", "judge")


def _present(response: Any) -> bool:
    """Whether the judge counts ``response``: a non-blank string, or any other value (it is JSON-encoded)."""
    return not isinstance(response, str) or bool(response.strip())


class HierRReward:
    """SLCA-GRPO's reward: ``score = w_process * process + w_summary * summary`` (docs/methods.md §1).

    Row keys (each looked up in the row, then in ``row["reward_model"]["ground_truth"]``):
    ``gold_tool_calls`` (nested or flat form), ``allowed_tools``, ``question`` (or ``question_content``, else
    the last user message of ``row["prompt"]``). A row whose ``allowed_tools`` is absent or empty scores 0
    on every part (the judge is not asked), as in the official reward.

    The rollout text is ``"\\n".join(strip_think(r) for r in replies)`` (complete ``<think>`` blocks
    removed, :func:`strip_think`). ``process`` and its five components come from :func:`tool_process_score`.

    Summary. The judge sees the question, the *real* tool responses and ``final_reply(replies[-1])``;
    ``summary`` is its score. Real responses are the results of executed calls (a good item of a block: an
    allowed tool, an arguments object; a domain error such as an unknown currency is still a result), never
    the error answers an environment gives to unknown tools, bad arguments, malformed or unmatched tags: an
    error to tool-call debris is no fact to summarise (the official judge sees those too; a deliberate
    deviation, as it rewards debris). They come from the first found of: the ``tool_responses`` keyword (the rollout
    loop passes what the environment marked real, :class:`~lit_credit.tasks.toolcall.ToolEnvironment`),
    else the ``<tool_response>`` blocks inside the replies (a caller that passes a whole transcript); and a rollout with no executed call (:attr:`ParsedCalls.executed`) has none
    whatever the source says. ``summary
    = 0`` without a real response (``no_tool_response = 1``), with a reply under 10 characters, or on a
    judge failure (``judge_failed = 1``), as the official reward.

    No-call prompts (gold has no call, e.g. the irrelevant subset), ``no_call_summary``:
    ``"zero"`` (default) scores the summary 0 there without asking the judge, so ``score = process <= 0.9``
    and no reply beats the right direct answer (0.9: a valid call costs name and parallel, 0.45 at best);
    ``"judge"`` is the official reward, which judges such a reply like any other: a valid call to an
    allowed tool and a faithful summary of its result then score 0.45 + 1 = 1.45 > 0.9, a reward for
    calling tools where none is needed.

    Omission (official rule): when gold has at least one call and the think-stripped text has no
    ``<tool_call>`` opening tag (a lone ``</tool_call>`` does not count), ``should_call_but_no_call = 1``,
    ``score = omission_score`` (-0.5) and every component, ``process`` and ``summary`` are 0 (the judge is
    not called; the estimator replaces the summary score by ``score`` anyway).

    Needless calls: ``needless_calls`` (:func:`tool_process_score`; default ``"attempted"``: on a no-call
    prompt any tool tag is a call, so a broken needless call scores 0.35, below a clean one's 0.45; the
    official ``"valid"`` scores it 0.90 like the direct answer). Tool turns beyond the gold steps likewise.

    ToolPO's parts (the official ``reward_fn_toolpo.py``; read by ``credit=toolpo``, logging only otherwise):
    ``toolpo_correct_ratio`` = :func:`strict_correct_ratio` of the valid blocks' calls against the flat gold
    (1 on a no-call prompt, 0 on an omission or a row without allowed tools), and ``solved``, the binary
    outcome ``R_succ``: ``1[summary >= solved_at]`` (default 0.75: a rating of 4 or 5, "correctly uses tool
    results, clear and complete"), 0 on an omission (officially ``score = 0`` there) or a row without allowed
    tools. The official ``R_succ`` asks a separate Solved / Unsolved LLM judge (DeepAgent's prompt) about the
    question and the final reply; here the summary judge's rating is thresholded, so ``solved`` is as noisy as
    the summary judge and, under ``no_call_summary="zero"``, 0 on every no-call prompt.

    Returns a :class:`~lit_credit.types.RewardResult`: ``score``; ``parts`` (floats): the five components,
    ``process``, ``summary``, ``should_call_but_no_call``, ``judge_failed``, ``toolpo_correct_ratio``,
    ``solved`` and the diagnostics ``tool_tag``
    (1 when the text holds any ``<tool_call>``/``</tool_call>`` tag), ``valid_call`` (1 when it holds a valid
    block), ``no_tool_response``, ``gold_steps`` (the number of gold steps; 0 on a no-call prompt); ``turns``
    (lists, one entry per tool turn: every reply but the last, the SLCA segment rule; the rollout batch pads
    them into ``turn_parts`` [B, K]): ``tool_scores`` (each turn's process score against its gold step,
    :func:`tool_turn_scores`), ``tool_turn_mask`` (1 per tool turn) and ``tool_exact``. :meth:`turn_score`
    scores one alternative turn the same way; :attr:`part_weights` are ``w_process`` and ``w_summary``.

    BFCL rows (a ``possible_answer``, ``task=bfcl``): argument values are judged by BFCL's AST rules instead of
    loose equality (:meth:`bfcl_parts`): ``key``, ``value`` (so ``process`` and ``score``) and
    ``toolpo_correct_ratio`` follow BFCL's checker, a new part ``bfcl_valid`` is BFCL's verdict on the whole answer
    (the leaderboard's accuracy), and the first tool turn's ``tool_scores`` / ``tool_exact`` use the same rules.
    Names, format, parallel, summary, omission and zeroing stay HierR's. Every other row is scored as above. A
    BFCL multi-turn row (``bfcl_ground_truth``) is a ``ValueError`` naming ``reward=bfcl``.

    ``replies`` given as one str (not a list) is a caller error, a ``ValueError``; it would otherwise be read
    as one reply per character.
    """

    def __init__(self, w_process: float = 1.0, w_summary: float = 1.0, judge: SummaryJudge | None = None,
                 weights: Mapping[str, float] | None = None, omission_score: float = -0.5,
                 no_call_summary: str = "zero", needless_calls: str = "attempted", solved_at: float = 0.75):
        if no_call_summary not in NO_CALL_SUMMARY:
            raise ValueError(f"reward.no_call_summary={no_call_summary!r}: use 'zero' (no summary reward on a "
                             "prompt whose gold has no call; the safe default) or 'judge' (the official reward)")
        _check_needless(needless_calls)
        self.w_process, self.w_summary, self.omission_score = w_process, w_summary, omission_score
        self.no_call_summary, self.needless_calls, self.solved_at = no_call_summary, needless_calls, solved_at
        self.judge = judge if judge is not None else RubricJudge()
        self.weights = _weights(weights)

    def __call__(self, row: dict[str, Any], replies: list[str],
                 tool_responses: Sequence[str] | None = None,
                 turn_scores: Sequence[float | None] | None = None) -> RewardResult:
        if isinstance(replies, str):
            raise ValueError("replies must be a list of reply strings, one per assistant turn, got one str; "
                             "fix: pass [text]")
        _refuse_multi_turn(row)
        replies = [strip_think(r) if isinstance(r, str) else "" for r in replies or []]
        text = "\n".join(replies)
        gold = normalize_gold_calls(_field(row, "gold_tool_calls"))
        allowed = _field(row, "allowed_tools")
        parsed = parse_tool_calls(text, allowed)
        parts = _process_parts(parsed, gold, self.weights, self.needless_calls)
        missing = not _allowed_set(allowed)  # official: a row without allowed tools scores 0
        omitted = not missing and bool(gold) and OPEN not in text
        responses = self.real_responses(text, bool(parsed.executed), tool_responses)
        summary, failed = 0.0, False
        if omitted or missing:
            parts = dict.fromkeys(parts, 0.0)
        elif gold or self.no_call_summary == "judge":
            result = self.judge(_question(row), responses, final_reply(replies[-1] if replies else ""))
            summary, failed = result.score, result.failed
        score = self.omission_score if omitted else self.w_process * parts["process"] + self.w_summary * summary
        zeroed = omitted or missing
        correct_ratio = 0.0 if zeroed else strict_correct_ratio(parsed.calls, [c for step in gold for c in step])
        solved = float(not zeroed and summary >= self.solved_at)
        turns = tool_turn_scores(replies[:-1], gold, allowed, self.weights, self.needless_calls)
        if missing:
            turns = [dict.fromkeys(t, 0.0) for t in turns]
        result = RewardResult(
            score,
            parts={**parts, "summary": summary, "should_call_but_no_call": float(omitted),
                   "judge_failed": float(failed), "toolpo_correct_ratio": correct_ratio, "solved": solved,
                   "no_tool_response": float(not any(_present(r) for r in responses)),
                   "tool_tag": float(parsed.n_open + parsed.n_close > 0),
                   "valid_call": float(parsed.n_valid > 0), "gold_steps": float(len(gold))},
            turns={"tool_scores": [t["process"] for t in turns], "tool_turn_mask": [1.0] * len(turns),
                   "tool_exact": [t["exact"] for t in turns]})
        return self.bfcl_parts(row, replies, result) if is_bfcl_row(row) else result

    def bfcl_parts(self, row: Mapping[str, Any], replies: Sequence[str], result: RewardResult) -> RewardResult:
        """HierR's ``result`` for a BFCL row with BFCL's argument rules (``replies``: think-stripped).

        - ``bfcl_valid`` (new part): BFCL's verdict on the whole answer (:func:`bfcl_verdict`);
        - unless the row's possible answer is empty (irrelevance), the reply omits the call, or the row has no
          allowed tools (HierR's parts hold there): ``key`` and ``value``
          (:func:`~lit_credit.rewards.bfcl_checker.key_value_scores`: each argument accepted as BFCL accepts it,
          any of its possible values, strings standardised, an optional argument left out; a call BFCL accepts
          scores 1 and 1), so ``process`` and ``score``; ``toolpo_correct_ratio``
          (:func:`~lit_credit.rewards.bfcl_checker.correct_call_ratio`: a possible-answer call counts when a
          distinct predicted call passes BFCL's per-call check); the first tool turn's ``tool_scores`` and
          ``tool_exact`` (:meth:`bfcl_turn_parts`)."""
        parts = dict(result.parts)
        parts["bfcl_valid"] = float(bfcl_verdict(row, "\n".join(replies))["valid"])
        answer = json.loads(row["possible_answer"])
        turns = {k: list(v) for k, v in result.turns.items()}
        if not answer or parts["should_call_but_no_call"] or not _allowed_set(_field(row, "allowed_tools")):
            return RewardResult(result.score, parts=parts, turns=turns, extras=result.extras)
        functions = json.loads(row["bfcl_functions"])
        calls = decode_calls(parse_tool_calls("\n".join(replies), _field(row, "allowed_tools")).calls)
        parts["key"], parts["value"] = bfcl_checker.key_value_scores(functions, calls, answer)
        parts["process"] = sum(self.weights[k] * parts[k] for k in self.weights)
        parts["toolpo_correct_ratio"] = bfcl_checker.correct_call_ratio(functions, calls, answer)
        score = self.w_process * parts["process"] + self.w_summary * parts["summary"]
        if turns.get("tool_scores"):
            first = self.bfcl_turn_parts(row, replies[0])
            turns["tool_scores"][0], turns["tool_exact"][0] = first["process"], first["exact"]
        return RewardResult(score, parts=parts, turns=turns, extras=result.extras)

    def bfcl_turn_parts(self, row: Mapping[str, Any], text: str) -> dict[str, float]:
        """The first tool turn's process score on a BFCL row with BFCL's argument rules, and ``exact`` = BFCL's
        verdict on it (``text`` think-stripped)."""
        answer = json.loads(row["possible_answer"])
        allowed = _field(row, "allowed_tools")
        parts = tool_process_score(text, normalize_gold_calls(_field(row, "gold_tool_calls")), allowed, self.weights,
                                   self.needless_calls)
        if answer:
            calls = decode_calls(parse_tool_calls(text, allowed).calls)
            parts["key"], parts["value"] = bfcl_checker.key_value_scores(json.loads(row["bfcl_functions"]), calls,
                                                                         answer)
            parts["process"] = sum(self.weights[k] * parts[k] for k in self.weights)
        return {**parts, "exact": float(bool(answer) and bfcl_verdict(row, text)["valid"])}

    @property
    def part_weights(self) -> dict[str, float]:
        """The weight of each part in ``score = w_process * process + w_summary * summary``: what SLCA's
        segment weights follow by default (``batch.reward_weights``)."""
        return {"process": self.w_process, "summary": self.w_summary}

    @staticmethod
    def real_responses(text: str, called: bool, tool_responses: Sequence[str] | None) -> list[str]:
        """The tool responses the judge may see: none when the rollout made no call an environment executes
        (``called`` is False: :attr:`ParsedCalls.executed` is empty, every response it got answered debris),
        else ``tool_responses`` when given, else the ``<tool_response>`` blocks of ``text``. Non-strings are
        JSON-encoded by the judge."""
        if not called:
            return []
        return list(tool_responses) if tool_responses is not None else extract_tool_responses(text)

    def turn_score(self, row: dict[str, Any], turn: int, reply: str) -> float:
        """The process score of ``reply`` as tool turn ``turn`` (0-based) of ``row``, against gold step
        ``turn`` (:func:`tool_turn_scores`): how TCPO's counterfactual alternatives of a tool turn are scored."""
        _refuse_multi_turn(row)
        gold, allowed = normalize_gold_calls(_field(row, "gold_tool_calls")), _field(row, "allowed_tools")
        if not _allowed_set(allowed):  # official: a row without allowed tools scores 0
            return 0.0
        text = strip_think(reply) if isinstance(reply, str) else ""
        if turn == 0 and is_bfcl_row(row):  # BFCL's argument rules (bfcl_turn_parts)
            return self.bfcl_turn_parts(row, text)["process"]
        return tool_process_score(text, step_plan(gold, turn), allowed, self.weights, self.needless_calls)["process"]
