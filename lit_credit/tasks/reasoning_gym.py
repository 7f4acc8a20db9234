"""Task ``reasoning_gym``: any `reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ dataset, or a
weighted mix of several, scored by the dataset's own ``score_answer(answer, entry)``.

reasoning-gym is procedural: an entry is generated from its dataset's config (seed and size included) and its
index, so nothing is fetched at run time and a row needs only plain data to find its entry again. Each row holds
``prompt``, ``answer`` (the entry's gold answer), ``id``, ``dataset`` (the reasoning-gym name), ``index`` and
``config`` (the JSON of the keyword arguments the dataset was built with); :func:`entry_of` rebuilds the dataset
from them (cached) and returns ``dataset[index]``, the very entry the row was made from, which
:func:`score` hands to ``dataset.score_answer``. The mix is reasoning-gym's own composite dataset
(``reasoning_gym.composite``: each index picks a dataset by weight, then takes that dataset's entry at the index).

Three parts, kept apart so the environment can move onto another episode contract alone:

- :class:`ReasoningGymTask`: the rows, the held-out split (content key: the question text), demonstrations and
  the tokenizer corpus;
- :func:`verdict`: one reply against its row's entry, a :class:`~lit_credit.tasks.revise.Verdict` whose
  feedback is shown next turn in revise mode (``task.revise=true``: a
  :class:`~lit_credit.tasks.revise.RevisionEnvironment`, TCPO's setting, as ``math_revise``);
- :class:`ReasoningGymReward` (``reward=reasoning_gym``, the task's default reward): the last reply's score.

The answer a reply gives (:func:`extract`) is the text of its last ``<answer>...</answer>`` (reasoning-gym's
convention, ``reasoning_gym.utils.extract_answer``), or, without one, the whole reply, stripped.
"""
from __future__ import annotations

import copy
import difflib
import functools
import json
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import datasets

from lit_credit.tasks.base import SingleTurnEnvironment, Task, heldout_split, optional_package
from lit_credit.tasks.revise import RevisionEnvironment, Verdict, check_stop_on_success
from lit_credit.types import RewardResult

INSTALL = "reasoning-gym==0.1.25"
CORRECT = "Your answer is correct."  # the verifier's neutral reply to a right answer (revise mode)
NO_ANSWER = "No answer found. Reply with the answer."
DEMO_OFFSET = 1_000_000_007  # demonstrations draw from seeds this far from the split's
FIX = "lower task.num_train / task.num_test, or widen the datasets' configs (more distinct questions)"


def _rg():
    return optional_package("reasoning_gym", "reasoning_gym", INSTALL)


# ------------------------------------------------------------------------------------------------ entries, scores
@functools.lru_cache(maxsize=64)
def _dataset(name: str, config: str) -> Any:
    return _rg().create_dataset(name, **json.loads(config))


@functools.lru_cache(maxsize=8192)
def _entry(name: str, config: str, index: int) -> dict[str, Any]:
    return _dataset(name, config)[index]


def entry_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """The reasoning-gym entry a row was made from: ``create_dataset(row["dataset"], **json.loads(row["config"]))
    [row["index"]]`` (cached; a copy, so scoring cannot change the cache). Refuses a row whose rebuilt entry asks
    another question (a dataset that does not regenerate, another reasoning-gym version)."""
    entry = _entry(row["dataset"], row["config"], int(row["index"]))
    question = row["prompt"][-1]["content"]
    if entry["question"] != question:
        raise RuntimeError(f"reasoning-gym {row['dataset']!r} entry {row['index']} no longer asks the row's question "
                           "(the dataset does not regenerate its entries, or the rows come from another "
                           "reasoning-gym version); rebuild the rows with the installed version")
    return copy.deepcopy(entry)


def extract(reply: str) -> str | None:
    """The answer of a reply: its last ``<answer>...</answer>`` (stripped), else the whole reply stripped; None
    when that is empty."""
    if "<answer>" in reply:
        from reasoning_gym.utils import extract_answer
        tagged = extract_answer(reply)
        if tagged is not None:
            return tagged or None
    return reply.strip() or None


def score(row: Mapping[str, Any], reply: str) -> float:
    """``dataset.score_answer(extract(reply), entry_of(row))``: the dataset's own score, in [0, 1]."""
    return float(_dataset(row["dataset"], row["config"]).score_answer(extract(reply), entry_of(row)))


