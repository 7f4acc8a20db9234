"""Hypothesis fuzzing of what model output and reward data reach: the tool-call parser and the other reply
parsers, every registered credit estimator, and the policy losses.

The one home of the never-raises properties (hand cases: tests/rewards/, bad input: tests/test_bad_inputs.py).
Properties, each a promise of the docstrings / docs/methods.md:
- ``parse_tool_calls`` / ``tool_process_score`` / ``HierRReward`` never raise on any text (also as a block
  body); every HierR part is in [0, 1] (weights sum to 1), the total in [0, 2] or the omission score -0.5;
  ``loose_equal`` is a symmetric bool on any JSON values; the other reply parsers (final reply, think
  stripping, tool responses, math answers, ratings, code, dollar amounts, form decisions, integers) never
  raise; the rubric judge scores in [0, 1] and never fails.
- every registered estimator (``lit_credit.credit.available()``, so a new one is fuzzed too), on random
  group layouts (singletons included), random turn layouts, random masks (all-zero rows included, and turn
  ids left on masked tokens) and random finite rewards (NaN only where the estimator reads nothing):
  finite advantages, exactly 0 wherever ``response_mask == 0``, finite parts and metrics; rollout-level
  normalisers give singleton groups 0.
- the policy losses, with garbage (NaN / inf) under the mask and all-zero masks: finite loss and metrics,
  finite gradients, exactly 0 gradient on masked tokens, and loss 0 on an all-zero mask.

Derandomised (``derandomize=True``): the same examples on every run, so CI is deterministic.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lit_credit.credit import available, get
from lit_credit.credit.tcpo import NORMALIZE, PRESETS
from lit_credit.losses import (
    AGGREGATION_MODES,
    KL_ESTIMATORS,
    ClippedSurrogate,
    GSPOSurrogate,
    PolicyLoss,
    ReinforceSurrogate,
)
from lit_credit.rewards.exact_match import parse_final_integer
from lit_credit.rewards.form_line import parse_value
from lit_credit.rewards.hierr import (
    OPEN,
    HierRReward,
    extract_tool_responses,
    final_reply,
    loose_equal,
    parse_tool_calls,
    strip_think,
    tool_process_score,
)
from lit_credit.rewards.judges import RubricJudge, parse_rating
from lit_credit.rewards.math_answer import extract_answer
from lit_credit.tasks.code_revise import extract_code
from lit_credit.tasks.form import parse_decision
from lit_credit.types import RolloutBatch

FUZZ = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
ALLOWED = ["f", "g"]
REASONS = {"json", "type", "name", "unknown_tool", "arguments", "empty"}

# ------------------------------------------------------------------------------------------------ text
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(["name", "arguments", "x", "y"]), inner, max_size=3),
    max_leaves=8,
)
arguments = st.dictionaries(st.sampled_from(["x", "y"]), json_values, max_size=2)
calls = st.fixed_dictionaries({"name": st.sampled_from(["f", "g", "h", 3, None]),
                               "arguments": st.one_of(arguments, json_values)})
FRAGMENTS = [OPEN, "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>", "{", "}",
             "[", "]", ",", ":", '"name"', '"arguments"', '"parameters"', '"f"', '"x"', "null", "1e999",
             "NaN", "\\ud800", "\ud800", "\x00", "\u202e", "\U0001F326", " ", "\n"]
fragment = st.one_of(
    st.sampled_from(FRAGMENTS),
    st.text(max_size=8),
    json_values.map(lambda v: json.dumps(v)),
    st.one_of(calls, st.lists(calls, max_size=3)).map(lambda c: OPEN + json.dumps(c) + "</tool_call>"),
)
texts = st.lists(fragment, max_size=12).map("".join)
gold_calls = st.lists(  # "h": a gold call to a tool the row does not allow
    st.lists(st.fixed_dictionaries({"name": st.sampled_from([*ALLOWED, "h"]), "arguments": arguments}),
             max_size=2),
    max_size=3,
)
allowed_tools = st.one_of(st.none(), st.just(ALLOWED), st.just([]), st.just('["f"]'), st.just(5))


def check_parsed(parsed, allowed) -> None:
    assert parsed.n_valid <= len(parsed.blocks) <= min(parsed.n_open, parsed.n_close)
    for block in parsed.blocks:
        assert block.valid == (block.reason == "") and (block.valid or block.reason in REASONS)
        # a valid block holds one call per item ([] is the invalid "empty" block here); an invalid one none
        assert len(block.calls) == (len(block.items) if block.valid else 0)
        assert [c for c, _ in block.items if c is not None] == [c for c, r in block.items if not r]
    assert all(c in parsed.executed for c in parsed.calls)  # the environment executes every scored call
    for call in parsed.executed:
        assert isinstance(call["name"], str) and isinstance(call["arguments"], dict)
        assert allowed != ALLOWED or call["name"] in ALLOWED


@FUZZ
@given(text=st.one_of(texts, st.none(), st.integers()), body=st.text(max_size=200), allowed=allowed_tools)
def test_parse_tool_calls_never_raises(text, body, allowed):
    check_parsed(parse_tool_calls(text, allowed), allowed)
    check_parsed(parse_tool_calls(OPEN + body + "</tool_call>", allowed), allowed)  # any text as a block body


@FUZZ
@given(text=texts, gold=gold_calls, allowed=allowed_tools)
def test_tool_process_score_in_unit_interval(text, gold, allowed):
    parts = tool_process_score(text, gold, allowed)
    assert set(parts) == {"format", "name", "key", "value", "parallel", "process"}
    for name, value in parts.items():
        assert isinstance(value, float) and 0.0 <= value <= 1.0 + 1e-12, (name, value)


@FUZZ
@given(replies=st.lists(st.one_of(texts, st.none()), max_size=3), gold=gold_calls,
       responses=st.one_of(st.none(), st.lists(st.text(max_size=20), max_size=2)))
def test_hierr_reward_never_raises(replies, gold, responses):
    row = {"gold_tool_calls": gold, "allowed_tools": ALLOWED, "question": "q"}
    out = HierRReward()(row, replies, tool_responses=responses)
    assert out.score == -0.5 or 0.0 <= out.score <= 2.0 + 1e-12
    assert out.parts["should_call_but_no_call"] in (0.0, 1.0) and 0.0 <= out.parts["summary"] <= 1.0
    components = ("format", "name", "key", "value", "parallel", "process")
    assert all(0.0 <= out.parts[k] <= 1.0 + 1e-12 for k in components)
    assert len(out.turns["tool_scores"]) == max(len(replies) - 1, 0)
    assert all(0.0 <= s <= 1.0 + 1e-12 for s in out.turns["tool_scores"])


any_json = st.one_of(json_values, st.integers(), st.floats())  # unbounded integers: 10**400 is no float


@FUZZ
@given(gold=any_json, pred=any_json)
def test_loose_equal_is_a_symmetric_bool(gold, pred):
    assert isinstance(loose_equal(gold, pred), bool)
    assert loose_equal(gold, pred) == loose_equal(pred, gold)


@FUZZ
@given(text=texts)
def test_reply_parsers_never_raise(text):
    assert extract_answer(text) is None or isinstance(extract_answer(text), str)
    assert parse_rating(text) in (None, 1, 2, 3, 4, 5)
    assert isinstance(extract_code(text), str)
    value = parse_value(text)
    assert value is None or math.isfinite(value)
    decision, challenge = parse_decision(text, ("SAC", "NS"))
    assert decision in (None, "SAC", "NS") and isinstance(challenge, dict)
    assert parse_final_integer(text) is None or isinstance(parse_final_integer(text), int)
    assert isinstance(final_reply(text), str) and len(strip_think(text)) <= len(text)
    assert all(isinstance(r, str) for r in extract_tool_responses(text))


@FUZZ
@given(question=st.text(max_size=40), responses=st.lists(st.text(max_size=60), max_size=3),
       reply=st.text(max_size=80))
def test_rubric_judge_in_unit_interval(question, responses, reply):
    result = RubricJudge()(question, responses, reply)
    assert 0.0 <= result.score <= 1.0 and not result.failed


# ------------------------------------------------------------------------------------------------ credit
finite = st.one_of(st.sampled_from([0.0, 0.25, 0.5, 1.0, -0.5]), st.floats(-1e6, 1e6, width=32))
unit = st.one_of(st.sampled_from([0.0, 0.5, 1.0]), st.floats(0.0, 1.0, width=32))


@st.composite
def rollout_batches(draw) -> RolloutBatch:
    """A batch with every field some estimator reads.

    Rollout i: a prompt of 0-2 tokens, then ``n_i`` in 0..K turns, each a run of 0-3 policy tokens (0: an
    empty reply) followed by 1-2 feedback tokens; ``turn_mask`` is the prefix of reached turns. The response
    mask is the turns' tokens, then some of those dropped again and some rows zeroed (tokens that keep a turn
    id under mask 0). Group ids from 3 values (singleton groups happen). Scores finite; per-turn scores NaN
    on turns not reached (never read); alternatives NaN where not sampled. The reward's part weights are
    HierR-like or absent (SLCA's segment weights follow them when not configured).
    """
    b, k = draw(st.integers(1, 6)), draw(st.integers(1, 3))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    rows, reached = [], []
    for _ in range(b):
        n = draw(st.integers(0, k))
        ids = [-1] * draw(st.integers(0, 2))
        for turn in range(n):
            ids += [turn] * draw(st.integers(0, 3)) + [-1] * draw(st.integers(1, 2))
        rows.append(ids)
        reached.append(n)
    width = max(map(len, rows)) + 1
    turn_ids = torch.tensor([r + [-1] * (width - len(r)) for r in rows])
    keep = torch.tensor(draw(st.lists(st.booleans(), min_size=b * width, max_size=b * width))).view(b, width)
    keep &= torch.tensor(draw(st.lists(st.booleans(), min_size=b, max_size=b)))[:, None]
    keep |= torch.tensor(draw(st.booleans()))  # half the batches keep every policy token
    mask = ((turn_ids >= 0) & keep).float()
    turn_mask = torch.arange(k)[None, :] < torch.tensor(reached)[:, None]

    def vec(strategy, *shape) -> torch.Tensor:
        n = math.prod(shape)
        return torch.tensor(draw(st.lists(strategy, min_size=n, max_size=n)), dtype=dtype).view(*shape)

    turn_scores = torch.where(turn_mask, vec(unit, b, k), float("nan"))
    tool_turn_mask = torch.arange(k)[None, :] < (torch.tensor(reached) - 1).clamp_min(0)[:, None]
    sampled = vec(st.booleans(), b, k, 2).bool()
    parts = {
        "process": vec(unit, b), "summary": vec(unit, b), "score": vec(finite, b),
        "should_call_but_no_call": vec(st.sampled_from([0.0, 1.0]), b),
        "solved": vec(st.sampled_from([0.0, 1.0]), b), "toolpo_correct_ratio": vec(unit, b),
    }
    if draw(st.booleans()):
        del parts["score"]  # estimators fall back to batch.scores
    turn_parts = {"tool_scores": torch.where(tool_turn_mask, vec(unit, b, k), float("nan")),
                  "tool_turn_mask": tool_turn_mask.to(dtype)}
    extras = {"alt_scores": torch.where(sampled, vec(unit, b, k, 2), float("nan")),
              "cf_mask": vec(st.booleans(), b, k).bool()}
    part_weights = draw(st.sampled_from([{}, {"process": 0.5, "summary": 2.0}]))  # the reward's, or none
    return RolloutBatch(
        input_ids=torch.zeros(b, width, dtype=torch.long),
        attention_mask=torch.ones(b, width, dtype=torch.long),
        response_mask=mask,
        turn_ids=turn_ids,
        group_ids=torch.tensor(draw(st.lists(st.integers(0, 2), min_size=b, max_size=b))),
        behaviour_logprobs=torch.zeros(b, width),
        scores=vec(finite, b),
        reward_parts=parts,
        turn_parts=turn_parts,
        extras=extras,
        reward_weights=part_weights,
        turn_scores=turn_scores,
        turn_mask=turn_mask,
    )


weights = st.floats(0.0, 2.0)
tcpo_settings = {"preset": st.sampled_from(PRESETS), "normalize": st.sampled_from(NORMALIZE)}
CONFIGS = {
    "grpo": st.fixed_dictionaries({"norm_by_std": st.booleans()}),
    "slca": st.fixed_dictionaries({"w_process": weights | st.none(), "w_summary": weights | st.none(),
                                   "norm_by_std": st.booleans()}),
    "toolpo": st.fixed_dictionaries({"lam": weights, "norm_by_std": st.booleans()}),
    "toolpo_process": st.fixed_dictionaries({"lam": weights, "norm_by_std": st.booleans()}),
    "mt_grpo": st.fixed_dictionaries({"c": weights, "norm_by_std": st.booleans()}),
    "tcpo": st.fixed_dictionaries(tcpo_settings),
    "slca_tcpo": st.fixed_dictionaries({**tcpo_settings, "w_process": weights | st.none(),
                                        "w_summary": weights | st.none()}),
}
# estimators whose every advantage is a group normalisation over rollouts: a singleton group gets 0
ROLLOUT_NORMALISED = {"grpo", "dr_grpo", "dpa", "mt_grpo", "slca", "toolpo", "toolpo_process"}


@pytest.mark.parametrize("name", available())
@FUZZ
@given(batch=rollout_batches(), data=st.data())
def test_every_estimator_is_finite_and_zero_off_the_mask(name, batch, data):
    config = data.draw(CONFIGS.get(name, st.just({})), label="config")
    out = get(name)(**config)(batch)
    adv, mask = out.advantages, batch.response_mask
    assert adv.shape == mask.shape and adv.dtype.is_floating_point
    assert torch.isfinite(adv).all(), adv
    assert (adv[mask == 0] == 0).all(), (adv, mask)
    for part, value in out.parts.items():
        assert torch.isfinite(value).all(), part
    assert all(isinstance(v, float) and math.isfinite(v) for v in out.metrics.values()), out.metrics
    gids = batch.group_ids
    singleton = (gids[:, None] == gids[None, :]).sum(1) == 1
    if name in ROLLOUT_NORMALISED:
        assert (adv[singleton] == 0).all()
    if name == "slca_tcpo":
        assert (out.parts["summary"][singleton] == 0).all()


# ------------------------------------------------------------------------------------------------ losses
GARBAGE = [float("nan"), float("inf"), -float("inf"), 1e30]
SURROGATES = {"clip": lambda: ClippedSurrogate(0.2), "clip_higher": lambda: ClippedSurrogate(0.2, 0.28),
              "gspo": lambda: GSPOSurrogate(0.2), "reinforce": ReinforceSurrogate}


@st.composite
def loss_inputs(draw, all_zero: bool = False):
    b, t = draw(st.integers(1, 4)), draw(st.integers(1, 6))

    def mat(strategy) -> torch.Tensor:
        values = draw(st.lists(strategy, min_size=b * t, max_size=b * t))
        return torch.tensor(values, dtype=torch.float32).view(b, t)

    mask = torch.zeros(b, t) if all_zero else mat(st.sampled_from([0.0, 1.0]))
    if not all_zero and draw(st.booleans()):
        mask[draw(st.integers(0, b - 1))] = 0  # an all-zero row
    garbage = mat(st.sampled_from(GARBAGE))
    logp, old, ref = mat(st.floats(-20, 0)), mat(st.floats(-20, 0)), mat(st.floats(-20, 0))
    adv = mat(st.floats(-10, 10))
    on = mask != 0
    return (*(torch.where(on, x, garbage) for x in (logp, old, adv, ref)), mask)


def check_loss(inputs, surrogate, aggregation, kl_coef, estimator):
    logp, old, adv, ref, mask = inputs
    logp = logp.clone().requires_grad_(True)
    loss_fn = PolicyLoss(SURROGATES[surrogate](), aggregation, kl_coef, estimator)
    loss, metrics = loss_fn(logp, old, adv, mask, ref)
    loss.backward()
    assert torch.isfinite(loss), loss
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert torch.isfinite(logp.grad).all() and (logp.grad[mask == 0] == 0).all(), logp.grad
    return loss


loss_settings = {"surrogate": st.sampled_from(sorted(SURROGATES)),
                 "aggregation": st.sampled_from(AGGREGATION_MODES),
                 "kl_coef": st.sampled_from([0.0, 0.04]), "estimator": st.sampled_from(KL_ESTIMATORS)}


@FUZZ
@given(inputs=loss_inputs(), **loss_settings)
def test_policy_loss_finite_with_garbage_under_the_mask(inputs, surrogate, aggregation, kl_coef, estimator):
    check_loss(inputs, surrogate, aggregation, kl_coef, estimator)


@FUZZ
@given(inputs=loss_inputs(all_zero=True), **loss_settings)
def test_policy_loss_all_zero_mask_is_exactly_zero(inputs, surrogate, aggregation, kl_coef, estimator):
    loss = check_loss(inputs, surrogate, aggregation, kl_coef, estimator)
    assert loss.item() == 0.0
