"""Task ``form``: DPA-GRPO's structured form, Form 1040 (TY2024) filled one line at a time
(docs/methods.md §3).

A row is one line decision: the case's inputs, the lines before it on the form (gold values: a fixed
history) and the line to fill. The four roles of the DPA game read the same context with their own
instruction (:func:`role_prompt`):

* ``proposer`` (generator) replies with the line's dollar amount ``x``;
* ``verifier`` replies with a decision line ``{"target_line": ..., "decision": "NS"|"SAC"}`` and, on SAC, a
  second line ``{"claim": ..., "argument": ..., "evidence": ...}`` (the structured challenge);
* ``reviser`` (generator) reads the challenge and replies with a revised amount ``z``;
* ``approver`` (generator) reads x, the challenge and z and replies ``{"target_line": ..., "decision":
  "KEEP"|"REVISE"}``.

The decision lines are the canonical action strings (:func:`action_text`), so the paired counterfactual
loss scores exactly the tokens a role emits for its decision. Gold values come from
:func:`~lit_credit.tasks.form1040.compute_1040`; test rows can instead come from the public TaxCalcBench
TY2024 cases the engine can represent (:func:`~lit_credit.tasks.form1040.load_taxcalcbench`).
"""
from __future__ import annotations

import itertools
import json
import random
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import datasets

from lit_credit.tasks.base import Task, disjoint_train, heldout_split
from lit_credit.tasks.form1040 import (
    EVALUATED_LINES,
    TaxInput,
    compute_1040,
    generate_case,
    load_taxcalcbench,
    normalize_line_key,
)

ROLES = ("proposer", "verifier", "reviser", "approver")
INSTRUCTIONS = {
    "proposer": "Fill in one line of Form 1040 (2024). Reply with its dollar amount.",
    "verifier": "Check one line of Form 1040 (2024). Reply NS if it is right, SAC and a challenge if it is wrong.",
    "reviser": "A line of Form 1040 (2024) was challenged. Reply with its correct dollar amount.",
    "approver": "A line of Form 1040 (2024) was challenged and revised. KEEP the line or REVISE it.",
}
# How each line is computed, in the terms a challenge argues with ({n} = the value of line n on the form).
RULES = {
    "1a": "sum of W-2 wages", "9": "{1a} + interest + dividends + gain", "10": "no adjustments",
    "11": "{9} - {10}", "12": "standard deduction", "15": "{11} - {12}", "16": "tax on {15}",
    "19": "child credits up to {16}", "24": "{16} - {19}", "25d": "sum of W-2 withholding",
    "26": "estimated payments", "27": "no EIC", "28": "additional child tax credit", "29": "none",
    "32": "{27} + {28} + {29}", "33": "{25d} + {26} + {32}", "34": "{33} - {24} if positive", "35a": "{34}",
    "37": "{24} - {33} if positive",
}  # fmt: skip