def verdict(row: Mapping[str, Any], reply: str) -> Verdict:
    """The verifier of revise mode: :func:`score`, with feedback :data:`CORRECT` on a full score, :data:`NO_ANSWER`
    for an empty answer, else the score itself (``"Your answer scores 0.25 out of 1. Try again."``)."""
    value = score(row, reply)
    if value >= 1.0:
        return Verdict(value, CORRECT)
    if extract(reply) is None:
        return Verdict(value, NO_ANSWER)
    return Verdict(value, f"Your answer scores {value:.3g} out of 1. Try again.")


class ReasoningGymReward:
    """``reward=reasoning_gym``: ``score`` = the dataset's ``score_answer`` of the final reply's answer
    (:func:`score`). Parts: ``correct`` (score 1), ``answered`` (the reply gives an answer), ``error`` (the
    dataset's scorer raised: scored 0, never a crash); with per-turn verifier scores (revise mode) also ``best``,
    ``first`` and ``turns`` as ``reward=final_turn``. Needs rows of ``task=reasoning_gym``."""

    def __call__(self, row: dict[str, Any], replies: list[str], tool_responses: Sequence[str] | None = None,
                 turn_scores: Sequence[float | None] | None = None) -> RewardResult:
        if "config" not in row or "dataset" not in row:
            raise ValueError("reward=reasoning_gym scores rows of task=reasoning_gym (they name their reasoning-gym "
                             "dataset and entry); use it with task=reasoning_gym, or another reward for this task")
        reply = replies[-1] if replies else ""
        error = 0.0
        try:
            value = score(row, reply)
        except (ImportError, RuntimeError):
            raise
        except Exception:  # a scorer that chokes on a bad answer: 0, counted
            value, error = 0.0, 1.0
        parts = {"correct": float(value >= 1.0), "answered": float(extract(reply) is not None), "error": error}
        if turn_scores and any(s is not None for s in turn_scores):  # an environment that scores turns
            scores = [float(s or 0.0) for s in turn_scores]
            parts |= {"best": max(scores), "first": scores[0], "turns": float(len(scores))}
        return RewardResult(value, parts)


