"""Task ``bfcl``: the Berkeley Function Calling Leaderboard v4, from the data inside the ``bfcl-eval`` wheel: the
single-turn categories as SLCA's tool-calling task, scored by BFCL's AST rules, and the multi-turn base category
as a stateful environment over BFCL's own backends (:mod:`lit_credit.tasks.bfcl_multi_turn`). One kind per run.

Rows come from ``bfcl_eval/data/BFCL_v4_<category>.json`` and ``possible_answer/BFCL_v4_<category>.json``
(matched by id), read as files: nothing is fetched. The single-turn checker module of the wheel imports the API
clients, so the reward uses a port of its Python rules (:mod:`lit_credit.rewards.bfcl_checker`, tested against
it); the multi-turn backends and checks are the wheel's own (they import no client). A single-turn row is a
:mod:`lit_credit.tasks.toolcall` row, so ``reward=hierr``, ``credit=slca`` / ``toolpo`` and the tool metrics read it
as they read the synthetic ones:

- ``prompt``: the entry's one turn of messages (a system message where the entry has one);
- ``tools``: the functions as OpenAI JSON schemas (BFCL's types mapped as its OpenAI handlers map them:
  ``dict`` -> ``object``, ``float`` -> ``number``, ``tuple`` -> ``array``, ``any`` -> ``string``), names as
  BFCL spells them (dots kept), descriptions with BFCL's Python hint; the chat template gets them as ``tools=``;
- ``gold_tool_calls``: one step, every possible-answer call with the first acceptable value of each argument
  (an argument whose first acceptable value is ``""`` left out); ``[]`` for the irrelevance categories;
- ``allowed_tools``, ``question`` (the last user message), ``subset`` (the category), ``id`` (BFCL's);
- ``bfcl_functions`` (the functions as BFCL's checker reads them) and ``possible_answer`` (its ground truth),
  JSON strings: a row with a ``possible_answer`` is scored by :class:`~lit_credit.rewards.hierr.HierRReward` with
  BFCL's argument rules and a ``bfcl_valid`` part.

The policy calls as in ``task=toolcall``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, a JSON
list (or several blocks) for parallel calls; :func:`~lit_credit.rewards.hierr.decode_calls` turns a reply into
BFCL's ``[{name: {param: value}}]``. The single-turn environment is
:class:`~lit_credit.tasks.toolcall.ToolEnvironment` with the programmatic simulator (BFCL's single-turn functions
have no backend: a valid call gets a generic ``{"tool", "status": "ok", "result_id"}``), so a rollout is a tool
segment then a summary, SLCA's two segments.

The task brings ``reward=bfcl`` (:func:`lit_credit.rewards.bfcl.bfcl_reward`): HierR for single-turn categories,
:class:`~lit_credit.rewards.bfcl.BFCLMultiTurnReward` for multi-turn ones.
"""
from __future__ import annotations

import copy
import importlib.util
import json
import random
import re
from collections.abc import Iterator, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import datasets

from lit_credit.rewards import bfcl_checker as checker
from lit_credit.rewards.bfcl import is_multi_turn, refuse_mixed
from lit_credit.rewards.hierr import bfcl_verdict, decode_calls, normalize_gold_calls
from lit_credit.tasks import bfcl_multi_turn as multi_turn
from lit_credit.tasks.base import Task, disjoint_train, heldout_split
from lit_credit.tasks.bfcl_multi_turn import MULTI_TURN, BFCLMultiTurnEnvironment
from lit_credit.tasks.tool_catalog import TOOLS_INSTRUCTION, dumps, tool_signature
from lit_credit.tasks.toolcall import ToolEnvironment, ToolSimulator, apportion, gold_conversation, make_row

__all__ = ["MULTI_TURN", "SINGLE_TURN", "BFCLTask", "bfcl_row", "bfcl_verdict", "category_name", "content_key",
           "decode_calls", "load_category", "satisfiable"]

VERSION_PREFIX = "BFCL_v4"
SINGLE_TURN = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance",
               "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple", "live_irrelevance")
