"""The bad-input corpus (tests/data/bad_inputs/*.jsonl): every entry point fed what a model, a judge or a
broken reward can produce, each with its expected outcome written out.

A case is one JSON line ``{"id", "kind", "target", "input", "expect"}`` (plus an optional ``"note"``: the
hand derivation of the expected value, as JSON has no comments). ``target`` names a runner below
(the real entry point it calls); ``expect`` is either ``{"result": ...}``, compared key by key with what the
runner observed (floats to ``TOL``), or ``{"error": "ValueError", "match": "..."}``, an exception of that
type whose message contains ``match``. Any other exception fails the case. ``"max_seconds"`` bounds the
wall time of a case whose input once took quadratic time.

Inputs may hold two compact forms, expanded before the call, so megabyte inputs need no megabyte file:
``{"$repeat": "x", "times": 1000000}`` -> ``"x" * 1000000`` and ``{"$concat": [part, ...]}`` -> the parts
(each expanded) joined. In tensors, the strings ``"nan"``, ``"inf"``, ``"-inf"`` are those floats.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from lit_credit.credit import get
from lit_credit.losses import ClippedSurrogate, GSPOSurrogate, PolicyLoss, ReinforceSurrogate
from lit_credit.rewards.exact_match import ExactMatchReward
from lit_credit.rewards.form_line import FormLineReward
from lit_credit.rewards.hierr import (
    HierRReward,
    normalize_gold_calls,
    parse_tool_calls,
    tool_process_score,
    tool_turn_scores,
)
from lit_credit.rewards.judges import LLMJudge, RubricJudge, SummaryJudge, parse_rating
from lit_credit.rewards.math_answer import extract_answer, math_score
from lit_credit.tasks.code_revise import extract_code
from lit_credit.tasks.form import parse_decision
from lit_credit.types import RewardResult, RolloutBatch

CORPUS_DIR = Path(__file__).parent / "data" / "bad_inputs"
KINDS = {
    "malformed_block", "unbalanced_tags", "non_json", "wrong_type", "unknown_tool", "huge_arguments",
    "unicode", "empty_reply", "truncated", "bad_gold", "judge_rating", "judge_guard", "math_answer",
    "exact_match", "form_parse", "code_extract", "nonfinite_scores", "empty_batch", "empty_group",
    "singleton_group", "no_learnable_token", "missing_field", "shape_mismatch",
}
ERRORS = {"ValueError": ValueError}
TOL = 1e-9  # rewards and parsers: hand-computed exact values
CREDIT_TOL = 1e-5  # float32 tensors


def load_corpus() -> list[dict[str, Any]]:
    cases = []
    for path in sorted(CORPUS_DIR.glob("*.jsonl")):
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                case = json.loads(line)
                case["_where"] = f"{path.name}:{lineno}"
                cases.append(case)
    return cases


CASES = load_corpus()


def expand(x: Any) -> Any:
    """Expand the ``$repeat`` / ``$concat`` forms anywhere in ``x``."""
    if isinstance(x, dict):
        if "$repeat" in x:
            return x["$repeat"] * x["times"]
        if "$concat" in x:
            return "".join(expand(p) for p in x["$concat"])
        return {k: expand(v) for k, v in x.items()}
    if isinstance(x, list):
        return [expand(v) for v in x]
    return x


def floats(x: Any) -> Any:
    """Nested lists with "nan" / "inf" / "-inf" strings -> the same lists of floats."""
    if isinstance(x, list):
        return [floats(v) for v in x]
    return float(x) if isinstance(x, str) else x


# ------------------------------------------------------------------------------------------------ runners
def run_tool_call(inp):
    """tool_process_score's six parts plus the parse of the same text: tag counts and each block's reason."""
    parsed = parse_tool_calls(inp["text"], inp.get("allowed"))
    weights = {k: float(v) for k, v in inp["weights"].items()} if "weights" in inp else None
    parts = tool_process_score(inp["text"], inp.get("gold", []), inp.get("allowed"), weights)
    return {**parts, "n_open": parsed.n_open, "n_close": parsed.n_close, "n_valid": parsed.n_valid,
            "reasons": [b.reason for b in parsed.blocks], "calls": parsed.calls}


class RaisingJudge(SummaryJudge):
    def rate(self, question, tool_responses, reply):
        raise ZeroDivisionError("backend bug")


class ConstantJudge(SummaryJudge):
    def __init__(self, value):
        super().__init__()
        self.value = value

    def rate(self, question, tool_responses, reply):
        return self.value


def make_judge(inp) -> SummaryJudge:
    backend = inp.get("backend", "rubric")
    if backend == "raises":
        return RaisingJudge()
    if backend == "returns":
        return ConstantJudge(inp["value"])
    return RubricJudge()


def reward_result(result: RewardResult) -> dict[str, Any]:
    """A RewardResult as the corpus writes it: ``{"score", "parts", "turns"}`` (per-turn lists apart)."""
    return {"score": result.score, "parts": result.parts, "turns": result.turns}


def run_hierr_reward(inp):
    reward = HierRReward(judge=make_judge(inp))
    return reward_result(reward(inp["row"], inp["replies"], tool_responses=inp.get("tool_responses")))


def run_tool_turn_scores(inp):
    turns = tool_turn_scores(inp["turns"], inp["gold"], inp.get("allowed"))
    return {"process": [t["process"] for t in turns], "exact": [t["exact"] for t in turns]}


def run_normalize_gold(inp):
    return {"gold": normalize_gold_calls(inp["gold"])}


def judge_result(judge, result) -> dict[str, Any]:
    return {"score": result.score, "rating": result.rating, "failed": result.failed, "reason": result.reason,
            "failures": judge.failures}


def run_summary_judge(inp):
    judge = make_judge(inp)
    return judge_result(judge, judge(inp["question"], inp["tool_responses"], inp["reply"]))


def run_llm_judge(inp):
    outputs = list(inp.get("outputs", []))

    def generate(prompt: str) -> str:
        if inp.get("raise"):
            raise RuntimeError("judge backend down")
        return outputs.pop(0) if len(outputs) > 1 else outputs[0]

    judge = LLMJudge(generate, max_retries=inp.get("max_retries", 2), backoff=0.0)
    result = judge(inp["question"], inp["tool_responses"], inp["reply"])
    return {**judge_result(judge, result), "calls": judge.calls}


def build_batch(spec: dict[str, Any]) -> RolloutBatch:
    """A RolloutBatch from lists; ``turn_ids`` defaults to each learnable run's index (-1 off the mask).
    ``reward_parts`` ([B]), ``turn_parts`` ([B, K]) and ``extras`` become the batch's dicts of the same names."""
    rows = spec["response_mask"]
    mask = torch.tensor(rows, dtype=torch.float32) if rows else torch.zeros(0, spec["T"])
    if "turn_ids" in spec:
        turn_ids = torch.tensor(spec["turn_ids"], dtype=torch.long).reshape(mask.shape)
    else:
        m = mask.bool()
        starts = m & ~torch.cat([m.new_zeros(m.shape[0], 1), m[:, :-1]], 1)
        turn_ids = torch.where(m, starts.long().cumsum(1) - 1, -1)

    def tensor(values, dtype=torch.float32, k: int | None = None):
        t = torch.tensor(floats(values), dtype=dtype)
        return t.reshape(0, k) if t.numel() == 0 and k else t

    k = spec.get("K")
    fields: dict[str, Any] = {}
    if "turn_scores" in spec:
        fields["turn_scores"] = tensor(spec["turn_scores"], k=k)
        fields["turn_mask"] = tensor(spec["turn_mask"], torch.bool, k=k)
    parts = {key: tensor(v) for key, v in spec.get("reward_parts", {}).items()}
    turn_parts = {key: tensor(v, k=k) for key, v in spec.get("turn_parts", {}).items()}
    extras = {key: tensor(v, k=k) for key, v in spec.get("extras", {}).items()}
    b, n_tok = mask.shape
    return RolloutBatch(
        input_ids=torch.zeros(b, n_tok, dtype=torch.long),
        attention_mask=torch.ones(b, n_tok, dtype=torch.long),
        response_mask=mask,
        turn_ids=turn_ids,
        group_ids=torch.tensor(spec["group_ids"], dtype=torch.long),
        behaviour_logprobs=torch.zeros(b, n_tok),
        scores=tensor(spec["scores"]),
        reward_parts=parts,
        turn_parts=turn_parts,
        extras=extras,
        **fields,
    )


