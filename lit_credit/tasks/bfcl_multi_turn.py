"""BFCL v4's multi-turn base category as a stateful environment (``task=bfcl task.categories=[multi_turn_base]``).

An entry of ``BFCL_v4_multi_turn_base.json`` is a conversation of user turns over the backends of its
``involved_classes`` (a file system, a trading bot, ...), started from its ``initial_config``; its possible answer is
the ground-truth call strings of each user turn (``cd(folder='document')``). Each episode
(:class:`BFCLEpisode`) holds its own backend instances, made as BFCL makes them
(``bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils.execute_multi_turn_func_call``):
``importlib.import_module(CLASS_FILE_PATH_MAPPING[cls])``, ``getattr(module, cls)()``, and, except the
``STATELESS_CLASSES``, ``inst._load_scenario(copy.deepcopy(initial_config.get(cls, {})), long_context=False)``.

The episode (the environment contract of :mod:`lit_credit.interfaces`):

- ``reset()``: the first user turn's messages; the tools are the functions of the involved classes
  (``data/multi_turn_func_doc/<file>.json`` via ``MULTI_TURN_FUNC_DOC_FILE_MAPPING``, in the order of
  ``involved_classes``, each description with BFCL's Python hint), in the row's ``tools``;
- ``step(reply)``: a reply with calls (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, several
  blocks or a JSON list for several calls; every item with a name and an arguments object is a call, as BFCL
  decodes a step) is one step of the current user turn: each call runs on the episode's own instances
  (:func:`execute`) and its result comes back as a ``tool`` message. A reply without a call ends the user turn:
  the turn is scored (``Feedback.score`` 1 or 0, :meth:`BFCLEpisode.check_turn`), and the next user turn's
  messages follow (``done`` after the last). More than ``max_steps_per_turn`` call steps in one user turn is
  BFCL's force quit (its ``MAXIMUM_STEP_LIMIT``, 20): that turn fails and the episode ends;
- ``state_key()``: ``(user turn, digest)``, the digest a BLAKE2b of the canonical form of every instance's
  attributes (:func:`state_digest`), so episodes in the same backend state at the same request share a key;
- ``clone()``: a deep copy (instances included), sharing the row and the environment.

A user turn passes exactly when BFCL's ``multi_turn_checker`` would pass it, with BFCL's own sub-checkers
(``state_checker``, ``response_checker`` of ``bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker``): the
ground-truth instances (made fresh for the episode from ``initial_config`` and advanced by each user turn's
ground-truth calls, as BFCL's checker keeps them across turns) must have the same public attributes as the
episode's, and the results of the turn's ground-truth calls must all be among the results of every call the
policy made so far (any order, each used once); a turn with ground-truth calls and no call step fails
(``multi_turn:empty_turn_model_response``), a turn without ground-truth calls is not checked (passes). The
entry's verdict (``all_turns``) is every turn passing, BFCL's. The reward is
:class:`~lit_credit.rewards.bfcl.BFCLMultiTurnReward` (``reward=bfcl``, the task's default).
"""
from __future__ import annotations

import ast
import copy
import datetime
import hashlib
import importlib
import inspect
import json
import random
from collections.abc import Hashable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from lit_credit.rewards.hierr import parse_tool_calls, strip_think
from lit_credit.tasks.tool_catalog import dumps
from lit_credit.tasks.toolcall import truncate
from lit_credit.types import Feedback

MULTI_TURN = ("multi_turn_base",)
MAXIMUM_STEP_LIMIT = 20  # bfcl_eval.constants.default_prompts
FORBIDDEN = ("kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run")  # BFCL refuses these names
CLOSING_REPLY = "Done."
# attributes left out of the state digest: constant text, time stamps, random generators
DIGEST_SKIP = frozenset({"_api_description"})