ALIASES = {"simple": "simple_python"}
IRRELEVANT_ANSWER = "None of the given functions can answer this question."
PYTHON_HINT = " Note that the provided function is in Python 3 syntax."
# BFCL's constants/type_mappings.py GORILLA_TO_OPENAPI, the types of the Python categories
GORILLA_TO_OPENAPI = {"integer": "integer", "number": "number", "float": "number", "string": "string",
                      "boolean": "boolean", "bool": "boolean", "array": "array", "list": "array", "dict": "object",
                      "object": "object", "tuple": "array", "any": "string"}
INSTALL_FIX = ("install it with `make install` or `pip install --no-deps bfcl-eval==2026.3.23` (its data and "
               "checker need none of its API clients)")


# ------------------------------------------------------------------------------------------------ data
def data_dir() -> Path:
    """``bfcl_eval/data`` of the installed wheel, located without importing it."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"task=bfcl reads the data of the bfcl-eval wheel, which is not installed; "
                                  f"{INSTALL_FIX}")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def category_name(category: str) -> str:
    """A category of :data:`SINGLE_TURN` (``simple`` is ``simple_python``) or
    :data:`~lit_credit.tasks.bfcl_multi_turn.MULTI_TURN`; anything else is a ``ValueError``."""
    name = ALIASES.get(str(category), str(category))
    if name not in SINGLE_TURN and name not in MULTI_TURN:
        raise ValueError(f"task.categories: {category!r} is not a BFCL category this task reads; use names of "
                         f"{list(SINGLE_TURN)} (simple = simple_python) or the multi-turn {list(MULTI_TURN)}")
    return name


def _jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@cache
def load_category(category: str) -> tuple[dict[str, Any], ...]:
    """The entries of one category, each with its ``possible_answer`` ([] for irrelevance), in file order."""
    name = category_name(category)
    root = data_dir()
    entries = _jsonl(root / f"{VERSION_PREFIX}_{name}.json")
    answers: dict[str, Any] = {}
    if "irrelevance" not in name:
        answers = {a["id"]: a["ground_truth"] for a in _jsonl(root / "possible_answer" / f"{VERSION_PREFIX}_{name}.json")}
        missing = [e["id"] for e in entries if e["id"] not in answers]
        if missing:
            raise ValueError(f"BFCL category {name}: {len(missing)} entries without a possible answer ({missing[:3]})")
    return tuple({**e, "possible_answer": answers.get(e["id"], [])} for e in entries)


def with_python_hint(functions: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The functions as BFCL's ``load_dataset_entry`` hands them to a model: each description + the Python hint."""
    out = copy.deepcopy(list(functions))
    for f in out:
        f["description"] = str(f.get("description", "")) + PYTHON_HINT
    return out


def _openai_properties(properties: Mapping[str, Any]) -> dict[str, Any]:
    """BFCL's ``_cast_to_openai_type``: each type mapped (unknown -> string, no type -> string), nested
    properties and item types too."""
    out = {}
    for key, spec in properties.items():
        spec = dict(spec)
        spec["type"] = GORILLA_TO_OPENAPI.get(spec.get("type"), "string")
        if spec["type"] in ("array", "object"):
            if isinstance(spec.get("properties"), Mapping):
                spec["properties"] = _openai_properties(spec["properties"])
            elif isinstance(spec.get("items"), Mapping):
                items = dict(spec["items"])
                items["type"] = GORILLA_TO_OPENAPI.get(items.get("type"), "string")
                if isinstance(items.get("properties"), Mapping):
                    items["properties"] = _openai_properties(items["properties"])
                if isinstance(items.get("items"), Mapping):
                    items["items"] = {**items["items"],
                                      "type": GORILLA_TO_OPENAPI.get(items["items"].get("type"), "string")}
                spec["items"] = items
        out[key] = spec
    return out


def openai_tool(function: Mapping[str, Any]) -> dict[str, Any]:
    """One BFCL function as an OpenAI tool schema (the row's ``tools``; BFCL's names kept)."""
    params = dict(function.get("parameters") or {})
    params["type"] = "object"
    params["properties"] = _openai_properties(params.get("properties") or {})
    params.setdefault("required", [])
    return {"type": "function", "function": {"name": function["name"], "description": function.get("description", ""),
                                             "parameters": params}}