def run_credit(inp):
    batch = build_batch(inp["batch"])
    out = get(inp["estimator"])(**inp.get("config", {}))(batch)
    adv = out.advantages
    # the contract every estimator keeps, whatever the case asserts on top
    assert adv.shape == batch.response_mask.shape
    assert torch.isfinite(adv).all()
    assert (adv[batch.response_mask == 0] == 0).all()
    return {"advantages": adv.tolist(), "parts": {k: v.tolist() for k, v in out.parts.items()},
            "metrics": out.metrics}


SURROGATES = {"clip": ClippedSurrogate, "gspo": GSPOSurrogate, "reinforce": ReinforceSurrogate}


def run_policy_loss(inp):
    logp = torch.tensor(floats(inp["logp"]), dtype=torch.float32, requires_grad=True)
    old = torch.tensor(floats(inp["old_logp"]), dtype=torch.float32)
    adv = torch.tensor(floats(inp["advantages"]), dtype=torch.float32)
    mask = torch.tensor(inp["mask"], dtype=torch.float32)
    ref = torch.tensor(floats(inp["ref_logp"]), dtype=torch.float32) if "ref_logp" in inp else None
    surrogate = SURROGATES[inp["surrogate"]]()
    loss_fn = PolicyLoss(surrogate, inp.get("aggregation", "token-mean"), inp.get("kl_coef", 0.0))
    loss, metrics = loss_fn(logp, old, adv, mask, ref)
    loss.backward()
    grad = logp.grad
    return {"loss": loss.item(), "metrics_finite": all(math.isfinite(v) for v in metrics.values()),
            "grad_finite": bool(torch.isfinite(grad).all()),
            "grad_masked_zero": bool((grad[mask == 0] == 0).all())}


