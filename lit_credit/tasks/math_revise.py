"""Task ``math_revise``: TCPO's multi-turn math refinement.

Each turn the policy answers; a verifier (:func:`~lit_credit.rewards.math_answer.math_score`, math-verify
equivalence) scores the answer 0 or 1 and, on a miss, says so (with a too-high / too-low hint when both
answers are numbers). With ``stop_on_success`` the episode stops at success or after ``max_turns`` turns;
without it, it always runs ``max_turns`` turns, a right answer is answered with :data:`CORRECT` and the
final turn decides (see :mod:`lit_credit.tasks.revise`).
"""
from __future__ import annotations

import random
import re
from collections.abc import Iterable, Iterator
from typing import Any

import datasets

from lit_credit.rewards.math_answer import extract_answer, load_math_jsonl, math_score
from lit_credit.tasks.base import Task, disjoint_train, heldout_split
from lit_credit.tasks.revise import RevisionEnvironment, Verdict, check_stop_on_success

NAMES = ("Ana", "Ben", "Chloe", "Dev", "Eun", "Femi", "Gus", "Hana")
ITEMS = ("apples", "books", "coins", "pens", "cards", "shells")
# (template, answer(a, b, c)); a, b, c are drawn in [1, max_operand].
WORD = (
    ("{n} has {a} {i} and gets {b} more. How many {i} does {n} have now?", lambda a, b, c: a + b),
    ("{n} has {a} {i} and {b} more than that in a box. How many {i} are in the box?", lambda a, b, c: a + b),
    ("{n} had {s} {i} and gave away {b}. How many {i} are left?", lambda a, b, c: a),  # s = a + b
    ("{n} buys {a} bags with {b} {i} each. How many {i} is that?", lambda a, b, c: a * b),
    ("{n} has {a} {i}, gets {b} more, then loses {c}. How many {i} now?", lambda a, b, c: a + b - c),
)
ARITH = (("What is {a} + {b} - {c}?", lambda a, b, c: a + b - c),
         ("What is {a} * {b} + {c}?", lambda a, b, c: a * b + c),
         ("What is {a} + {b} * {c}?", lambda a, b, c: a + b * c))
# The surface words a WORD template varies: a name, an item word (whole words only).
_SURFACE = re.compile(r"\b(?:(?P<n>" + "|".join(NAMES) + r")|(?P<i>" + "|".join(ITEMS) + r"))\b")


def surface_free(question: str) -> str:
    """``question`` with every name of :data:`NAMES` and item word of :data:`ITEMS` replaced by ``{n}`` /
    ``{i}``: its template with the operands filled in (``"Ana has 3 pens and gets 4 more. ..."`` and ``"Ben
    has 3 coins and gets 4 more. ..."`` are both ``"{n} has 3 {i} and gets 4 more. ..."``)."""
    return _SURFACE.sub(lambda m: "{n}" if m.group("n") else "{i}", question)


def content_key(row: dict[str, Any]) -> str:
    """A synthetic row's content key: :func:`surface_free` of its question (template + operands). Two
    templates that compute the same expression stay two problems (a word problem is not the bare sum)."""
    return surface_free(row["prompt"][-1]["content"])


def text_key(row: dict[str, Any]) -> str:
    """A JSONL row's content key: its question, case-folded, whitespace collapsed (real problems have no
    template to strip, so only exact repeats are one problem)."""
    return " ".join(row["prompt"][-1]["content"].casefold().split())