def bfcl_row(entry: Mapping[str, Any], category: str) -> dict[str, Any]:
    """One BFCL entry as a task row (the module docstring's fields)."""
    functions = with_python_hint(entry["function"])
    messages = [{"role": str(m["role"]), "content": str(m.get("content") or "")} for m in entry["question"][0]]
    users = [m["content"] for m in messages if m["role"] == "user"]
    gold = [checker.gold_calls(functions, entry["possible_answer"])] if entry["possible_answer"] else []
    row = make_row(users[-1] if users else "", [openai_tool(f) for f in functions], gold, category, str(entry["id"]),
                   prompt=messages)
    row["bfcl_functions"] = dumps(functions)
    row["possible_answer"] = dumps(entry["possible_answer"])
    return row


def multi_turn_row(entry: Mapping[str, Any], category: str) -> dict[str, Any]:
    """One multi-turn entry as a task row (:func:`lit_credit.tasks.bfcl_multi_turn.multi_turn_row`): the functions
    of its involved classes with BFCL's Python hint, as OpenAI tool schemas in ``tools``."""
    functions = with_python_hint(multi_turn.function_docs(data_dir(), entry["involved_classes"]))
    return multi_turn.multi_turn_row(entry, category, functions, [openai_tool(f) for f in functions])


def satisfiable(entry: Mapping[str, Any], category: str) -> bool:
    """Whether BFCL's checker accepts the entry's gold calls (:func:`~lit_credit.rewards.bfcl_checker.gold_calls`);
    irrelevance entries always. Five entries of the wheel's data fail (their possible answer omits a required
    parameter or requires one the schema lacks: live_simple_106-63-0, live_simple_112-68-0,
    live_multiple_507-149-4, live_multiple_862-181-3, live_multiple_964-207-0): no reply can score there, and a
    demonstration of them would teach a call the checker rejects, so the task leaves them out."""
    if not entry["possible_answer"]:
        return True
    calls = decode_calls(checker.gold_calls(entry["function"], entry["possible_answer"]))
    return bool(checker.safe_ast_checker(entry["function"], calls, entry["possible_answer"], category)["valid"])


def content_key(row: Mapping[str, Any]) -> str:
    """A row's content key: its question (case-folded, whitespace collapsed) and its sorted function names. BFCL
    repeats a question with other functions (the live categories) and a function set with other questions;
    both are other problems. A multi-turn row: its first user turn and its sorted involved classes
    (:func:`lit_credit.tasks.bfcl_multi_turn.content_key`)."""
    if row.get("bfcl_ground_truth") is not None:
        return multi_turn.content_key(row)
    return dumps([" ".join(str(row["question"]).casefold().split()), sorted(row["allowed_tools"])])