def _amount(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"


def render_case(inp: TaxInput) -> str:
    """The inputs on one line, zero fields left out: ``single | w2 52300/4100 | interest 120 | ...``."""
    parts = [inp.filing_status.replace("_", " ")]
    parts += [f"w2 {_amount(w)}/{_amount(h)}" for w, h in inp.w2s]
    if inp.taxable_interest:
        parts.append(f"interest {_amount(inp.taxable_interest)}")
    if inp.ordinary_dividends:
        parts.append(f"dividends {_amount(inp.ordinary_dividends)} (qualified {_amount(inp.qualified_dividends)})")
    for name, value in (("gain", inp.capital_gain), ("children", inp.num_qualifying_children),
                        ("other dependents", inp.num_other_dependents),
                        ("estimated", inp.estimated_payments), ("65 or blind", inp.taxpayer_65_or_blind)):
        if value:
            parts.append(f"{name} {_amount(value)}")
    return " | ".join(parts)


def line_rows(case_id: str, inp: TaxInput, gold: dict[str, int], lines: tuple[str, ...]) -> list[dict[str, Any]]:
    """One row per line of ``lines`` present in ``gold``: the context holds the case and every earlier line
    of the form with its gold value."""
    case = render_case(inp)
    rows, form = [], []
    for line in EVALUATED_LINES:
        if line not in gold:
            continue
        if line in lines:
            context = case + "\n" + ("form: " + ", ".join(form) + "\n" if form else "")
            rows.append({"id": f"{case_id}/{line}", "case": json.dumps(_inputs(inp)), "line": line,
                         "gold": int(gold[line]), "context": context,
                         "prompt": role_prompt({"context": context, "line": line}, "proposer")})
        form.append(f"{line} {gold[line]}")
    return rows


def _inputs(inp: TaxInput) -> dict[str, Any]:
    return {k: (list(map(list, v)) if k == "w2s" else v) for k, v in vars(inp).items()}


def case_key(inputs: dict[str, Any]) -> str:
    """The content key of a case's inputs (a row's ``case`` decoded, or :func:`_inputs`): every field, numbers
    as floats (``52300`` and ``52300.0`` are one amount), the W-2s sorted (their order changes no line), as
    sorted-key JSON. The case id and the rendering are not part of it."""
    def num(v: Any) -> Any:
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v

    canon = {k: num(v) for k, v in inputs.items() if k != "w2s"}
    canon["w2s"] = sorted([num(w), num(h)] for w, h in inputs.get("w2s", ()))
    return json.dumps(canon, sort_keys=True)


def content_key(row: dict[str, Any]) -> str:
    """A row's content key: :func:`case_key` of its ``case``. Every line of one case shares it (the context of
    a later line shows the gold values of the earlier ones), so a case is held out whole."""
    return case_key(json.loads(row["case"]))


def action_text(line: str, decision: str) -> str:
    """The canonical action string of a decision: ``{"target_line": "15", "decision": "SAC"}``."""
    return json.dumps({"target_line": line, "decision": decision})


def challenge_text(challenge: dict[str, str]) -> str:
    return json.dumps({k: challenge.get(k, "") for k in ("claim", "argument", "evidence")})


def role_prompt(row: dict[str, Any], role: str, x: str | None = None, challenge: dict[str, str] | None = None,
                z: str | None = None) -> list[dict[str, str]]:
    """The chat messages a role answers for ``row`` (its ``context`` and ``line``)."""
    if role not in ROLES:
        raise ValueError(f"role={role!r}: use one of {ROLES}")
    text = row["context"] + f"line {row['line']}"
    if role == "proposer":
        text += "?"
    else:
        text += f": {x}"
    if role in ("reviser", "approver"):
        text += "\nchallenge: " + challenge_text(challenge or {})
    if role == "approver":
        text += f"\nrevision: {z}"
    return [{"role": "system", "content": INSTRUCTIONS[role]}, {"role": "user", "content": text}]


def _json_line(text: str) -> dict | None:
    """The JSON object on ``text``, else None (not JSON, not an object, or nested too deeply to decode)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def parse_decision(text: str, choices: tuple[str, ...]) -> tuple[str | None, dict[str, str]]:
    """``(decision, challenge)`` from a verifier or approver reply; decision None when the first line is not a
    JSON object whose ``decision`` is one of ``choices``. The challenge (verifier SAC) is the second line's
    ``claim``/``argument``/``evidence`` strings ({} when absent or malformed). Never raises on the reply
    (a non-string reads as an empty one)."""
    lines = text.strip().splitlines() if isinstance(text, str) else []
    head = _json_line(lines[0]) if lines else None
    decision = str(head.get("decision", "")).upper() if head else None
    if decision not in choices:
        return None, {}
    tail = _json_line(lines[1]) if len(lines) > 1 else None
    challenge = {k: str(tail.get(k, "")) for k in ("claim", "argument", "evidence")} if tail else {}
    return decision, challenge


def gold_challenge(row: dict[str, Any], context_values: dict[str, int]) -> dict[str, str]:
    """The challenge a perfect verifier raises: the correct amount, the line's rule, the rule with numbers."""
    rule = RULES[row["line"]]
    evidence = re.sub(r"\{(\w+)\}", lambda m: str(context_values.get(m.group(1), 0)), rule) if "{" in rule else ""
    return {"claim": str(row["gold"]), "argument": rule.replace("{", "").replace("}", ""), "evidence": evidence}


def _context_values(row: dict[str, Any]) -> dict[str, int]:
    form = row["context"].split("form: ", 1)
    if len(form) == 1:
        return {}
    return {k: int(v) for k, v in (item.split(" ") for item in form[1].strip().split(", "))}


def wrong_value(rng: random.Random, row: dict[str, Any]) -> int:
    """A plausible mistake on ``row``'s line: one digit changed, off by 10/100/1000, or an earlier line's
    value (never the gold value)."""
    gold = row["gold"]
    earlier = [v for v in _context_values(row).values() if v != gold]
    for _ in range(20):
        kind = rng.random()
        if kind < 0.4:
            digits = list(str(abs(gold)))
            i = rng.randrange(len(digits))
            digits[i] = str((int(digits[i]) + rng.randint(1, 9)) % 10)
            value = int("".join(digits))
        elif kind < 0.75 or not earlier:
            value = gold + rng.choice((-1, 1)) * rng.choice((10, 100, 1000))
        else:
            value = rng.choice(earlier)
        if value != gold and value >= 0:
            return value
    return gold + 1


def _items(value: Sequence | str | int) -> list:
    """A list from a YAML list or a comma-separated string (``"1a,15"``)."""
    if isinstance(value, str):
        return [v for v in value.replace(" ", "").split(",") if v]
    return list(value) if isinstance(value, Sequence) or hasattr(value, "__iter__") else [value]


class FormTask(Task):
    """Form 1040 line decisions for DPA-GRPO and its generator-only baselines.

    Train rows: ``num_train`` synthetic cases (:func:`~lit_credit.tasks.form1040.generate_case`, difficulty
    drawn from ``difficulties``) x ``lines``; test rows: ``num_test`` other cases (the splits are disjoint in
    content: no train case has a test case's inputs, :func:`content_key`), or, with ``taxcalcbench_dir``
    (a tax-calc-bench checkout or its ``tax_calc_bench/ty24/test_data``), every TY2024 case the engine can
    represent x ``lines``, gold from the case's ``output.xml`` (:func:`load_taxcalcbench`: the other cases
    are skipped with a logged reason; the report is kept as ``self.taxcalcbench``; no readable case is an
    error naming ``task.taxcalcbench_dir``). Rows are
    shuffled (seeded) so a validation prefix covers many lines. ``rl_lines`` (a subset of ``lines``; None:
    ``lines``) narrows the train and test rows to those lines while the demonstrations keep all of ``lines``,
    so RL can be pointed at the lines where the SFT start is middling without changing that start (it is not
    part of the embedded policy's cache key). Row fields: ``id`` (``case/line``), ``case``
    (the inputs as JSON), ``line``, ``gold``, ``context``, ``prompt`` (the proposer's messages).

    Demonstrations (the SFT warm start) cover all four roles (``role_mix`` proposer, verifier, reviser,
    approver). A share ``wrong_frac`` of verifier / reviser / approver demos see a wrong ``x``
    (:func:`wrong_value`): the verifier answers SAC with :func:`gold_challenge` then, else NS; the reviser
    answers the gold value; the approver answers REVISE when x is wrong and the shown revision right,
    else KEEP (the approver table's best action). The base model therefore plays every role, imperfectly.
    """

    name = "form"

    def __init__(self, num_train: int = 400, num_test: int = 20, difficulties: Sequence[int] | str = (1, 2, 3),
                 lines: Sequence[str] | str = EVALUATED_LINES, taxcalcbench_dir: str | None = None,
                 role_mix: Sequence[float] | str = (0.4, 0.25, 0.2, 0.15), wrong_frac: float = 0.5,
                 seed: int = 0, rl_lines: Sequence[str] | str | None = None) -> None:
        self.difficulties = tuple(int(d) for d in _items(difficulties))
        if not self.difficulties or set(self.difficulties) - {1, 2, 3}:
            raise ValueError(f"task.difficulties={difficulties!r}: a comma list of 1, 2, 3")
        self.lines = tuple(normalize_line_key(k) for k in _items(lines))
        unknown = set(self.lines) - set(EVALUATED_LINES)
        if not self.lines or unknown:
            raise ValueError(f"task.lines={lines!r}: unknown {sorted(unknown)}; use lines of {EVALUATED_LINES}")
        # A list, not a tuple: only plain values and tuples enter the embedded policy's cache key, and these
        # lines do not shape the demonstrations.
        self.rl_lines = list(self.lines if rl_lines is None else (normalize_line_key(k) for k in _items(rl_lines)))
        if not self.rl_lines or set(self.rl_lines) - set(self.lines):
            raise ValueError(f"task.rl_lines={rl_lines!r}: a non-empty subset of task.lines {list(self.lines)}")
        mix = tuple(float(w) for w in _items(role_mix))
        if len(mix) != 4 or min(mix) < 0 or sum(mix) <= 0:
            raise ValueError(f"task.role_mix={role_mix!r}: 4 weights >= 0 (proposer, verifier, reviser, approver)")
        if not 0 <= wrong_frac <= 1:
            raise ValueError(f"task.wrong_frac={wrong_frac}: must be in [0, 1]")
        self.num_train, self.num_test, self.seed = num_train, num_test, seed
        self.taxcalcbench_dir, self.role_mix, self.wrong_frac = taxcalcbench_dir, mix, wrong_frac
        self._cache: dict[str, datasets.Dataset] = {}
        self._case_splits: dict[str, list[tuple[str, TaxInput, dict[str, int]]]] = {}

    def _bench_cases(self) -> list[tuple[str, TaxInput, dict[str, int]]]:
        try:
            self.taxcalcbench = load_taxcalcbench(self.taxcalcbench_dir)  # cases + skip report (logged)
        except FileNotFoundError as e:
            raise FileNotFoundError(f"task.taxcalcbench_dir={self.taxcalcbench_dir!r}: {e}") from e
        if not self.taxcalcbench.cases:
            raise ValueError(
                f"task.taxcalcbench_dir={self.taxcalcbench_dir!r}: no case could be read.\n"
                f"{self.taxcalcbench.summary()}\nFix: point it at a tax-calc-bench checkout (or its "
                f"tax_calc_bench/ty24/test_data), or set task.taxcalcbench_dir=null for synthetic test cases."
            )
        return self.taxcalcbench.cases

    def _draws(self, split: str) -> Iterator[dict[str, Any]]:
        """Endless synthetic cases of ``split``'s seeded stream: ``{"id": draw index, "inp", "key"}``."""
        rng = random.Random(f"form-{self.seed}-{split}")
        for i in itertools.count():
            inp = generate_case(rng, rng.choice(self.difficulties))
            yield {"id": i, "inp": inp, "key": case_key(_inputs(inp))}

    def _cases(self, split: str) -> list[tuple[str, TaxInput, dict[str, int]]]:
        """The cases of ``split``, disjoint in content (:func:`case_key`, the inputs) across the splits: the
        test cases are the first ``num_test`` distinct ones of the test stream (or the TaxCalcBench cases), the
        train cases the first ``num_train`` of the train stream whose inputs are no test case's."""
        if not self._case_splits:
            fix = "lower task.num_train / task.num_test or add difficulties to task.difficulties"
            if self.taxcalcbench_dir:
                test = self._bench_cases()
                train = disjoint_train(self._draws("train"), lambda c: c["key"],
                                       {case_key(_inputs(inp)) for _, inp, _ in test}, self.num_train, fix=fix)
                self._case_splits = {"test": test, "train": self._numbered("train", train)}
            else:
                split_draws = heldout_split(self._draws("test"), lambda c: c["key"], self.num_train, self.num_test,
                                            fix=fix, train_draws=self._draws("train"))
                self._case_splits = {s: self._numbered(s, c) for s, c in split_draws.items()}
        return self._case_splits[split]

    @staticmethod
    def _numbered(split: str, draws: list[dict[str, Any]]) -> list[tuple[str, TaxInput, dict[str, int]]]:
        return [(f"{split}{i}", c["inp"], compute_1040(c["inp"])) for i, c in enumerate(draws)]

    def _rows(self, split: str, lines: Sequence[str]) -> list[dict[str, Any]]:
        rows = [r for cid, inp, gold in self._cases(split) for r in line_rows(cid, inp, gold, tuple(lines))]
        random.Random(f"form-rows-{self.seed}-{split}").shuffle(rows)
        return rows

    def dataset(self, split: str) -> datasets.Dataset:
        if split not in ("train", "test"):
            raise ValueError(f"split={split!r}: use 'train' or 'test'")
        if split not in self._cache:
            self._cache[split] = datasets.Dataset.from_list(self._rows(split, self.rl_lines))
        return self._cache[split]

    def demonstrations(self, num: int, seed: int) -> Iterable[dict[str, Any]]:
        rows = self._rows("train", self.lines)
        rng = random.Random(seed)
        for _ in range(num):
            row = rng.choice(rows)
            role = rng.choices(ROLES, weights=self.role_mix)[0]
            gold = str(row["gold"])
            x_wrong = rng.random() < self.wrong_frac
            x = str(wrong_value(rng, row)) if x_wrong else gold
            challenge = gold_challenge(row, _context_values(row))
            if role == "proposer":
                prompt, reply = row["prompt"], gold
            elif role == "verifier":
                prompt = role_prompt(row, role, x)
                reply = action_text(row["line"], "SAC") + "\n" + challenge_text(challenge) if x_wrong \
                    else action_text(row["line"], "NS")
            elif role == "reviser":
                prompt, reply = role_prompt(row, role, x, challenge), gold
            else:
                z = gold if rng.random() < 0.5 else str(wrong_value(rng, row))
                decision = "REVISE" if x_wrong and z == gold else "KEEP"
                prompt, reply = role_prompt(row, role, x, challenge, z), action_text(row["line"], decision)
            yield {"messages": [*prompt, {"role": "assistant", "content": reply}]}
