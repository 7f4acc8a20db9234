"""Task ``toolcall``: SLCA-GRPO's tool-calling setting (docs/methods.md §1) on a synthetic tool world.

Pieces: :class:`ToolSimulator` (deterministic programmatic tool backend) and :class:`LLMToolSimulator` (a
frozen model behind the same ``respond(call, schema)``), :class:`ToolEnvironment` (answers every
``<tool_call>`` block of a reply with ``tool`` messages; a reply without a tag ends the episode),
:class:`ToolCallTask` (synthetic prompts of the subsets single / parallel / multi / irrelevant, or the rows of
a public SLCA RL parquet via :func:`load_toucan_parquet`) and its gold demonstrations. The ``chain`` subset
(two or three steps, each copying a value of the previous response) is the ``toolcall_multistep`` task.

Row format (every row, same types): ``prompt`` (list of ``{"role", "content"}``), ``tools`` (JSON string of
the allowed tools' OpenAI schemas), ``gold_tool_calls`` (JSON string of the nested steps x calls list),
``allowed_tools`` (list of str), ``question``, ``subset``, ``id`` (str). Tool arguments live inside JSON
strings because HF datasets merges dicts with different keys into one struct with None gaps.
"""
from __future__ import annotations

import glob
import itertools
import json
import math
import os
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import datasets

from lit_credit.backends import BackendFailure, NotRetried, Retry
from lit_credit.rewards.hierr import CLOSE, OPEN, ToolCallBlock, normalize_gold_calls, parse_tool_calls
from lit_credit.tasks.base import Feedback, Task, TurnEnvironment, disjoint_train, heldout_split
from lit_credit.tasks.tool_catalog import (
    CATALOG_VERSION,
    HANDLERS,
    SCHEMAS,
    SUBSETS,
    TEMPLATES,
    TEMPLATES_BY_ID,
    TOOLS_INSTRUCTION,
    VOCAB,
    Template,
    _canon,
    call_hash,
    dumps,
    fact,
    tool_signature,
)

DEFAULT_SUBSETS: dict[str, float] = {"single": 0.4, "parallel": 0.2, "multi": 0.2, "irrelevant": 0.2}
TRUNCATED = "...[truncated]"


def error_json(message: str) -> str:
    """A tool error response: ``{"error":"<message>"}``."""
    return dumps({"error": message})


def truncate(text: str, max_chars: int) -> str:
    """``text`` cut to at most ``max_chars`` characters, ending in ``...[truncated]`` when cut."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    return text[: max(0, max_chars - len(TRUNCATED))] + TRUNCATED[: max_chars]


def schema_name(schema: Any) -> str | None:
    """The function name of an OpenAI tool schema (``{"function": {"name"}}`` or bare ``{"name"}``)."""
    if not isinstance(schema, Mapping):
        return None
    fn = schema.get("function") if isinstance(schema.get("function"), Mapping) else schema
    name = fn.get("name")
    return name if isinstance(name, str) else None


def _as_openai(schema: Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(schema.get("function"), Mapping):
        return dict(schema)
    return {"type": "function", "function": dict(schema)}


def parse_tools(tools: Any) -> list[dict[str, Any]]:
    """Tool schemas from a JSON string, a list, or None, in the OpenAI form; never raises (bad input: [])."""
    if isinstance(tools, str):
        try:
            tools = json.loads(tools) if tools.strip() else []
        except ValueError:
            return []
    if isinstance(tools, Mapping):
        tools = [tools]
    if not isinstance(tools, (list, tuple)):
        return []
    return [_as_openai(t) for t in tools if schema_name(t) is not None]


@lru_cache(maxsize=512)
def _schemas_from_json(tools: str) -> dict[str, dict[str, Any]]:
    return {schema_name(s): s for s in parse_tools(tools)}


def schemas_by_name(tools: Any) -> dict[str, dict[str, Any]]:
    """``{name: schema}`` of a row's ``tools`` (JSON string or list); cached for strings."""
    if isinstance(tools, str):
        return dict(_schemas_from_json(tools))
    return {schema_name(s): s for s in parse_tools(tools)}


# ------------------------------------------------------------------------------------------------ simulators
_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda x: isinstance(x, str),
    "number": lambda x: isinstance(x, (int, float)) and not isinstance(x, bool),
    "integer": lambda x: (isinstance(x, int) and not isinstance(x, bool)) or (isinstance(x, float)
                                                                                and x.is_integer()),
    "boolean": lambda x: isinstance(x, bool),
    "array": lambda x: isinstance(x, list),
    "object": lambda x: isinstance(x, dict),
    "null": lambda x: x is None,
}


def validate_arguments(arguments: Any, schema: Mapping[str, Any]) -> str | None:
    """The first problem of ``arguments`` against an OpenAI tool schema, or None when they fit.

    Checks: a dict; no argument outside ``properties`` (when properties are declared); every ``required``
    one present; each declared JSON ``type`` (or list of types) and ``enum``. Unknown type names pass.
    """
    if not isinstance(arguments, Mapping):
        return "arguments must be a JSON object"
    fn = schema.get("function") if isinstance(schema.get("function"), Mapping) else schema
    params = fn.get("parameters") if isinstance(fn.get("parameters"), Mapping) else {}
    props = params.get("properties") if isinstance(params.get("properties"), Mapping) else {}
    required = params.get("required") if isinstance(params.get("required"), list) else []
    if props:
        extra = [k for k in arguments if k not in props]
        if extra:
            return f"unexpected argument: {extra[0]}"
    missing = [k for k in required if k not in arguments]
    if missing:
        return f"missing argument: {missing[0]}"
    for key, value in arguments.items():
        spec = props.get(key) if isinstance(props.get(key), Mapping) else {}
        types = spec.get("type")
        types = [types] if isinstance(types, str) else types if isinstance(types, list) else []
        checks = [_JSON_TYPES[t] for t in types if t in _JSON_TYPES]
        if checks and not any(c(value) for c in checks):
            return f"argument {key} must be {' or '.join(types)}"
        if isinstance(spec.get("enum"), list) and value not in spec["enum"]:
            return f"argument {key} must be one of {spec['enum']}"
    return None