# ------------------------------------------------------------------------------------------------ task
class BFCLTask(Task):
    """BFCL's categories (``categories``: names of :data:`SINGLE_TURN` or of
    :data:`~lit_credit.tasks.bfcl_multi_turn.MULTI_TURN`, a list or a comma-separated string; ``simple`` =
    ``simple_python``; one kind per run) as a tool-calling task (the module docstring).

    Split (:func:`~lit_credit.tasks.base.heldout_split` on :func:`content_key`): each category's rows in a seeded
    order; the test split takes ``num_test`` rows apportioned to the categories by their sizes, the first distinct
    content keys of each; the train split every other row whose key is not held out (``num_train``: at most that
    many, None: all), shuffled. ``max_prompt_chars`` drops rows whose tool list and messages are longer (the
    live categories hold prompts of 20,000 characters, the multi-turn ones 7,000 to 30,000; None keeps every row),
    before the split; so are the entries no call can pass (:func:`satisfiable`: five single-turn ones; every
    multi-turn entry passes its own ground truth).

    ``environment()``: single-turn: :class:`~lit_credit.tasks.toolcall.ToolEnvironment` (``max_turns``, None: 2, a
    call turn and a summary); multi-turn: :class:`~lit_credit.tasks.bfcl_multi_turn.BFCLMultiTurnEnvironment`
    (``max_steps_per_turn`` call steps per user turn, BFCL's 20; ``max_turns`` None: enough for every step of
    the longest row). ``demonstrations``: the train rows' gold conversations, never a test row's: single-turn,
    the gold calls, the simulator's responses, one fact per call (an irrelevance row answers
    :data:`IRRELEVANT_ANSWER`); multi-turn, the ground-truth calls executed on the backends, a closing reply per
    user turn (:func:`~lit_credit.tasks.bfcl_multi_turn.demonstration`).
    """

    name = "bfcl"

    def __init__(self, categories: Any = ("simple_python",), num_train: int | None = None, num_test: int = 100,
                 max_turns: int | None = None, max_response_chars: int | None = 300,
                 max_prompt_chars: int | None = None, debris_ends_episode: bool = True,
                 max_steps_per_turn: int = multi_turn.MAXIMUM_STEP_LIMIT, seed: int = 0) -> None:
        names = re.split(r"[,\s]+", categories) if isinstance(categories, str) else list(categories or [])
        self.categories = tuple(dict.fromkeys(category_name(c) for c in names if str(c)))
        if not self.categories:
            raise ValueError(f"task.categories={categories!r}: name at least one of {list(SINGLE_TURN)} or "
                             f"{list(MULTI_TURN)}")
        refuse_mixed(self.categories)
        self.multi_turn = is_multi_turn(self.categories[0])
        if num_test < 0 or (num_train is not None and num_train < 0):
            raise ValueError(f"task.num_train={num_train}, task.num_test={num_test}: must be >= 0")
        if max_steps_per_turn < 1:
            raise ValueError(f"task.max_steps_per_turn={max_steps_per_turn}: must be >= 1 (BFCL: 20)")
        self.num_train, self.num_test, self.seed = num_train, num_test, seed
        self.max_turns, self.max_response_chars, self.max_prompt_chars = max_turns, max_response_chars, max_prompt_chars
        self.debris_ends_episode = bool(debris_ends_episode)
        self.max_steps_per_turn = max_steps_per_turn
        self.data_version = VERSION_PREFIX
        self._splits: dict[str, list[dict[str, Any]]] = {}
        self._datasets: dict[str, datasets.Dataset] = {}
        self._sim = ToolSimulator()

    def rows(self, category: str) -> list[dict[str, Any]]:
        """The rows of one category in file order: every entry but those no call can pass (:func:`satisfiable`)
        and, with ``max_prompt_chars``, those with longer prompts."""
        if is_multi_turn(category):
            rows = [multi_turn_row(e, category) for e in load_category(category)]
            rows = [r for r in rows if multi_turn.satisfiable(r)]
        else:
            rows = [bfcl_row(e, category) for e in load_category(category) if satisfiable(e, category)]
        if self.max_prompt_chars is not None:
            rows = [r for r in rows if prompt_chars(r) <= self.max_prompt_chars]
        return rows

    def splits(self) -> dict[str, list[dict[str, Any]]]:
        if self._splits:
            return self._splits
        per_category = {c: self.rows(c) for c in self.categories}
        for c, rows in per_category.items():
            random.Random(f"{self.seed}:bfcl:{c}").shuffle(rows)
        sizes = {c: len(rows) for c, rows in per_category.items() if rows}
        if not sizes:
            raise ValueError(f"task.categories={list(self.categories)}: no row is left (task.max_prompt_chars="
                             f"{self.max_prompt_chars}); raise or unset task.max_prompt_chars")
        counts = apportion(self.num_test, sizes)
        fix = "lower task.num_test / task.num_train, add categories, or raise task.max_prompt_chars"
        test: list[dict[str, Any]] = []
        for c, n in counts.items():
            test += heldout_split(per_category[c], content_key, 0, n, fix=fix, max_misses=float("inf"),
                                  where=f"task.num_test={self.num_test} ({n} of category {c})")["test"]
        held = {content_key(r) for r in test}
        test_ids = {r["id"] for r in test}
        rest = [r for c in self.categories for r in per_category.get(c, []) if r["id"] not in test_ids]
        random.Random(f"{self.seed}:bfcl:train").shuffle(rest)
        train = disjoint_train(rest, content_key, held, None, fix=fix, max_misses=float("inf"),
                               where=f"task.num_train={self.num_train}, task.num_test={self.num_test}")
        if self.num_train is not None:
            if len(train) < self.num_train:
                raise ValueError(f"task.num_train={self.num_train}: categories {list(self.categories)} hold only "
                                 f"{len(train)} rows off the content of the {len(test)} held-out ones; {fix}")
            train = train[: self.num_train]
        self._splits = {"train": train, "test": test}
        return self._splits

    def dataset(self, split: str) -> datasets.Dataset:
        if split not in ("train", "test"):
            raise ValueError(f"split={split!r}: use 'train' or 'test'")
        if split not in self._datasets:
            self._datasets[split] = datasets.Dataset.from_list(self.splits()[split])
        return self._datasets[split]

    def environment(self) -> ToolEnvironment | BFCLMultiTurnEnvironment:
        if self.multi_turn:
            turns = max((len(json.loads(r["bfcl_ground_truth"])) for rows in self.splits().values() for r in rows),
                        default=1)
            return BFCLMultiTurnEnvironment(self.max_steps_per_turn, self.max_turns, turns, self.max_response_chars)
        return ToolEnvironment(ToolSimulator(), max_turns=2 if self.max_turns is None else self.max_turns,
                               max_response_chars=self.max_response_chars or 0,  # 0 / None: whole
                               debris_ends_episode=self.debris_ends_episode)

    def demonstration(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """The gold conversation of one row (:func:`~lit_credit.tasks.toolcall.gold_conversation`; multi-turn:
        :func:`~lit_credit.tasks.bfcl_multi_turn.demonstration`)."""
        if row.get("bfcl_ground_truth") is not None:
            return multi_turn.demonstration(row, self._multi_env())
        answer = None if normalize_gold_calls(row["gold_tool_calls"]) else IRRELEVANT_ANSWER
        return gold_conversation(row, self._sim, self.max_response_chars or 0, answer)

    def _multi_env(self) -> BFCLMultiTurnEnvironment:
        """The environment the demonstrations replay the ground truth in (its step limit never reached)."""
        return BFCLMultiTurnEnvironment(max(self.max_steps_per_turn, 64), None, 1, self.max_response_chars)

    def demonstrations(self, num: int, seed: int) -> Iterator[dict[str, Any]]:
        """``num`` gold conversations of train rows, in seeded passes over them (never a test row)."""
        rows = list(self.splits()["train"])
        if not rows:
            raise ValueError(f"task.num_train={self.num_train}: no train row is left to demonstrate; raise it or "
                             "lower task.num_test")
        rng = random.Random(f"bfcl:demo:{self.seed}:{seed}")
        for i in range(num):
            if i % len(rows) == 0:
                rng.shuffle(rows)
            yield self.demonstration(rows[i % len(rows)])

    def corpus(self, num: int = 2000) -> Iterator[str]:
        """Per demonstration, its tools as the chat template lists them and its messages (as ``toolcall``);
        multi-turn: each train row at most once (a conversation is 5,000 to 20,000 characters)."""
        if self.multi_turn:
            num = min(num, len(self.splits()["train"]))
        for demo in self.demonstrations(num, seed=12345):
            yield "\n".join([*(tool_signature(t) for t in demo["tools"]), TOOLS_INSTRUCTION,
                             *(m["content"] for m in demo["messages"])])


def prompt_chars(row: Mapping[str, Any]) -> int:
    """The characters of a row's tool list (as the chat template lists it) and messages."""
    tools = json.loads(row["tools"]) if isinstance(row["tools"], str) else row["tools"]
    return sum(len(tool_signature(t)) + 1 for t in tools) + sum(len(m["content"]) for m in row["prompt"])