CORRECT = "Your answer is correct."  # the verifier's neutral reply to a right answer (shown when the episode goes on)


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def math_verdict(row: dict[str, Any], reply: str) -> Verdict:
    """Score 1 with feedback :data:`CORRECT` when the reply's answer is equivalent to ``row["answer"]``
    (math-verify), else 0 with feedback:
    ``"<x> is too high. Try again."`` / ``"too low"`` when both are numbers, otherwise ``"... is wrong"`` or
    ``"No answer found. Reply with the answer."``."""
    if math_score(reply, row["answer"]) == 1.0:
        return Verdict(1.0, CORRECT)
    pred = extract_answer(reply)
    if pred is None:
        return Verdict(0.0, "No answer found. Reply with the answer.")
    guess, gold = _number(pred), _number(row["answer"])
    if guess is None or gold is None:
        return Verdict(0.0, f"{pred} is wrong. Try again.")
    return Verdict(0.0, f"{pred} is too {'high' if guess > gold else 'low'}. Try again.")


class MathReviseTask(Task):
    """Math problems answered over up to ``max_turns`` turns against :func:`math_verdict`.

    Synthetic mode (default): word problems (:data:`WORD`) and two-operation arithmetic (:data:`ARITH`) with
    operands in [1, ``max_operand``], non-negative integer answers; ``kinds`` picks ``word``, ``arith`` or
    both. Train and test are disjoint in content (:func:`~lit_credit.tasks.base.heldout_split` on
    :func:`content_key`: no training problem has a held-out problem's template and operands under other names
    or items), deterministic in ``seed``. Rows: ``prompt``, ``answer`` (str), ``id``, ``kind``.

    JSONL mode (``jsonl_path``, e.g. MATH-500): rows from
    :func:`~lit_credit.rewards.math_answer.load_math_jsonl`; the test split is ``test_jsonl_path`` or the
    first ``num_test`` rows of a seeded shuffle; a training row that repeats a held-out problem
    (:func:`text_key`) is dropped. Only their final answers are known, so demonstrations are
    ``\\boxed{answer}`` replies (single-turn, or kept to ``max_turns`` turns without ``stop_on_success``).

    Demonstrations (synthetic): a share ``revise_frac`` first answers wrongly (off by 1-3), sees the
    verifier's hint and answers right, so the warm-started policy knows what a revision looks like. Without
    ``stop_on_success`` every demonstration then runs to ``max_turns`` turns: after the right answer the
    verifier says :data:`CORRECT` and the demonstration repeats the right answer, so the policy knows the
    protocol (a kept answer) before RL.
    """

    name = "math_revise"

    def __init__(self, num_train: int = 2000, num_test: int = 100, max_turns: int = 3, kinds: str = "word,arith",
                 max_operand: int = 12, revise_frac: float = 0.4, seed: int = 0, jsonl_path: str | None = None,
                 test_jsonl_path: str | None = None, stop_on_success: bool = True) -> None:
        self.kinds = tuple(k for k in kinds.replace(" ", "").split(",") if k)
        if not self.kinds or set(self.kinds) - {"word", "arith"}:
            raise ValueError(f"task.kinds={kinds!r}: use 'word', 'arith' or 'word,arith'")
        if max_operand < 2:
            raise ValueError(f"task.max_operand={max_operand}: must be >= 2")
        if num_test < 1 or num_train < 1:
            raise ValueError(f"task.num_train={num_train}, task.num_test={num_test}: both must be >= 1")
        if max_turns < 1:
            raise ValueError(f"task.max_turns={max_turns}: must be >= 1")
        self.num_train, self.num_test, self.max_turns = num_train, num_test, max_turns
        self.max_operand, self.revise_frac, self.seed = max_operand, revise_frac, seed
        self.kinds_key = ",".join(self.kinds)
        self.jsonl_path, self.test_jsonl_path = jsonl_path, test_jsonl_path
        # a plain attribute, so part of the embedded policy's cache key: it changes the demonstrations
        self.stop_on_success = check_stop_on_success(stop_on_success)
        self._splits: dict[str, datasets.Dataset] = {}

    # ------------------------------------------------------------------ synthetic problems
    def _draws(self, rng: random.Random) -> Iterator[dict[str, Any]]:
        templates = [("word", t) for t in WORD if "word" in self.kinds] + \
                    [("arith", t) for t in ARITH if "arith" in self.kinds]
        while True:
            kind, (text, answer) = rng.choice(templates)
            a, b, c = (rng.randint(1, self.max_operand) for _ in range(3))
            value = answer(a, b, c)
            if value < 0:
                continue
            question = text.format(n=rng.choice(NAMES), i=rng.choice(ITEMS), a=a, b=b, c=c, s=a + b)
            yield {"prompt": [{"role": "user", "content": question}], "answer": str(value), "id": question,
                   "kind": kind}

    def _synthetic(self) -> dict[str, list[dict[str, Any]]]:
        return heldout_split(self._draws(random.Random(self.seed)), content_key, self.num_train, self.num_test)

    def _jsonl(self) -> dict[str, list[dict[str, Any]]]:
        rows = load_math_jsonl(self.jsonl_path)
        if self.test_jsonl_path is not None:
            test = load_math_jsonl(self.test_jsonl_path)[: self.num_test]
        else:
            if self.num_test >= len(rows):
                raise ValueError(f"task.num_test={self.num_test}: {self.jsonl_path} holds only {len(rows)} problems")
            random.Random(self.seed).shuffle(rows)
            test, rows = rows[: self.num_test], rows[self.num_test:]
        # a training problem that repeats a held-out one (text_key) is dropped
        train = disjoint_train(rows, text_key, {text_key(r) for r in test}, None,
                               distinct=lambda r: id(r))  # every row of the file counts, as before
        return {"test": test, "train": train[: self.num_train]}

    # ------------------------------------------------------------------ Task API
    def dataset(self, split: str) -> datasets.Dataset:
        if split not in ("train", "test"):
            raise ValueError(f"split={split!r}: use 'train' or 'test'")
        if not self._splits:
            splits = self._jsonl() if self.jsonl_path is not None else self._synthetic()
            self._splits = {k: datasets.Dataset.from_list(v) for k, v in splits.items()}
        return self._splits[split]

    def environment(self) -> RevisionEnvironment:
        return RevisionEnvironment(math_verdict, max_turns=self.max_turns, stop_on_success=self.stop_on_success)

    def _keep(self, messages: list[dict[str, str]], right: str) -> list[dict[str, str]]:
        """``messages`` ending in the right answer ``right``; without ``stop_on_success``, continued to
        ``max_turns`` assistant turns by the verifier's :data:`CORRECT` and the same answer again."""
        turns = sum(m["role"] == "assistant" for m in messages)
        repeat = [{"role": "user", "content": CORRECT}, {"role": "assistant", "content": right}]
        return messages + ([] if self.stop_on_success else repeat * (self.max_turns - turns))

    def demonstrations(self, num: int, seed: int) -> Iterable[dict[str, Any]]:
        held_out = {content_key(row) for row in self.dataset("test")}
        if self.jsonl_path is not None:
            rows = list(self.dataset("train"))
            for i in range(num):
                row = rows[i % len(rows)]
                right = f"\\boxed{{{row['answer']}}}"
                yield {"messages": self._keep([*row["prompt"], {"role": "assistant", "content": right}], right)}
            return
        rng, made = random.Random(f"demo:{self.seed}:{seed}"), 0
        for row in self._draws(random.Random(f"demo-rows:{self.seed}:{seed}")):
            if content_key(row) in held_out:
                continue
            messages = list(row["prompt"])
            if self.max_turns > 1 and rng.random() < self.revise_frac:
                wrong = str(max(0, int(row["answer"]) + rng.choice((-3, -2, -1, 1, 2, 3))))
                if wrong != row["answer"]:
                    messages += [{"role": "assistant", "content": wrong},
                                 {"role": "user", "content": math_verdict(row, wrong).feedback}]
            yield {"messages": self._keep([*messages, {"role": "assistant", "content": row["answer"]}], row["answer"])}
            made += 1
            if made == num:
                return