# ------------------------------------------------------------------------------------------------ the task
def _plain(value: Any) -> Any:
    """Hydra's DictConfig / ListConfig (or any mapping / sequence) as plain dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [_plain(v) for v in value]
    return value


def parse_datasets(spec: Any) -> list[dict[str, Any]]:
    """``task.datasets`` as ``[{"name", "weight", "config"}]``: a name, a list of names and / or dicts
    ``{name, weight (default 1), config (default {})}``. Every mistake is a ``ValueError`` naming the key."""
    spec = _plain(spec)
    items = [spec] if isinstance(spec, (str, dict)) else spec
    if not isinstance(items, list) or not items:
        raise ValueError(f"task.datasets={spec!r}: give reasoning-gym dataset names, e.g. task.datasets=[basic_arithmetic], "
                         "or dicts {name, weight, config}")
    _rg()
    from reasoning_gym.factory import DATASETS
    known = set(DATASETS) - {"composite"}
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        key = f"task.datasets[{i}]"
        item = {"name": item} if isinstance(item, str) else item
        if not isinstance(item, dict) or set(item) - {"name", "weight", "config"} or "name" not in item:
            raise ValueError(f"{key}={item!r}: use a dataset name or {{name, weight, config}}")
        name, weight, config = item["name"], item.get("weight", 1.0), item.get("config") or {}
        if name not in known:
            close = difflib.get_close_matches(str(name), sorted(known), n=3)
            hint = f"did you mean {', '.join(close)}?" if close else "see reasoning_gym.factory.DATASETS"
            raise ValueError(f"{key}.name={name!r}: not a reasoning-gym dataset ({hint}); a mix is a list of them")
        if not isinstance(weight, (int, float)) or isinstance(weight, bool) or weight <= 0:
            raise ValueError(f"{key}.weight={weight!r}: must be a number > 0")
        if not isinstance(config, dict):
            raise ValueError(f"{key}.config={config!r}: must be a mapping of the dataset's config fields")
        if "size" in config:
            raise ValueError(f"{key}.config.size: the task sets each dataset's size; use task.size")
        try:
            json.dumps(config)
        except TypeError as err:
            raise ValueError(f"{key}.config: must be plain data (numbers, strings, lists, mappings): {err}") from err
        out.append({"name": name, "weight": float(weight), "config": config})
    names = [d["name"] for d in out]
    if len(set(names)) != len(names):
        raise ValueError(f"task.datasets: {names} names a dataset twice (reasoning-gym's composite refuses it); "
                         "give each dataset once, with the weight it should have")
    return out


def content_key(row: Mapping[str, Any]) -> str:
    """A row's content key: its question, whitespace collapsed (reasoning-gym questions have no template words
    to strip that do not change the problem; case can matter, e.g. in string tasks)."""
    return " ".join(row["prompt"][-1]["content"].split())


class ReasoningGymTask(Task):
    """Rows drawn from reasoning-gym datasets (``datasets``: see :func:`parse_datasets`) through its composite.

    The draw walks composites of ``size`` entries with seeds ``seed``, ``seed + size``, ... (one continuous run of
    reasoning-gym's per-index seeds); dataset ``i`` of a composite of seed ``s`` is built with seed
    ``s + i + 1`` (the composite's own rule) or, when its config pins ``seed``, that seed shifted by the same
    ``s - seed``. Test is the first ``num_test`` distinct questions (:func:`content_key`), train the next
    ``num_train`` distinct questions that are not held out (:func:`~lit_credit.tasks.base.heldout_split`).

    ``system_prompt``: none (null), a name of ``reasoning_gym.utils.SYSTEM_PROMPTS`` (``direct``, ``default``,
    ...) or a text; with one, demonstrations answer ``<answer>gold</answer>``, without, the bare gold answer.

    ``revise`` (TCPO's setting): up to ``max_turns`` turns against :func:`verdict`, whose feedback is the
    dataset's score; ``stop_on_success`` as ``math_revise``. A share ``revise_frac`` of the demonstrations first
    gives a wrong answer (the gold answer of an earlier entry of the same dataset that scores below 1 here),
    sees the verdict and answers right.
    """

    name = "reasoning_gym"

    def __init__(self, datasets: Any = ("basic_arithmetic",), num_train: int = 2000, num_test: int = 128,
                 size: int = 1000, seed: int = 0, system_prompt: str | None = None, revise: bool = False,
                 max_turns: int = 3, stop_on_success: bool = True, revise_frac: float = 0.4) -> None:
        if num_train is None or num_train < 1 or num_test < 1:
            raise ValueError(f"task.num_train={num_train}, task.num_test={num_test}: both must be >= 1")
        if size < 1:
            raise ValueError(f"task.size={size}: must be >= 1")
        if not isinstance(revise, bool):
            raise ValueError(f"task.revise={revise!r}: use true (multi-turn, the verdict as feedback) or false")
        if max_turns < 1:
            raise ValueError(f"task.max_turns={max_turns}: must be >= 1")
        if not 0.0 <= revise_frac <= 1.0:
            raise ValueError(f"task.revise_frac={revise_frac}: must be in [0, 1]")
        self.specs = parse_datasets(datasets)
        # plain attributes, so part of the embedded policy's cache key (they shape the demonstrations)
        self.datasets_key = json.dumps(self.specs, sort_keys=True)
        self.system_text = self._system_text(system_prompt)
        self.num_train, self.num_test, self.size, self.seed = num_train, num_test, size, seed
        self.revise, self.max_turns, self.revise_frac = revise, max_turns, revise_frac
        self.stop_on_success = check_stop_on_success(stop_on_success)
        self.rg_version = _rg_version()
        self._splits: dict[str, datasets.Dataset] = {}

    @staticmethod
    def _system_text(system_prompt: str | None) -> str:
        if not system_prompt:
            return ""
        _rg()
        from reasoning_gym.utils import SYSTEM_PROMPTS
        return SYSTEM_PROMPTS.get(system_prompt, system_prompt)

    # ------------------------------------------------------------------ draws
    def _composite(self, chunk_seed: int) -> tuple[Any, list[str]]:
        from reasoning_gym.composite import DatasetSpec
        specs, configs = [], []
        for i, d in enumerate(self.specs):
            config = dict(d["config"])
            pinned = config.get("seed")
            config["seed"] = chunk_seed + i + 1 if pinned is None else int(pinned) + chunk_seed - self.seed
            config["size"] = self.size
            configs.append(json.dumps(config, sort_keys=True))
            specs.append(DatasetSpec(d["name"], d["weight"], config))
        try:
            composite = _rg().create_dataset("composite", size=self.size, seed=chunk_seed, datasets=specs)
        except (TypeError, ValueError, AssertionError) as err:
            for i, spec in enumerate(specs):  # name the dataset whose config it refused
                try:
                    _rg().create_dataset(spec.name, **spec.config)
                except (TypeError, ValueError, AssertionError) as one:
                    raise ValueError(f"task.datasets[{i}].config={self.specs[i]['config']}: reasoning-gym refused "
                                     f"it for {spec.name}: {type(one).__name__}: {one}") from one
            raise ValueError(f"task.datasets: reasoning-gym refused the mix: {type(err).__name__}: {err}") from err
        return composite, configs

    def _rows(self, base_seed: int) -> Iterator[dict[str, Any]]:
        """Rows of the composites of seeds ``base_seed``, ``base_seed + size``, ..., in index order (endless)."""
        index = {d["name"]: i for i, d in enumerate(self.specs)}
        prefix = [{"role": "system", "content": self.system_text}] if self.system_text else []
        for chunk in range(1 << 62):
            chunk_seed = base_seed + chunk * self.size
            composite, configs = self._composite(chunk_seed)
            for idx in range(self.size):
                entry = composite[idx]
                name = entry["metadata"]["source_dataset"]
                yield {"prompt": [*prefix, {"role": "user", "content": entry["question"]}],
                       "answer": "" if entry["answer"] is None else str(entry["answer"]),
                       "id": f"{name}/{chunk_seed}/{idx}", "dataset": name, "index": idx,
                       "config": configs[index[name]]}

    # ------------------------------------------------------------------ Task API
    def dataset(self, split: str) -> datasets.Dataset:
        if split not in ("train", "test"):
            raise ValueError(f"split={split!r}: use 'train' or 'test'")
        if not self._splits:
            splits = heldout_split(self._rows(self.seed), content_key, self.num_train, self.num_test, fix=FIX,
                                   distinct=content_key)
            self._splits = {k: datasets.Dataset.from_list(v) for k, v in splits.items()}
        return self._splits[split]

    def environment(self) -> SingleTurnEnvironment | RevisionEnvironment:
        if not self.revise:
            return SingleTurnEnvironment()
        return RevisionEnvironment(verdict, max_turns=self.max_turns, stop_on_success=self.stop_on_success)

    def _reply(self, answer: str) -> str:
        return f"<answer>{answer}</answer>" if self.system_text else answer

    def demonstrations(self, num: int, seed: int) -> Iterable[dict[str, Any]]:
        """``num`` gold conversations on fresh draws (seeds ``DEMO_OFFSET`` x (seed + 1) away from the split's)
        whose question is not held out; in revise mode a share ``revise_frac`` shows a wrong answer and its
        verdict first, and without ``stop_on_success`` every one runs to ``max_turns`` turns."""
        held_out = {content_key(row) for row in self.dataset("test")}
        rng, made = random.Random(f"demo:{self.seed}:{seed}"), 0
        earlier: dict[str, list[str]] = {}  # the last gold answers seen per dataset: wrong answers elsewhere
        for row in self._rows(self.seed + DEMO_OFFSET * (seed + 1)):
            if num <= 0:
                return
            previous = earlier.get(row["dataset"], [])
            earlier[row["dataset"]] = [*previous[-7:], row["answer"]]
            if content_key(row) in held_out:
                continue
            right = self._reply(row["answer"])
            messages = list(row["prompt"])
            if self.revise and self.max_turns > 1 and rng.random() < self.revise_frac:
                wrong = next((a for a in reversed(previous) if a != row["answer"]
                              and verdict(row, self._reply(a)).score < 1.0), None)
                if wrong is not None:
                    messages += [{"role": "assistant", "content": self._reply(wrong)},
                                 {"role": "user", "content": verdict(row, self._reply(wrong)).feedback}]
            messages.append({"role": "assistant", "content": right})
            if self.revise and not self.stop_on_success:
                turns = sum(m["role"] == "assistant" for m in messages)
                messages += [{"role": "user", "content": CORRECT},
                             {"role": "assistant", "content": right}] * (self.max_turns - turns)
            yield {"messages": messages}
            made += 1
            if made == num:
                return

    def corpus(self, num: int = 2000) -> Iterable[str]:
        """The rendered demonstrations, and in revise mode the verifier's messages."""
        yield from super().corpus(num)
        if self.revise:
            yield "\n".join([CORRECT, NO_ANSWER, *(f"Your answer scores {v:.3g} out of 1. Try again."
                                                   for v in (0.0, 0.01, 0.25, 0.5, 0.75, 0.999))])


def _rg_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    _rg()
    try:
        return version("reasoning-gym")
    except PackageNotFoundError:
        return "unknown"