class ToolBackend:
    """Answers a tool call with a JSON string; :meth:`respond` never raises.

    ``respond(call, schema=None)``: ``call`` is ``{"name", "arguments"}`` (``parameters`` accepted);
    ``schema`` is the tool's schema from the row, else the catalog's is used. A call without a string name,
    with non-dict arguments, to a tool with no schema, or whose arguments fail :func:`validate_arguments`
    gets ``{"error": ...}``; a valid call goes to :meth:`answer`.
    """

    def __init__(self, catalog: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.catalog: dict[str, Mapping[str, Any]] = dict(SCHEMAS if catalog is None else catalog)

    def __call__(self, call: Any, schema: Mapping[str, Any] | None = None) -> str:
        return self.respond(call, schema)

    def respond(self, call: Any, schema: Mapping[str, Any] | None = None) -> str:
        try:
            if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
                return error_json("a call needs a string name")
            name = call["name"]
            args = call.get("arguments", call.get("parameters"))
            schema = schema if isinstance(schema, Mapping) else self.catalog.get(name)
            if schema is None:
                return error_json(f"unknown tool: {name}")
            problem = validate_arguments(args, schema)
            if problem is not None:
                return error_json(problem)
            return self.answer(name, dict(args), schema)
        except NotRetried:
            raise
        except Exception as err:  # a backend bug is an error response, never a crash of the rollout
            return error_json(f"tool failed: {type(err).__name__}")

    def answer(self, name: str, arguments: dict[str, Any], schema: Mapping[str, Any]) -> str:
        raise NotImplementedError


class ToolSimulator(ToolBackend):
    """Deterministic programmatic tools: the response is a pure function of the call.

    A catalog tool (:data:`~lit_credit.tasks.tool_catalog.HANDLERS`) whose arguments fit the catalog schema
    gets its handler's compact JSON (values derived from :func:`~lit_credit.tasks.tool_catalog.call_hash`
    of the canonical arguments, e.g. the temperature of a city on a date) or its domain error
    (``{"error": "unknown currency code: XYZ"}``). Any other tool with a schema (e.g. a Toucan row's) gets a
    generic ``{"tool", "status": "ok", "result_id"}``.
    """

    def answer(self, name: str, arguments: dict[str, Any], schema: Mapping[str, Any]) -> str:
        h = call_hash(name, arguments)
        if name in HANDLERS and validate_arguments(arguments, SCHEMAS[name]) is None:
            out = HANDLERS[name](arguments, h)
            return error_json(out) if isinstance(out, str) else dumps(out)
        return dumps({"tool": name, "status": "ok", "result_id": h % 100000})


SIMULATOR_PROMPT = """You simulate a tool. Tool schema:
{schema}
Call:
{call}
Reply with only the tool's result as one compact JSON object, plausible and consistent with the call."""


def extract_json(text: str) -> Any:
    """The first JSON object or array in ``text`` (chatter and code fences around it are skipped), else None."""
    if not isinstance(text, str):
        return None
    decoder = json.JSONDecoder()
    for m in re.finditer(r"[\[{]", text):
        try:
            return decoder.raw_decode(text, m.start())[0]
        except (ValueError, RecursionError):
            continue
    return None


class LLMToolSimulator(ToolBackend):
    """A frozen model as the tool backend: ``generate_fn(prompt) -> text`` (an HF model, a vLLM engine, ...).

    Invalid calls are answered by :class:`ToolBackend` without asking the model. Otherwise the prompt
    (:data:`SIMULATOR_PROMPT`, the schema and the call as JSON) is sent through
    :class:`~lit_credit.backends.Retry` (name ``simulator``: up to ``1 + max_retries`` calls, exponential
    ``backoff``, a per-call ``timeout``) until the text holds a JSON object or array (:func:`extract_json`),
    returned compact; when every try raises, times out or has no JSON the answer is
    ``{"error": "tool simulator failed"}`` and ``failures`` is incremented (``backend/simulator/failures``).
    ``calls`` counts generate_fn calls. Decoding settings belong to ``generate_fn`` (greedy is advisable).
    """

    def __init__(self, generate_fn: Callable[[str], str], catalog: Mapping[str, Mapping[str, Any]] | None = None,
                 max_retries: int = 1, backoff: float = 0.5, timeout: float | None = None) -> None:
        super().__init__(catalog)
        self.generate_fn, self.retry = generate_fn, Retry("simulator", max_retries, backoff, timeout)
        self.calls = self.failures = 0

    def answer(self, name: str, arguments: dict[str, Any], schema: Mapping[str, Any]) -> str:
        prompt = SIMULATOR_PROMPT.format(schema=dumps(schema), call=dumps({"name": name, "arguments": arguments}))

        def ask() -> Any:
            self.calls += 1
            return extract_json(self.generate_fn(prompt))

        try:
            return dumps(self.retry(ask, accept=lambda obj: isinstance(obj, (dict, list))))
        except BackendFailure:
            self.failures += 1
            return error_json("tool simulator failed")


# ------------------------------------------------------------------------------------------------ environment
_ERRORS = {
    "json": "invalid JSON in <tool_call>",
    "type": "a <tool_call> must hold a JSON object or a list of objects",
    "name": "a call needs a string name",
    "arguments": "a call needs an arguments object",
    "empty": "a <tool_call> list needs at least one call",
}


def _item_error(block: ToolCallBlock, i: int, reason: str) -> str:
    """The error answer to item ``i`` of ``block`` (failed with ``reason``)."""
    if reason != "unknown_tool":
        return _ERRORS.get(reason, "invalid tool call")
    obj = json.loads(block.raw)  # the block parsed, so this does
    return f"unknown tool: {(obj if isinstance(obj, list) else [obj])[i]['name']}"


def allowed_tools_of(row: Mapping[str, Any]) -> list[str] | None:
    """The row's ``allowed_tools``, else the names of its ``tools`` schemas, else None (anything goes)."""
    allowed = row.get("allowed_tools")
    if allowed is not None and not isinstance(allowed, str):
        return [t for t in allowed if isinstance(t, str)]
    if isinstance(allowed, str):
        return [allowed]
    names = list(schemas_by_name(row.get("tools")))
    return names or None


class ToolEnvironment(TurnEnvironment):
    """Plays the tools against the policy, one assistant turn at a time, as the official environment does.

    ``step(row, turn, reply)``: with ``<think>`` stripped, a reply with no ``<tool_call>``/``</tool_call>``
    tag is final: ``done=True``, no messages. Otherwise the blocks of
    :func:`~lit_credit.rewards.hierr.parse_tool_calls` (against the row's allowed tools) are read item by item,
    in order (a list block of k items = k parallel calls):

    - a good item (allowed tool, arguments object) is a *call*: the simulator answers it, also when another
      item of its block is bad (the reward still scores that block invalid);
    - an item naming an unknown tool, or with arguments that are no object, gets an *error answer*;
    - *debris*, a body that is no JSON object or list, an item that is no object or has no string name,
      and tags outside any complete block: with ``debris_ends_episode`` (default, the official behaviour)
      it gets no answer, and a turn with nothing answered ends the episode (``done=True``, no messages), so
      the debris turn is the final reply; with ``debris_ends_episode=False`` each gets an error answer and
      the episode goes on.

    At most ``max_calls_per_turn`` answers are produced; the rest are dropped (with
    ``debris_ends_episode=False`` one more error says so). Each answer is cut to ``max_response_chars``
    (:func:`truncate`) and becomes a ``{"role": "tool"}`` message. ``done`` is also True from turn
    ``max_turns - 1`` on (the messages are still returned). ``info["tool_responses"]`` holds the *real*
    responses only, the answers to calls, which the summary judge may see; ``info["real"]`` one flag per
    message. Error answers are messages the policy reads, never facts for the judge (the official judge sees
    them too; this deviation closes the reward for debris). The row is never mutated (it is shared by the n
    rollouts of a prompt). ``score`` is None.
    """

    def __init__(self, simulator: ToolBackend | None = None, max_turns: int = 10, max_response_chars: int = 300,
                 max_calls_per_turn: int = 8, debris_ends_episode: bool = True) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns={max_turns}: must be >= 1")
        self.simulator = simulator if simulator is not None else ToolSimulator()
        self.max_turns, self.max_response_chars = max_turns, max_response_chars
        self.max_calls_per_turn, self.debris_ends_episode = max_calls_per_turn, debris_ends_episode

    def answers(self, row: Mapping[str, Any], reply: str) -> list[tuple[str, bool]] | None:
        """Each tool answer to ``reply`` (truncated) with whether it is *real* (the simulator's answer to a
        call, whatever it says: a domain error or an argument the schema rejects is the tool's answer), or
        None when the reply has no tool-call tag; ``[]`` when it has tags but nothing is answered."""
        parsed = parse_tool_calls(reply, allowed_tools_of(row))
        if parsed.n_open == 0 and parsed.n_close == 0:
            return None
        items: list[tuple[dict[str, Any] | None, str, bool]] = []  # (call, error, is debris)
        for block in parsed.blocks:
            if not block.items:  # the body is no JSON object or list, or the empty list
                items.append((None, _ERRORS[block.reason], True))
            for i, (c, reason) in enumerate(block.items):
                items.append((c, "", False) if c is not None else
                             (None, _item_error(block, i, reason), reason in ("type", "name")))
        if max(parsed.n_open, parsed.n_close) > len(parsed.blocks):
            items.append((None, f"unmatched tag: write {OPEN}{{...}}{CLOSE}", True))
        if self.debris_ends_episode:
            items = [it for it in items if not it[2]]
        if len(items) > self.max_calls_per_turn:
            notice = (None, f"too many calls: at most {self.max_calls_per_turn} per turn", True)
            items = items[: self.max_calls_per_turn] + ([] if self.debris_ends_episode else [notice])
        schemas = schemas_by_name(row.get("tools"))
        return [(truncate(self.simulator.respond(c, schemas.get(c["name"])) if c is not None else error_json(e),
                          self.max_response_chars), c is not None) for c, e, _ in items]

    def respond(self, row: Mapping[str, Any], reply: str) -> list[str] | None:
        """The tool answers to ``reply`` (truncated, real or not: :meth:`answers`), or None when the reply
        has no tool-call tag."""
        answered = self.answers(row, reply)
        return None if answered is None else [r for r, _ in answered]

    def step(self, row: dict[str, Any], turn: int, reply: str) -> Feedback:
        answered = self.answers(row, reply)
        if not answered:
            return Feedback(done=True, info={"tool_responses": [], "real": []})
        return Feedback(done=turn + 1 >= self.max_turns,
                        messages=[{"role": "tool", "content": r} for r, _ in answered],
                        info={"tool_responses": [r for r, real in answered if real],
                              "real": [real for _, real in answered]})


# ------------------------------------------------------------------------------------------------ rows
def tool_call_text(step: Sequence[Mapping[str, Any]]) -> str:
    """The gold assistant turn of one step: one ``<tool_call>`` block, a JSON list when the step is parallel."""
    calls = [{"name": c["name"], "arguments": c["arguments"]} for c in step]
    return f"{OPEN}{dumps(calls[0] if len(calls) == 1 else calls)}{CLOSE}"


def make_row(question: str, tools: Sequence[Mapping[str, Any]], gold: Any, subset: str, id: str,
             prompt: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """A task row (the module docstring's format); ``gold`` in any form :func:`normalize_gold_calls` reads."""
    tools = parse_tools(list(tools))
    messages = prompt if prompt is not None else [{"role": "user", "content": question}]
    return {
        "prompt": [{"role": str(m.get("role", "")), "content": str(m.get("content") or "")} for m in messages],
        "tools": dumps(tools),
        "gold_tool_calls": dumps(normalize_gold_calls(gold)),
        "allowed_tools": [schema_name(t) for t in tools],
        "question": question,
        "subset": subset,
        "id": id,
    }


def gold_conversation(row: Mapping[str, Any], simulator: ToolBackend, max_response_chars: int = 300,
                      answer: str | None = None, plan: list[list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """The gold demonstration of a row: prompt, then per gold step an assistant ``<tool_call>`` turn and the
    simulator's (truncated) tool messages, then a summary stating one fact per call
    (:func:`~lit_credit.tasks.tool_catalog.fact`). Without gold calls the reply is ``answer``. ``plan``
    (normalised steps) demonstrates other calls than the row's gold ones, with the row's prompt and tools."""
    messages = [dict(m) for m in row["prompt"]]
    gold = normalize_gold_calls(row["gold_tool_calls"]) if plan is None else plan
    tools = parse_tools(row["tools"])
    if not gold:
        if answer is None:
            raise ValueError(f"row {row.get('id')!r} has no gold calls and no direct answer")
        return {"messages": [*messages, {"role": "assistant", "content": answer}], "tools": tools}
    schemas = {schema_name(s): s for s in tools}
    facts = []
    for step in gold:
        messages.append({"role": "assistant", "content": tool_call_text(step)})
        for c in step:
            response = truncate(simulator.respond(c, schemas.get(c["name"])), max_response_chars)
            messages.append({"role": "tool", "content": response})
            facts.append(fact(c["name"], c["arguments"], response))
    messages.append({"role": "assistant", "content": " ".join(facts)})
    return {"messages": messages, "tools": tools}


# ------------------------------------------------------------------------------------------------ parquet
def _to_py(x: Any) -> Any:
    if hasattr(x, "tolist") and not isinstance(x, (str, bytes)):
        x = x.tolist()
    if isinstance(x, Mapping):
        return {k: _to_py(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_to_py(v) for v in x]
    return x


def _drop_struct_gaps(gold: Any) -> Any:
    """Arguments stored as a parquet struct carry None for the keys other calls had: drop them."""
    if isinstance(gold, list):
        return [_drop_struct_gaps(g) for g in gold]
    if isinstance(gold, dict):
        out = dict(gold)
        for key in ("arguments", "parameters"):
            if isinstance(out.get(key), dict):
                out[key] = {k: v for k, v in out[key].items() if v is not None}
        return out
    return gold


def _parquet_files(path: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    if not isinstance(path, (str, os.PathLike)):
        return [f for p in path for f in _parquet_files(p)]
    p = Path(os.path.expanduser(str(path)))
    if p.is_dir():
        files = sorted(str(f) for f in p.rglob("*.parquet"))
    else:
        files = sorted(glob.glob(str(p))) if any(ch in str(p) for ch in "*?[") else [str(p)]
    if not files:
        raise FileNotFoundError(f"no parquet file at {path}")
    return files


def toucan_row(record: Mapping[str, Any], fallback_id: str) -> dict[str, Any]:
    """One row of the public SLCA RL parquet (docs/methods.md §1) in the task's row format."""
    record = _to_py(dict(record))
    rm = record.get("reward_model") if isinstance(record.get("reward_model"), Mapping) else {}
    gt = rm.get("ground_truth") if isinstance(rm.get("ground_truth"), Mapping) else {}
    if isinstance(rm.get("ground_truth"), str):
        gt = json.loads(rm["ground_truth"])
    extra = record.get("extra_info") if isinstance(record.get("extra_info"), Mapping) else {}
    prompt = [m for m in record.get("prompt") or [] if isinstance(m, Mapping)]
    tools = parse_tools(record.get("tools")) or parse_tools(gt.get("tool_schemas"))
    question = gt.get("question_content")
    if not isinstance(question, str):
        users = [m.get("content") for m in prompt if m.get("role") == "user"]
        question = str(users[-1]) if users else ""
    gold = _drop_struct_gaps(gt.get("gold_tool_calls"))
    allowed = gt.get("allowed_tools")
    row = make_row(question, tools, gold, str(gt.get("subset_name") or "unknown"),
                   str(extra.get("id", extra.get("index", fallback_id))), prompt or None)
    if allowed is not None:
        row["allowed_tools"] = [str(t) for t in ([allowed] if isinstance(allowed, str) else allowed)]
    return row


def load_toucan_parquet(path: str | os.PathLike | Sequence[str | os.PathLike]) -> datasets.Dataset:
    """The public SLCA RL split (Toucan-derived parquet; a file, a directory, a glob or a list of them) as
    task rows. Columns read: ``prompt``, ``tools`` (JSON string; else ``ground_truth.tool_schemas``),
    ``reward_model.ground_truth`` (``allowed_tools``, ``gold_tool_calls`` nested, flat names or ``[]``,
    ``question_content``, ``subset_name``) and ``extra_info`` (``id``/``index`` for the row id, else
    ``<file stem>-<row>``). ``data_source`` is not needed. Gold goes through :func:`normalize_gold_calls`
    (struct-typed arguments lose their None gaps first) and is stored as a JSON string.
    """
    return datasets.Dataset.from_list(toucan_rows(path))


def toucan_rows(path: str | os.PathLike | Sequence[str | os.PathLike]) -> list[dict[str, Any]]:
    """:func:`load_toucan_parquet` as a list of row dicts."""
    import pyarrow.parquet as pq

    return [toucan_row(record, f"{Path(file).stem}-{i}")
            for file in _parquet_files(path) for i, record in enumerate(pq.read_table(file).to_pylist())]


# ------------------------------------------------------------------------------------------------ task
def _names(subsets: Any) -> list[str]:
    if isinstance(subsets, str):
        return [s for s in re.split(r"[,\s]+", subsets) if s]
    return [str(s) for s in subsets]


def _subset_weights(subsets: Any) -> dict[str, float]:
    if subsets is None:
        return dict(DEFAULT_SUBSETS)
    if isinstance(subsets, Mapping):
        weights = {str(k): float(v) for k, v in subsets.items()}
    else:
        weights = {s: 1.0 for s in _names(subsets)}
    bad = set(weights) - set(SUBSETS)
    if bad or any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
        raise ValueError(f"task.subsets={subsets!r}: use names of {list(SUBSETS)} (a list, or a mapping to "
                         f"non-negative weights with a positive sum)")
    return {s: w for s, w in weights.items() if w > 0}


def apportion(total: int, weights: Mapping[str, float]) -> dict[str, int]:
    """Integer counts summing to ``total`` in proportion to ``weights`` (largest remainder, ties by order)."""
    norm = sum(weights.values())
    exact = {k: total * w / norm for k, w in weights.items()}
    counts = {k: int(v) for k, v in exact.items()}
    order = sorted(weights, key=lambda k: (-(exact[k] - counts[k]), list(weights).index(k)))
    for k in order[: total - sum(counts.values())]:
        counts[k] += 1
    return counts


Key = tuple[str, tuple[Any, ...]]


@cache
def _single_tool(template_id: str) -> str | None:
    """The tool a ``single`` template calls (its gold on the first valid values), else None."""
    t = TEMPLATES_BY_ID[template_id]
    if t.subset != "single" or t.gold is None:
        return None
    values = next(vs for vs in itertools.product(*(VOCAB[v][: len(t.slots)] for _, v in t.slots)) if t.valid(vs))
    return t.gold(dict(zip((n for n, _ in t.slots), values)), lambda c: {})[0][0]["name"]


def content_key(row: Mapping[str, Any]) -> str:
    """A row's content key: what the policy must call, as the reward scores it. With gold calls, the steps in
    order (multi-step turns are scored step by step), each step's calls as a sorted list (the calls of one
    parallel step are matched in any order), each call its name and canonical arguments (sorted keys; strings
    trimmed and case-folded, numbers as floats: :func:`~lit_credit.rewards.hierr.loose_equal` matches them so).
    So two phrasings of one request (``What's the weather in Paris on ...`` / ``Will it rain in Paris on
    ...``) are one key, and so are ``A and B`` / ``B and A`` in a parallel question. Without gold calls (the
    irrelevant subset: the direct answer is the content) the question itself, case-folded and
    whitespace-collapsed."""
    gold = normalize_gold_calls(row["gold_tool_calls"])
    if gold:
        return dumps(["calls", [sorted(json.dumps([c["name"], _canon(c["arguments"])], sort_keys=True,
                                                  ensure_ascii=False) for c in step) for step in gold]])
    return dumps(["direct", " ".join(str(row["question"]).casefold().split())])


def question_key(row: Mapping[str, Any]) -> str:
    """A parquet row's repeat key: its question, case-folded, whitespace collapsed."""
    return " ".join(str(row["question"]).casefold().split())


def _demonstrable(row: Mapping[str, Any]) -> bool:
    """Gold calls exist and each fits its schema (flat gold, names without arguments, would teach errors)."""
    gold = normalize_gold_calls(row["gold_tool_calls"])
    schemas = schemas_by_name(row["tools"])
    return bool(gold) and all(c["name"] in schemas and validate_arguments(c["arguments"], schemas[c["name"]]) is None
                              for step in gold for c in step)


class ToolCallTask(Task):
    """Tool calling with a gold call plan per prompt (SLCA-GRPO, docs/methods.md §1).

    Synthetic mode (default): questions from the templates of :mod:`~lit_credit.tasks.tool_catalog`, values
    from its small vocabularies (``values_per_slot=k``: each vocabulary's first k values only, so a policy
    that cannot yet copy a value from the question still guesses it right 1 time in k); subsets ``single`` (one call), ``parallel`` (one step, two calls in one
    block), ``multi`` (two sequential steps; some second steps use the first result, computed with the
    programmatic simulator), ``irrelevant`` (gold ``[]``; the ideal reply answers directly), ``chain`` (two or
    three steps, each later call copying a value of the previous response). ``subsets``:
    None (:data:`DEFAULT_SUBSETS`), names (equal weights; a list or a comma-separated string) or
    ``{name: weight}``; each split holds exactly the apportioned count per subset (:func:`apportion`).
    A prompt offers the gold tools plus ``randint(1, max_distractors)`` distractors (irrelevant: 1 to
    ``max(1, max_distractors)`` random tools), shuffled. An instance is a (template, values) key, its content
    the gold calls (:func:`content_key`: two phrasings of one call, or two orders of one parallel step, are one
    content); the test split is the first ``num_test`` distinct contents of a seeded draw per subset and train
    the next ``num_train`` distinct instances whose content is none of those
    (:func:`~lit_credit.tasks.base.heldout_split`), so the splits are disjoint in content, the test split does
    not depend on ``num_train``, and everything is a function of ``seed``. Demonstrations skip test contents,
    and with ``disjoint_demonstrations`` the train contents too: the RL prompts are then as new to an SFT start as the held-out ones (with a small
    ``values_per_slot`` an SFT start otherwise memorises the train questions and RL has nothing left there).
    ``wrong_tool_demonstrations=p`` makes the demonstrator noisy: a fraction p of the demonstrations of
    questions with gold calls and a distractor in the prompt (irrelevant ones never; synthetic mode only) call
    a distractor at one of their steps instead, after the gold steps before it
    (:meth:`wrong_tool_demonstration`; on n-step questions each step is the wrong one in a fraction p / n),
    so an SFT start picks the right tool less often and RL has a tool choice to sharpen.

    Parquet mode (``parquet_path``): rows from :func:`load_toucan_parquet`; an explicit ``subsets`` keeps
    the rows whose ``subset`` is named (weights ignored). The test split is ``test_parquet_path`` if given,
    else ``num_test`` rows drawn with ``seed``; ``num_train`` caps the train rows (None: all). The row split is
    kept as drawn (the rows are real requests, whose gold calls are not a template's: flat-gold rows carry tool
    names only, so a call key would merge different requests); only a train row whose question repeats a test
    row's (case-folded, whitespace collapsed) is dropped.
    Demonstrations are built from the train rows whose gold calls fit their schemas (simulator responses,
    one fact per call); flat-gold rows (names only) and irrelevant rows (no direct answer known) are skipped.

    ``environment()`` is a :class:`ToolEnvironment` with ``simulator`` (default :class:`ToolSimulator`),
    ``max_turns``, ``max_response_chars`` and ``debris_ends_episode``.
    """

    name = "toolcall"

    def __init__(self, num_train: int | None = 1000, num_test: int = 100, subsets: Any = None,
                 max_distractors: int = 2, seed: int = 0, parquet_path: Any = None,
                 test_parquet_path: Any = None, max_turns: int = 10, max_response_chars: int = 300,
                 simulator: ToolBackend | None = None, debris_ends_episode: bool = True,
                 values_per_slot: int | None = None, disjoint_demonstrations: bool = False,
                 wrong_tool_demonstrations: float = 0.0) -> None:
        if max_distractors < 0:
            raise ValueError(f"task.max_distractors={max_distractors}: must be >= 0")
        if num_test < 0 or (num_train is not None and num_train < 0):
            raise ValueError(f"task.num_train={num_train}, task.num_test={num_test}: must be >= 0")
        if values_per_slot is not None and (isinstance(values_per_slot, bool) or not isinstance(values_per_slot, int)
                                            or values_per_slot < 1):
            raise ValueError(f"task.values_per_slot={values_per_slot!r}: must be a positive integer or null for "
                             "every value")
        if isinstance(wrong_tool_demonstrations, bool) or not 0.0 <= float(wrong_tool_demonstrations) < 1.0:
            raise ValueError(f"task.wrong_tool_demonstrations={wrong_tool_demonstrations!r}: must be a fraction in "
                             "[0, 1) (0: every demonstration calls the gold tools)")
        if parquet_path is None and num_train is None:
            raise ValueError("task.num_train=None is only allowed with task.parquet_path (all rows)")
        if parquet_path is not None and wrong_tool_demonstrations:
            raise ValueError(f"task.wrong_tool_demonstrations={wrong_tool_demonstrations}: parquet demonstrations are "
                             "the rows' gold conversations; the noisy demonstrator needs synthetic questions (set it "
                             "to 0 with task.parquet_path)")
        self.parquet_mode = parquet_path is not None
        self.weights = _subset_weights(subsets) if not self.parquet_mode else (
            None if subsets is None else {str(s): 1.0 for s in _names(subsets)})
        # Scalars only enter the embedded-policy cache key; so the subsets and paths go in as strings.
        self.subsets_key = dumps(self.weights)
        self.parquet_key = dumps([str(parquet_path), str(test_parquet_path)]) if self.parquet_mode else ""
        self.parquet_path, self.test_parquet_path = parquet_path, test_parquet_path
        self.num_train, self.num_test, self.max_distractors, self.seed = num_train, num_test, max_distractors, seed
        self.max_turns, self.max_response_chars = max_turns, max_response_chars
        self.debris_ends_episode = bool(debris_ends_episode)
        self.values_per_slot = values_per_slot
        self.disjoint_demonstrations = bool(disjoint_demonstrations)
        self.wrong_tool_demonstrations = float(wrong_tool_demonstrations)
        # Enters the SFT cache key only when the noisy demonstrator is on (None is left out of the key), so a
        # warm start built by an earlier demonstrator (one wrong call replacing a whole plan) is not reused.
        self.wrong_demonstrator_version = 2 if self.wrong_tool_demonstrations else None
        self.catalog_version = CATALOG_VERSION
        self.simulator = simulator if simulator is not None else ToolSimulator()
        self._gold_sim = ToolSimulator()  # gold plans always come from the deterministic simulator
        self._splits: dict[str, datasets.Dataset] = {}
        self._unseen: set[str] = set()  # content keys no demonstration may use
        self._unseen_per_subset: Counter[str] = Counter()  # how many of them each subset has
        self._contents: dict[Key, str] = {}  # content_key of each (template, values) instance, memoised
        self._content_counts: dict[str, Counter[str]] = {}  # per subset: content key -> #instances
        if values_per_slot is not None and self.weights is not None:
            for t in (t for t in TEMPLATES if t.subset in self.weights):
                vocab, need = Counter(v for _, v in t.slots).most_common(1)[0] if t.slots else ("", 0)
                if need > values_per_slot:
                    raise ValueError(f"task.values_per_slot={values_per_slot}: the {t.id!r} template of the "
                                     f"{t.subset!r} subset needs {need} distinct {vocab} values; use >= {need}, "
                                     "null for every value, or leave the subset out of task.subsets")

    # ------------------------------------------------------------------ synthetic instances
    def _draws(self, subset: str, rng: random.Random) -> Iterator[Key]:
        templates = [t for t in TEMPLATES if t.subset == subset]
        while True:
            t = rng.choice(templates)
            values = tuple(rng.choice(VOCAB[vocab][: self.values_per_slot]) for _, vocab in t.slots)
            if t.valid(values):
                yield t.id, values

    def num_questions(self, subset: str) -> int:
        """The distinct (template, values) questions of a synthetic subset: per template, the product over
        its vocabularies of P(n, k) = n! / (n - k)!, with n the vocabulary's size (at most ``values_per_slot``)
        and k the template's slots of that vocabulary (which take distinct values)."""
        return sum(math.prod(math.perm(len(VOCAB[v][: self.values_per_slot]), k)
                             for v, k in Counter(v for _, v in t.slots).items())
                   for t in TEMPLATES if t.subset == subset)

    def content(self, key: Key) -> str:
        """:func:`content_key` of the row of the (template id, values) instance ``key`` (memoised)."""
        if key not in self._contents:
            t, v = self._template_values(key)
            gold = t.gold(v, lambda c: json.loads(self._gold_sim.respond(c))) if t.gold is not None else []
            self._contents[key] = content_key({"gold_tool_calls": gold, "question": t.question(v)})
        return self._contents[key]

    def content_counts(self, subset: str) -> Counter[str]:
        """Per content key of a synthetic subset, the number of its (template, values) instances (its
        phrasings); built once by enumerating every valid instance."""
        if subset not in self._content_counts:
            self._content_counts[subset] = Counter(
                self.content((t.id, values)) for t in TEMPLATES if t.subset == subset
                for values in itertools.product(*(VOCAB[v][: self.values_per_slot] for _, v in t.slots))
                if t.valid(values))
        return self._content_counts[subset]

    def num_contents(self, subset: str) -> int:
        """The distinct content keys of a synthetic subset (at most :meth:`num_questions`: phrasings of one
        call and orders of one parallel step count once)."""
        return len(self.content_counts(subset))

    def _subset_split(self, subset: str, num_test: int, num_train: int) -> dict[str, list[Key]]:
        """The subset's split (:func:`~lit_credit.tasks.base.heldout_split` on :meth:`content`): the first
        ``num_test`` distinct content keys of its seeded draw, then the first ``num_train`` distinct instances
        that carry none of them. Both counts are checked against the subset's space before drawing (every
        instance has a positive chance, so the draw ends)."""
        available = self.num_questions(subset)
        if num_test + num_train > available:
            raise ValueError(f"task.num_train + task.num_test: the {subset!r} subset is asked for "
                             f"{num_test + num_train} distinct questions and has {available} "
                             f"(task.values_per_slot={self.values_per_slot}); lower the counts or the subset's "
                             "weight in task.subsets, or raise task.values_per_slot")
        contents = self.content_counts(subset)
        fix = ("lower task.num_test / task.num_train or the subset's weight in task.subsets, or raise "
               "task.values_per_slot")
        if num_test > len(contents):
            raise ValueError(f"task.num_test: the {subset!r} subset is asked for {num_test} held-out questions and "
                             f"has {len(contents)} distinct in content (phrasings of one call count once; "
                             f"task.values_per_slot={self.values_per_slot}); {fix}")
        draws = ({"id": key} for key in self._draws(subset, random.Random(f"{self.seed}:{subset}")))
        key = lambda r: self.content(r["id"])  # noqa: E731
        test = heldout_split(draws, key, 0, num_test, max_misses=math.inf)["test"]
        held = {key(r) for r in test}
        free = available - sum(contents[k] for k in held)
        if num_train > free:
            raise ValueError(f"task.num_train: the {subset!r} subset is asked for {num_train} training questions, "
                             f"and {free} of its {available} questions are off the content of its {num_test} "
                             f"held-out ones (task.values_per_slot={self.values_per_slot}); {fix}")
        train = disjoint_train(draws, key, held, num_train, max_misses=math.inf)
        return {"test": [r["id"] for r in test], "train": [r["id"] for r in train]}

    def _template_values(self, key: Key) -> tuple[Template, dict[str, Any]]:
        t = TEMPLATES_BY_ID[key[0]]
        return t, {name: v for (name, _), v in zip(t.slots, key[1])}

    def synthetic_row(self, key: Key) -> dict[str, Any]:
        """The row of one (template id, values) instance; its distractors are seeded by the key."""
        t, v = self._template_values(key)
        gold = t.gold(v, lambda c: json.loads(self._gold_sim.respond(c))) if t.gold is not None else []
        rng = random.Random(f"{self.seed}:{dumps([key[0], list(key[1])])}")
        gold_names = list(dict.fromkeys(c["name"] for step in gold for c in step))
        pool = sorted(set(SCHEMAS) - set(gold_names))
        lo, hi = (1, max(1, self.max_distractors)) if not gold else (min(1, self.max_distractors), self.max_distractors)
        names = gold_names + rng.sample(pool, min(len(pool), rng.randint(lo, hi)))
        rng.shuffle(names)
        row_id = f"{t.id}:{'|'.join(str(x) for x in key[1])}"
        return make_row(t.question(v), [SCHEMAS[n] for n in names], gold, t.subset, row_id)

    def _synthetic_splits(self) -> dict[str, list[Key]]:
        assert self.weights is not None
        n_test, n_train = apportion(self.num_test, self.weights), apportion(self.num_train, self.weights)
        splits: dict[str, list[Key]] = {"train": [], "test": []}
        for subset in self.weights:
            keys = self._subset_split(subset, n_test[subset], n_train[subset])
            splits["test"] += keys["test"]
            splits["train"] += keys["train"]
        for split, keys in splits.items():
            random.Random(f"{self.seed}:order:{split}").shuffle(keys)
        return splits

    # ------------------------------------------------------------------ parquet rows
    def _parquet_splits(self) -> dict[str, datasets.Dataset]:
        def load(path: Any) -> list[dict[str, Any]]:
            rows = toucan_rows(path)
            return rows if self.weights is None else [r for r in rows if r["subset"] in self.weights]

        rows = load(self.parquet_path)
        if self.test_parquet_path is not None:
            test, train = load(self.test_parquet_path), rows
        else:
            if self.num_test >= len(rows):
                raise ValueError(f"task.num_test={self.num_test}: the parquet holds only {len(rows)} rows")
            order = list(range(len(rows)))
            random.Random(f"{self.seed}:parquet").shuffle(order)
            held = set(order[: self.num_test])
            test = [r for i, r in enumerate(rows) if i in held]
            train = [r for i, r in enumerate(rows) if i not in held]
        # a train row that repeats a held-out question is dropped (every other row counts, as drawn)
        train = disjoint_train(train, question_key, {question_key(r) for r in test}, None, distinct=lambda r: id(r))
        if self.num_train is not None:
            train = train[: self.num_train]
        return {"train": datasets.Dataset.from_list(train), "test": datasets.Dataset.from_list(test)}

    # ------------------------------------------------------------------ Task API
    def dataset(self, split: str) -> datasets.Dataset:
        if split not in ("train", "test"):
            raise ValueError(f"split={split!r}: use 'train' or 'test'")
        if not self._splits:
            if self.parquet_mode:
                self._splits = self._parquet_splits()
            else:
                keys = self._synthetic_splits()
                unseen = {(TEMPLATES_BY_ID[k[0]].subset, self.content(k))
                          for k in keys["test"] + (keys["train"] if self.disjoint_demonstrations else [])}
                self._unseen = {c for _, c in unseen}
                self._unseen_per_subset = Counter(subset for subset, _ in unseen)
                self._splits = {s: datasets.Dataset.from_list([self.synthetic_row(k) for k in ks])
                                for s, ks in keys.items()}
        return self._splits[split]

    def environment(self) -> ToolEnvironment:
        return ToolEnvironment(self.simulator, max_turns=self.max_turns, max_response_chars=self.max_response_chars,
                               debris_ends_episode=self.debris_ends_episode)

    def demonstration_rows(self, num: int, seed: int) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        """``(row, demo)`` pairs: the demo is the row's gold conversation (:func:`gold_conversation`)."""
        self.dataset("test")
        if self.parquet_mode:
            rows = [r for r in self.dataset("train") if _demonstrable(r)]
            if not rows:
                raise ValueError("the parquet train split has no row whose gold calls fit its tool schemas")
            rng = random.Random(f"demo:{seed}")
            for i in range(num):
                if i % len(rows) == 0:
                    rng.shuffle(rows)
                row = rows[i % len(rows)]
                yield row, gold_conversation(row, self._gold_sim, self.max_response_chars)
            return
        assert self.weights is not None
        for subset, weight in self.weights.items():
            if weight > 0 and self._unseen_per_subset[subset] >= self.num_contents(subset):
                raise ValueError(
                    f"demonstrations: every question of the {subset!r} subset is in the test split"
                    f"{' or the train split (task.disjoint_demonstrations=true)' if self.disjoint_demonstrations else ''}"
                    ", so none is left to demonstrate; lower task.num_train or task.num_test, raise "
                    "task.values_per_slot, or set task.disjoint_demonstrations=false")
        rng = random.Random(f"demo:{self.seed}:{seed}")
        wrong_rng = random.Random(f"demo:{self.seed}:{seed}:wrong")
        draws = {s: self._draws(s, random.Random(f"demo:{self.seed}:{seed}:{s}")) for s in self.weights}
        names, weights = list(self.weights), list(self.weights.values())
        made = 0
        while made < num:
            key = next(draws[rng.choices(names, weights)[0]])
            if self.content(key) in self._unseen:
                continue
            t, v = self._template_values(key)
            row = self.synthetic_row(key)
            answer = t.answer(v) if t.answer is not None else None
            wrong = (t.gold is not None and self.wrong_tool_demonstrations
                     and wrong_rng.random() < self.wrong_tool_demonstrations)
            demo = wrong and self.wrong_tool_demonstration(row, wrong_rng)
            yield row, demo or gold_conversation(row, self._gold_sim, self.max_response_chars, answer)
            made += 1

    def wrong_tool_demonstration(self, row: Mapping[str, Any], rng: random.Random) -> dict[str, Any] | None:
        """A demonstration of ``row`` by a demonstrator that picks the wrong tool at one step: at step k (uniform
        over the row's gold steps, drawn with ``rng`` only when there are several), after the gold steps before
        it, it calls one of the row's distractors (uniform) with the values of a ``single`` question of that tool
        drawn with ``rng`` (not copied from the row's), gets its tool response, and summarises every call it
        made (one fact each). Prompt and ``tools`` stay the row's. None when the row offers no distractor (it
        keeps its gold demonstration)."""
        gold = normalize_gold_calls(row["gold_tool_calls"])
        distractors = sorted(set(row["allowed_tools"]) - {c["name"] for step in gold for c in step})
        if not distractors:
            return None
        k = rng.randrange(len(gold)) if len(gold) > 1 else 0
        tool = rng.choice(distractors)
        for tries, key in enumerate(self._draws("single", rng), 1):
            if _single_tool(key[0]) == tool and self.content(key) not in self._unseen:
                break
            if tries == 10_000 and not self._has_demonstrable_single(tool):
                raise ValueError(f"task.wrong_tool_demonstrations: every single question of the distractor tool "
                                 f"{tool!r} is held out (test split, or train with disjoint_demonstrations), so none "
                                 "can stand in a wrong demonstration; raise task.values_per_slot, lower "
                                 "task.num_test / task.num_train, or set task.wrong_tool_demonstrations=0")
        wrong_step = normalize_gold_calls(self.synthetic_row(key)["gold_tool_calls"])[0]
        return gold_conversation(row, self._gold_sim, self.max_response_chars, plan=[*gold[:k], wrong_step])

    def _has_demonstrable_single(self, tool: str) -> bool:
        """Whether some ``single`` question calling ``tool`` is not held out (every value combination tried)."""
        for t in TEMPLATES:
            if t.subset == "single" and _single_tool(t.id) == tool:
                for values in itertools.product(*(VOCAB[v][: self.values_per_slot] for _, v in t.slots)):
                    if t.valid(values) and self.content((t.id, values)) not in self._unseen:
                        return True
        return False

    def demonstrations(self, num: int, seed: int) -> Iterable[dict[str, Any]]:
        """Gold conversations ``{"messages", "tools"}`` (tools: a list of schema dicts), none from the test
        split: user -> ``<tool_call>`` turn (a JSON list when parallel) -> tool messages -> ... -> a summary
        restating the responses; irrelevant questions get the direct answer. Deterministic in (seed, self.seed).
        """
        for _, demo in self.demonstration_rows(num, seed):
            yield demo

    def corpus(self, num: int = 2000) -> Iterable[str]:
        """Per demonstration, its tools as the chat template lists them (:func:`tool_signature`) and its
        messages: the tool list is much of a prompt's text, so the tokenizer should learn it."""
        for demo in self.demonstrations(num, seed=12345):
            yield "\n".join([*(tool_signature(t) for t in demo["tools"]), TOOLS_INSTRUCTION,
                             *(m["content"] for m in demo["messages"])])