TARGETS = {
    "tool_call": run_tool_call,
    "hierr_reward": run_hierr_reward,
    "tool_turn_scores": run_tool_turn_scores,
    "normalize_gold": run_normalize_gold,
    "parse_rating": lambda inp: {"rating": parse_rating(inp["text"])},
    "summary_judge": run_summary_judge,
    "llm_judge": run_llm_judge,
    "extract_answer": lambda inp: {"answer": extract_answer(inp["text"])},
    "math_score": lambda inp: {"score": math_score(inp["reply"], inp["gold"])},
    "exact_match": lambda inp: reward_result(ExactMatchReward()(inp["row"], inp["replies"])),
    "form_line": lambda inp: reward_result(FormLineReward()(inp["row"], inp["replies"])),
    "parse_decision": lambda inp: dict(zip(("decision", "challenge"),
                                           parse_decision(inp["text"], tuple(inp["choices"])))),
    "extract_code": lambda inp: {"code": extract_code(inp["reply"])},
    "credit": run_credit,
    "policy_loss": run_policy_loss,
}


# ------------------------------------------------------------------------------------------------ checks
def assert_matches(observed: Any, expected: Any, tol: float, path: str = "result") -> None:
    """Every key / element of ``expected`` equals ``observed`` (floats to ``tol``, absolute)."""
    if isinstance(expected, dict):
        assert isinstance(observed, dict), f"{path}: expected a dict, got {observed!r:.200}"
        for key, value in expected.items():
            assert key in observed, f"{path}: missing key {key!r} (has {sorted(observed)})"
            assert_matches(observed[key], value, tol, f"{path}[{key!r}]")
    elif isinstance(expected, list):
        observed = list(observed) if isinstance(observed, tuple) else observed
        assert isinstance(observed, list) and len(observed) == len(expected), \
            f"{path}: expected {len(expected)} items, got {observed!r:.200}"
        for i, (o, e) in enumerate(zip(observed, expected)):
            assert_matches(o, e, tol, f"{path}[{i}]")
    elif isinstance(expected, float) and not isinstance(observed, bool):
        message = f"{path}: expected {expected}, got {observed!r}"
        assert isinstance(observed, (int, float)), message
        assert math.isclose(observed, expected, rel_tol=0, abs_tol=tol), message
    else:
        assert observed == expected and type(observed) is type(expected), \
            f"{path}: expected {expected!r:.200}, got {observed!r:.200}"


def test_corpus_is_well_formed():
    assert len(CASES) >= 60
    ids = [c["id"] for c in CASES]
    assert len(ids) == len(set(ids)), "duplicate case ids"
    for case in CASES:
        assert set(case) >= {"id", "kind", "target", "input", "expect"}, case["_where"]
        assert set(case) <= {"id", "kind", "note", "target", "input", "expect", "max_seconds", "_where"}, \
            f"{case['_where']}: unknown keys"
        assert case["kind"] in KINDS, f"{case['_where']}: unknown kind {case['kind']!r}"
        assert case["target"] in TARGETS, f"{case['_where']}: unknown target {case['target']!r}"
        expect = case["expect"]
        assert ("result" in expect) != ("error" in expect), f"{case['_where']}: result or error, not both"
        if "error" in expect:
            assert expect["error"] in ERRORS and expect.get("match"), f"{case['_where']}: error needs a match"
        else:
            assert expect["result"] not in ({}, None), f"{case['_where']}: an empty expectation says nothing"


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_bad_input(case):
    run, expect = TARGETS[case["target"]], case["expect"]
    inp = expand(case["input"])
    start = time.perf_counter()
    if "error" in expect:
        with pytest.raises(Exception) as err:
            run(inp)
        assert isinstance(err.value, ERRORS[expect["error"]]), \
            f"expected {expect['error']}, got {type(err.value).__name__}: {err.value}"
        assert expect["match"] in str(err.value), f"message {str(err.value)!r} lacks {expect['match']!r}"
    else:
        tol = CREDIT_TOL if case["target"] == "credit" else TOL
        assert_matches(run(inp), expect["result"], tol)
    if "max_seconds" in case:
        assert time.perf_counter() - start < case["max_seconds"], "pathological input took too long"