# ------------------------------------------------------------------------------------------------ the wheel
@cache
def backend_config() -> tuple[dict[str, str], dict[str, str], tuple[str, ...]]:
    """``(CLASS_FILE_PATH_MAPPING, MULTI_TURN_FUNC_DOC_FILE_MAPPING, STATELESS_CLASSES)`` of the wheel."""
    from bfcl_eval.constants.executable_backend_config import (
        CLASS_FILE_PATH_MAPPING,
        MULTI_TURN_FUNC_DOC_FILE_MAPPING,
        STATELESS_CLASSES,
    )
    return dict(CLASS_FILE_PATH_MAPPING), dict(MULTI_TURN_FUNC_DOC_FILE_MAPPING), tuple(STATELESS_CLASSES)


@cache
def checkers() -> tuple[Any, Any]:
    """BFCL's ``state_checker`` and ``response_checker`` (they import no API client)."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import response_checker, state_checker
    return state_checker, response_checker


def make_instances(classes: Sequence[str], initial_config: Mapping[str, Any]) -> dict[str, Any]:
    """A fresh instance of each involved class, loaded with its part of ``initial_config`` as BFCL loads it."""
    paths, _docs, stateless = backend_config()
    instances = {}
    for name in classes:
        instance = getattr(importlib.import_module(paths[name]), name)()
        if name not in stateless:
            instance._load_scenario(copy.deepcopy(initial_config.get(name, {})), long_context=False)
        instances[name] = instance
    return instances


def method_table(instances: Mapping[str, Any]) -> dict[str, Any]:
    """Public method name -> bound method, over the instances in order (a later class's method of the same name
    wins, as BFCL's ``class_method_name_mapping``)."""
    table = {}
    for instance in instances.values():
        for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
            if not name.startswith("_"):
                table[name] = method
    return table


def result_text(value: Any) -> str:
    """A call's result as BFCL records it: a str as it is, a dict as JSON (else ``str``), anything else ``str``."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def execute(table: Mapping[str, Any], name: str, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
            ) -> str:
    """One call on the instances of ``table`` (:func:`method_table`), its result as BFCL's text
    (:func:`result_text`); a refused name, an unknown name or an exception is BFCL's ``Error during execution: ...``."""
    try:
        if name in FORBIDDEN:
            raise Exception(f"Function call {name} is not allowed.")
        if name not in table:
            raise NameError(f"name '{name}' is not defined")
        return result_text(table[name](*args, **dict(kwargs or {})))
    except Exception as err:  # BFCL: any exception of the call is its result
        return f"Error during execution: {err}"


def parse_call(text: str) -> tuple[str, list[Any], dict[str, Any]]:
    """A ground-truth call string (``cd(folder='document')``, ``sort('final_report.pdf')``) as ``(name,
    positional args, keyword args)``; the arguments are Python literals."""
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"BFCL ground truth {text!r} is not a call of a function name")
    return (node.func.id, [ast.literal_eval(a) for a in node.args],
            {k.arg: ast.literal_eval(k.value) for k in node.keywords})


def named_arguments(table: Mapping[str, Any], name: str, args: Sequence[Any], kwargs: Mapping[str, Any]
                    ) -> dict[str, Any]:
    """The arguments of a call as keyword arguments (positional ones named by the method's signature)."""
    if not args:
        return dict(kwargs)
    return dict(inspect.signature(table[name]).bind(*args, **kwargs).arguments)


# ------------------------------------------------------------------------------------------------ data
def function_docs(root: Path, classes: Sequence[str]) -> list[dict[str, Any]]:
    """The functions of the involved classes, as BFCL's ``populate_test_cases_with_predefined_functions`` lists
    them (the classes' doc files under ``root/multi_turn_func_doc``, in order)."""
    _paths, docs, _stateless = backend_config()
    out: list[dict[str, Any]] = []
    for name in classes:
        with (root / "multi_turn_func_doc" / docs[name]).open(encoding="utf-8") as f:
            out += [json.loads(line) for line in f if line.strip()]
    return out


def spec_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a multi-turn row an episode reads: ``turns`` (each user turn's messages), ``truth`` (each
    turn's ground-truth call strings), ``config`` (``initial_config``), ``classes`` (``involved_classes``)."""
    return {"turns": json.loads(row["bfcl_turns"]), "truth": json.loads(row["bfcl_ground_truth"]),
            "config": json.loads(row["initial_config"]), "classes": list(row["involved_classes"])}


def messages_of(turn: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    return [{"role": str(m["role"]), "content": str(m.get("content") or "")} for m in turn]


# ------------------------------------------------------------------------------------------------ state
def _canonical(x: Any, seen: dict[int, int]) -> Any:
    """A deterministic, hashable form of ``x``: primitives as they are, containers element-wise (dicts and sets
    sorted), an object as its class name and attributes (:data:`DIGEST_SKIP`, time stamps and random generators
    left out); an object met again is ``("ref", n)``, n its order of first meeting (so cycles and shared objects,
    a directory's parent or the current directory, are kept)."""
    if x is None or isinstance(x, (bool, int, float, str, bytes)):
        return x
    if isinstance(x, (datetime.date, datetime.time, random.Random)):
        return None
    if isinstance(x, Mapping):
        items = [(_canonical(k, seen), v) for k, v in x.items()]
        items.sort(key=lambda kv: repr(kv[0]))
        return ("dict", tuple((k, _canonical(v, seen)) for k, v in items))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(_canonical(v, seen) for v in x))
    if isinstance(x, (set, frozenset)):
        return ("set", tuple(sorted((_canonical(v, seen) for v in x), key=repr)))
    if hasattr(x, "__dict__"):
        if id(x) in seen:
            return ("ref", seen[id(x)])
        seen[id(x)] = len(seen)
        attrs = {k: v for k, v in vars(x).items() if k not in DIGEST_SKIP}
        return (type(x).__name__, tuple((k, _canonical(attrs[k], seen)) for k in sorted(attrs)))
    return repr(x)


def state_digest(instances: Mapping[str, Any]) -> str:
    """BLAKE2b (16 bytes, hex) of the canonical form of the instances, by class name (:func:`_canonical`).
    Private attributes count too (a file system's current directory is state the next call depends on)."""
    form = tuple((name, _canonical(instances[name], {})) for name in sorted(instances))
    return hashlib.blake2b(repr(form).encode(), digest_size=16).hexdigest()


# ------------------------------------------------------------------------------------------------ episodes
class BFCLEpisode:
    """One rollout of a multi-turn entry: its own instances, the ground-truth instances, the user turn it is in
    (the module docstring). ``passed``: per ended user turn, whether it passed; ``verdicts``: BFCL's result dict
    of each; ``calls``: per user turn, per step, the calls made (``name``, ``arguments``)."""

    def __init__(self, env: BFCLMultiTurnEnvironment, row: Mapping[str, Any], seed: int) -> None:
        self.env, self.row, self.seed = env, row, seed
        self.spec = spec_of(row)
        self.done = True

    def reset(self) -> list[dict[str, str]]:
        spec = self.spec
        self.instances = make_instances(spec["classes"], spec["config"])
        self.truth = make_instances(spec["classes"], spec["config"])
        self.table, self.truth_table = method_table(self.instances), method_table(self.truth)
        self.turn, self.steps, self.done = 0, 0, False
        self.results: list[str] = []  # the result of every call the policy made, all turns
        self.turn_steps: list[list[str]] = []  # the results of each call step of the current user turn
        self.calls: list[list[list[dict[str, Any]]]] = [[]]
        self.passed: list[bool] = []
        self.verdicts: list[dict[str, Any]] = []
        return messages_of(spec["turns"][0])

    def step(self, reply: str) -> Feedback:
        if self.done:
            raise RuntimeError("the episode has ended: reset() it or open a new one")
        parsed = parse_tool_calls(strip_think(reply if isinstance(reply, str) else ""))
        calls = parsed.executed
        if not calls:  # the user turn ends
            return self.end_turn()
        self.calls[-1].append(copy.deepcopy(calls))  # before the call: a backend may keep and later change an argument
        results = [execute(self.table, c["name"], (), c["arguments"]) for c in calls]
        self.results += results
        self.turn_steps.append(results)
        self.steps += 1
        cap = self.env.max_response_chars
        messages = [{"role": "tool", "content": r if cap is None else truncate(r, cap)} for r in results]
        info = {"tool_responses": [m["content"] for m in messages], "bfcl_turn": self.turn}
        if self.steps > self.env.max_steps_per_turn:  # BFCL's force quit: the entry fails
            verdict = {"valid": False, "error_type": "multi_turn:force_terminated"}
            self.passed.append(False)
            self.verdicts.append(verdict)
            self.done = True
            return Feedback(True, messages, score=0.0, info={**info, "bfcl": verdict})
        return Feedback(False, messages, info=info)

    def check_turn(self) -> dict[str, Any]:
        """BFCL's checks of the user turn that just ended (the module docstring); advances the ground truth."""
        truth = self.spec["truth"][self.turn]
        truth_results = []
        for text in truth:
            name, args, kwargs = parse_call(text)
            truth_results.append(execute(self.truth_table, name, args, kwargs))
        if truth and not self.turn_steps:
            return {"valid": False, "error_type": "multi_turn:empty_turn_model_response"}
        if not truth:
            return {"valid": True}
        state_checker, response_checker = checkers()
        result = state_checker(self.instances, self.truth)
        if result["valid"]:
            result = response_checker(self.results, truth_results, self.turn)
        return result

    def end_turn(self) -> Feedback:
        verdict = self.check_turn()
        ok = bool(verdict["valid"])
        self.passed.append(ok)
        self.verdicts.append({k: verdict[k] for k in ("valid", "error_type") if k in verdict})
        turn = self.turn
        self.turn, self.steps, self.turn_steps = self.turn + 1, 0, []
        info = {"tool_responses": [], "bfcl_turn": turn, "bfcl": self.verdicts[-1]}
        if self.turn >= len(self.spec["turns"]):
            self.done = True
            return Feedback(True, score=float(ok), info=info)
        self.calls.append([])
        return Feedback(False, messages_of(self.spec["turns"][self.turn]), score=float(ok), info=info)

    def state_key(self) -> Hashable:
        return (self.turn, state_digest(self.instances))

    def clone(self) -> BFCLEpisode:
        """An independent copy in the current state (its instances deep-copied; the row, the spec and the
        environment shared)."""
        return copy.deepcopy(self, {id(self.env): self.env, id(self.row): self.row, id(self.spec): self.spec})


class BFCLMultiTurnEnvironment:
    """The environment of the multi-turn categories: each episode a :class:`BFCLEpisode`.

    ``max_steps_per_turn``: call steps allowed per user turn before BFCL's force quit (BFCL: 20);
    ``max_turns``: assistant turns per episode (the rollout loop's cap; None: ``user_turns x (max_steps_per_turn
    + 1)``, enough for every step of every turn); ``max_response_chars``: each tool message as the policy reads
    it is cut to that many characters (None: whole; BFCL's checks always compare the whole results)."""

    def __init__(self, max_steps_per_turn: int = MAXIMUM_STEP_LIMIT, max_turns: int | None = None,
                 user_turns: int = 1, max_response_chars: int | None = None) -> None:
        if max_steps_per_turn < 1:
            raise ValueError(f"task.max_steps_per_turn={max_steps_per_turn}: must be >= 1 (BFCL: 20)")
        self.max_steps_per_turn, self.max_response_chars = max_steps_per_turn, max_response_chars
        self.max_turns = max_turns if max_turns is not None else max(1, user_turns) * (max_steps_per_turn + 1)
        if self.max_turns < 1:
            raise ValueError(f"task.max_turns={max_turns}: must be >= 1")

    def episode(self, row: dict[str, Any], seed: int) -> BFCLEpisode:
        return BFCLEpisode(self, row, seed)


# ------------------------------------------------------------------------------------------------ rows, demos
def multi_turn_row(entry: Mapping[str, Any], category: str, functions: Sequence[Mapping[str, Any]],
                   tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One multi-turn entry as a task row: ``prompt`` (the first user turn), ``tools`` (OpenAI schemas, JSON),
    ``allowed_tools``, ``question`` (the first user turn's text), ``subset``, ``id``, and what the episode reads:
    ``bfcl_turns``, ``bfcl_ground_truth``, ``initial_config`` (JSON strings), ``involved_classes``;
    ``bfcl_functions`` (BFCL's function docs, JSON)."""
    turns = [messages_of(t) for t in entry["question"]]
    return {
        "prompt": turns[0],
        "tools": dumps(list(tools)),
        "allowed_tools": [f["name"] for f in functions],
        "question": "\n".join(m["content"] for m in turns[0] if m["role"] == "user"),
        "subset": category,
        "id": str(entry["id"]),
        "bfcl_turns": dumps(turns),
        "bfcl_ground_truth": dumps(entry["possible_answer"]),
        "initial_config": dumps(entry.get("initial_config") or {}),
        "involved_classes": list(entry["involved_classes"]),
        "bfcl_functions": dumps(list(functions)),
    }


def content_key(row: Mapping[str, Any]) -> str:
    """A multi-turn row's content key: the first user turn's text (case-folded, whitespace collapsed) and the
    sorted involved classes."""
    return dumps([" ".join(str(row["question"]).casefold().split()), sorted(row["involved_classes"])])


def gold_steps(row: Mapping[str, Any]) -> list[list[dict[str, Any]]]:
    """Per user turn, the ground-truth calls as ``{"name", "arguments"}`` (positional arguments named by the
    backend method's signature)."""
    spec = spec_of(row)
    table = method_table(make_instances(spec["classes"], spec["config"]))
    out = []
    for truth in spec["truth"]:
        calls = []
        for text in truth:
            name, args, kwargs = parse_call(text)
            calls.append({"name": name, "arguments": named_arguments(table, name, args, kwargs)})
        out.append(calls)
    return out


def gold_replies(row: Mapping[str, Any]) -> list[str]:
    """The replies of a policy that replays the ground truth: per user turn, one ``<tool_call>`` reply per
    ground-truth call, then :data:`CLOSING_REPLY`."""
    replies = []
    for calls in gold_steps(row):
        replies += [f'<tool_call>{dumps({"name": c["name"], "arguments": c["arguments"]})}</tool_call>' for c in calls]
        replies.append(CLOSING_REPLY)
    return replies


def replay(row: Mapping[str, Any], env: BFCLMultiTurnEnvironment, replies: Sequence[str]) -> tuple[BFCLEpisode, list[Feedback]]:
    """A fresh episode of ``row`` stepped with ``replies`` until it ends; the episode and every feedback."""
    episode = env.episode(dict(row), 0)
    episode.reset()
    feedbacks = []
    for reply in replies:
        feedbacks.append(episode.step(reply))
        if feedbacks[-1].done:
            break
    return episode, feedbacks


def satisfiable(row: Mapping[str, Any]) -> bool:
    """Whether replaying the row's ground truth (:func:`gold_replies`) passes every user turn (every entry of the
    wheel's multi_turn_base does: tested)."""
    episode, _ = replay(row, BFCLMultiTurnEnvironment(64, None, 1, None), gold_replies(row))
    return len(episode.passed) == len(episode.spec["turns"]) and all(episode.passed)


def demonstration(row: Mapping[str, Any], env: BFCLMultiTurnEnvironment) -> dict[str, Any]:
    """The gold conversation of a row: the ground truth replayed through an episode (:func:`gold_replies`): each
    call as a tool call, its executed result as a tool message, a closing reply per user turn, then the next
    user turn."""
    episode = env.episode(dict(row), 0)
    messages = [dict(m) for m in episode.reset()]
    for reply in gold_replies(row):
        messages.append({"role": "assistant", "content": reply})
        feedback = episode.step(reply)
        messages += [dict(m) for m in feedback.messages]
        if feedback.done:
            break
    tools = json.loads(row["tools"]) if isinstance(row["tools"], str) else list(row["tools"])
    return {"messages": messages, "tools": tools}
