"""HierR tool process score and reward (docs/methods.md §1, "Two rewards (HierR)"); every number
hand-computed.

The one home of HierR's hand cases: the rules on well-formed calls, gold and replies. Malformed model output
and bad gold data (blocks that fail, unbalanced tags, huge or odd text, gold that cannot be read) are cases
of the bad-input corpus (tests/data/bad_inputs/tool_calls.jsonl); the never-raises properties are in
tests/test_fuzz.py.
"""

import json

import numpy as np
import pytest

from lit_credit.interfaces import Reward
from lit_credit.rewards.hierr import (
    COMPONENTS,
    DEFAULT_WEIGHTS,
    HierRReward,
    extract_tool_responses,
    final_reply,
    key_value_scores,
    loose_equal,
    name_f1,
    normalize_gold_calls,
    parse_tool_calls,
    step_plan,
    strict_correct_ratio,
    strip_think,
    tool_process_score,
    tool_turn_scores,
)
from lit_credit.rewards.judges import SummaryJudge

ALLOWED = ["f", "g", "get_weather"]


def tc(body) -> str:
    """One Hermes block; dicts/lists are JSON-encoded, strings go in verbatim."""
    return f"<tool_call>{body if isinstance(body, str) else json.dumps(body)}</tool_call>"


def call(name, **args):
    return {"name": name, "arguments": args}


F = tc(call("f", x=1))  # a valid single-call block


# ------------------------------------------------------------------------------------------------ parsing
def test_parameters_normalised_to_arguments_and_allowed_none():
    p = parse_tool_calls(tc({"name": "f", "parameters": {"x": 1}}), ALLOWED)
    assert p.calls == [call("f", x=1)]
    # empty or null arguments fall back to parameters (official `arguments or parameters or {}`)
    for empty in ({}, None):
        p = parse_tool_calls(tc({"name": "f", "arguments": empty, "parameters": {"x": 1}}), ALLOWED)
        assert p.calls == [call("f", x=1)]
    assert parse_tool_calls(tc({"name": "f", "arguments": {"y": 2}, "parameters": {"x": 1}}), ALLOWED).calls == [
        call("f", y=2)]  # non-empty arguments win
    # allowed_tools=None: any name; a JSON-string list is parsed
    assert parse_tool_calls(tc(call("zzz")), None).n_valid == 1
    assert parse_tool_calls(tc(call("zzz")), '["zzz"]').n_valid == 1
    assert parse_tool_calls(tc(call("zzz")), '["f"]').n_valid == 0


def test_think_is_stripped_before_parsing():
    text = f"<think>maybe {tc(call('g'))}</think>{F}"
    p = parse_tool_calls(text, ALLOWED)
    assert (p.n_open, p.n_close, [c["name"] for c in p.calls]) == (1, 1, ["f"])


def test_a_list_block_with_a_bad_item_is_invalid_but_its_good_items_are_executed():
    # the reward scores the block invalid (official reward); the environment runs its good items (official
    # environment): ParsedCalls.executed
    p = parse_tool_calls(tc([call("f", x=1), call("zzz"), 7]), ALLOWED)
    assert (p.n_valid, p.calls, p.executed) == (0, [], [call("f", x=1)])
    assert [r for _, r in p.blocks[0].items] == ["", "unknown_tool", "type"]


@pytest.mark.parametrize(("text", "expected"), [
    ("<think>a</think>b", "b"),
    ("<think>a</think>b<think>c</think>d", "bd"),
    ("<thinking>a</thinking>b", "b"),         # official: <thinking> too
    ("<think>a</thinking>b<thinking>c</think>d", "bd"),  # official: either close tag closes either open
    ("a</think>b", "a</think>b"),             # official: only complete pairs are removed
    ("a<think>b", "a<think>b"),
    ("<think><think>a</think>b</think>c", "b</think>c"),  # shortest from the first open tag
    ("plain", "plain"),
])
def test_strip_think(text, expected):
    assert strip_think(text) == expected


# ------------------------------------------------------------------------------------------------ format
BAD_JSON = tc('{"name": "f", ')
UNKNOWN = tc(call("zzz"))
BAD_ARGS = tc('{"name": "f", "arguments": 3}')


@pytest.mark.parametrize(("text", "expected"), [
    ("no tags at all", 0.0),                            # no tags -> 0
    (F, 1.0),                                           # 1 valid / max(1, 1)
    (F + F, 1.0),                                       # 2 / max(2, 2)
    (F + "<tool_call>", 0.5),                           # unbalanced: 1 valid / max(2 open, 1 close)
    (BAD_JSON, 0.0),                                    # 0 / 1
    (F + UNKNOWN, 0.5),                                 # 1 / 2
    (F + BAD_JSON + BAD_ARGS, 1 / 3),                   # 1 / 3
    (f"<think>{F}</think>", 0.0),                       # tags inside <think> do not count
])
def test_format(text, expected):
    assert tool_process_score(text, [[call("f", x=1)]], ALLOWED)["format"] == pytest.approx(expected)


# ------------------------------------------------------------------------------------------------ name
@pytest.mark.parametrize(("pred", "gold", "expected"), [
    (["a", "a", "b"], ["a", "b", "c"], 2 / 3),   # tp = min(2,1) + 1 = 2; P = 2/3, R = 2/3, F1 = 2/3
    (["a", "b"], ["a"], 2 / 3),                  # tp 1; P 1/2, R 1; F1 = 2*(1/2)/(3/2) = 2/3
    (["a", "a"], ["a", "a", "a"], 0.8),          # tp 2; P 1, R 2/3; F1 = (4/3)/(5/3) = 0.8
    (["a"], ["b"], 0.0),                         # tp 0
    ([], [], 1.0),                               # both empty
    (["a"], [], 0.0),                            # one empty
    ([], ["a"], 0.0),
])
def test_name_f1(pred, gold, expected):
    assert name_f1(pred, gold) == pytest.approx(expected)


def test_name_through_tool_process_score():
    text = tc([call("f"), call("f"), call("g")])                  # pred [f, f, g]
    gold = [[call("f")], [call("g")], [call("get_weather")]]      # gold [f, g, get_weather]
    assert tool_process_score(text, gold, ALLOWED)["name"] == pytest.approx(2 / 3)
    # an invalid block contributes no prediction: pred [f] vs gold [f, g] -> tp 1, F1 = 2/3
    s = tool_process_score(F + UNKNOWN, [[call("f")], [call("g")]], ALLOWED)
    assert s["name"] == pytest.approx(2 / 3)


# ------------------------------------------------------------------------------------------------ key / value
# The official order: None; string forms str(x).strip().lower(); float(); the boolean strings
# {"true", "false", "1", "0"}; sorted-key JSON of two lists/dicts; else not equal.
@pytest.mark.parametrize(("gold", "pred", "expected"), [
    (True, "true", True), (True, " TRUE ", True), (True, "1", True), (False, "0", True), (True, 1, True),
    (False, "False", True), (True, "yes", False), (True, False, False), (2, True, False),
    (3, 3.0, True), (3, "3", True), (0.1 + 0.2, 0.3, True), (1.0, 1.0 + 1e-10, True),
    (1.0, 1.0 + 1e-8, False),
    (3, "three", False), (10**400, 1.0, False),
    ("Seoul", " seoul ", True), ("a", "b", False),
    # gold "True" vs 1: string forms "true" != "1", float("True") fails, both boolean strings -> True == True
    ("True", 1, True),
    ("1", "true", True),                      # two strings, both boolean strings: True == True
    ("yes", True, False),                     # "yes" is no boolean string
    (1, 1.0, True),                           # "1" != "1.0", but float 1.0 == 1.0
    ("1_000", 1000, True),                    # float("1_000") = 1000.0, as Python reads it
    ("NaN", "nan", True),                     # equal string forms, though float nan != nan
    ([1, 2], [1, 2], True), ([1, 2], [2, 1], False), ({"b": 1, "a": 2}, {"a": 2, "b": 1}, True),
    ([1, 2], "[1, 2]", True),                 # str([1, 2]) == "[1, 2]"
    ([1, 2], "[1,2]", False),                 # "[1, 2]" != "[1,2]" and a string is not JSON-parsed
    ({"a": 1}, "{'a': 1}", True),             # str({"a": 1}) == "{'a': 1}"
    ({"a": 1}, "not json", False),
    (None, None, True), (None, "", False), ("None", None, False),  # None only equals None
])
def test_loose_equal(gold, pred, expected):
    assert loose_equal(gold, pred) is expected
    assert loose_equal(pred, gold) is expected  # the official rule is symmetric


@pytest.mark.parametrize(("gold", "pred", "key", "value"), [
    # key = |{x}| / |{x, y, z}| = 1/3; value = 1 matching shared key / 2 gold keys = 1/2
    ([call("f", x=1, y=2)], [call("f", x=1, z=3)], 1 / 3, 1 / 2),
    ([call("f", q="Seoul")], [call("f", q=" seoul ")], 1.0, 1.0),
    # two same-name calls in swapped order: g0 takes p1 (2 > 0.5 + 0), g1 takes p0 -> all 1
    ([call("f", q="a", n=1), call("f", q="b", n=2)],
     [call("f", q="b", n=2), call("f", q="a", n=1)], 1.0, 1.0),
    # greedy, not optimal: g0={x:1} prefers p0={x:1,y:2} (key 1/2 + value 1 = 1.5 > p1={x:9}: 1 + 0),
    # then g1={x:1,y:2} gets p1 (key 1/2, value 0): key (1/2 + 1/2)/2 = 1/2, value (1 + 0)/2 = 1/2
    # (the optimal assignment would give key 1)
    ([call("f", x=1), call("f", x=1, y=2)], [call("f", x=1, y=2), call("f", x=9)], 0.5, 0.5),
    # a gold call with no same-name prediction scores (0, 0): key (1 + 0)/2, value (1 + 0)/2
    ([call("f", x=1), call("g", y=2)], [call("f", x=1)], 0.5, 0.5),
    # one-to-one: the second gold f finds the only prediction used -> (1 + 0)/2
    ([call("f", x=1), call("f", x=1)], [call("f", x=1)], 0.5, 0.5),
    # gold calls with empty arguments are not scored: only {x:1} counts
    ([call("g"), call("f", x=1)], [call("f", x=1)], 1.0, 1.0),
    ([call("g")], [], 1.0, 1.0),                   # no gold call with arguments -> both 1
    ([], [call("f", x=1)], 1.0, 1.0),
    ([call("f", x=1)], [], 0.0, 0.0),              # no predictions -> both 0
    ([call("f", x=1)], [call("g", x=1)], 0.0, 0.0),  # predictions, but none of the name
    # official: a pair is only made when key + value > 0. g0 = f(a=1) vs p0 = f(b=2): Jaccard {a} vs {b} = 0,
    # no shared key -> value 0; 0 + 0 is not > 0, so p0 stays free; g1 = f(b=2) takes it (1, 1).
    # key = (0 + 1)/2 = 0.5, value = (0 + 1)/2 = 0.5 (consuming p0 for g0 would give 0, 0)
    ([call("f", a=1), call("f", b=2)], [call("f", b=2)], 0.5, 0.5),
    # a tie goes to the first prediction (strict >): g0 = f(x=1) scores 1 + 0 with p0 = f(x=3) and with
    # p1 = f(x=2) and takes p0; g1 = f(x=2) takes p1 (1 + 1). key (1 + 1)/2 = 1, value (0 + 1)/2 = 0.5
    # (had the tie gone to p1, g1 would get p0: value (0 + 0)/2 = 0)
    ([call("f", x=1), call("f", x=2)], [call("f", x=3), call("f", x=2)], 1.0, 0.5),
    # gold "True" vs predicted 1: the boolean strings "true" and "1" agree -> key 1, value 1
    ([call("f", flag="True")], [call("f", flag=1)], 1.0, 1.0),
])
def test_key_value(gold, pred, key, value):
    assert key_value_scores(pred, gold) == pytest.approx((key, value))


# ------------------------------------------------------------------------------------------------ parallel
@pytest.mark.parametrize(("text", "gold", "expected"), [
    (tc([call("f"), call("g")]), [[call("f"), call("g")]], 1.0),        # 2 calls vs gold step 0 with 2
    (tc(call("f")) + tc(call("g")), [[call("f"), call("g")]], 0.0),     # first block has 1, gold 2
    (tc([call("f"), call("g")]), [[call("f")], [call("g")]], 0.0),      # 2 vs 1
    (BAD_JSON + tc([call("f"), call("g")]), [[call("f"), call("g")]], 1.0),  # the first *valid* block
    ("no call", [[call("f")]], 0.0),                                     # no valid block: 0 vs 1
    ("no call", [], 1.0),                                                # gold has no steps: 0 == 0
    (F, [], 0.0),                                                        # 1 vs 0
])
def test_parallel(text, gold, expected):
    assert tool_process_score(text, gold, ALLOWED)["parallel"] == expected


# ------------------------------------------------------------------------------------------------ process
def test_weighted_process_sum():
    # blocks: f{x:1,z:3} (valid) + bad JSON -> format 1/2. gold [[f{x:1,y:2}, g{}]]:
    # name: pred [f] vs [f, g] -> 2/3; key/value over f only: 1/3, 1/2; parallel: 1 call vs 2 -> 0.
    text = tc(call("f", x=1, z=3)) + BAD_JSON
    gold = [[call("f", x=1, y=2), call("g")]]
    s = tool_process_score(text, gold, ALLOWED)
    expected = {"format": 0.5, "name": 2 / 3, "key": 1 / 3, "value": 0.5, "parallel": 0.0}
    assert {k: s[k] for k in COMPONENTS} == pytest.approx(expected)
    # 0.10*0.5 + 0.25*2/3 + 0.15*1/3 + 0.20*0.5 + 0.30*0 = 0.05 + 0.1667 + 0.05 + 0.10 = 0.36667
    assert s["process"] == pytest.approx(0.05 + 0.25 * 2 / 3 + 0.05 + 0.10)
    # override: format 0, parallel 1 (others default) -> 0 + 0.1667 + 0.05 + 0.10 + 0 = 0.31667
    s2 = tool_process_score(text, gold, ALLOWED, weights={"format": 0.0, "parallel": 1.0})
    assert s2["process"] == pytest.approx(0.25 * 2 / 3 + 0.05 + 0.10)
    with pytest.raises(ValueError, match="unknown HierR weight"):
        tool_process_score(text, gold, ALLOWED, weights={"fromat": 1.0})
    assert sum(DEFAULT_WEIGHTS.values()) == pytest.approx(1.0)


def test_perfect_and_empty_cases():
    gold = [[call("get_weather", city="Seoul", date="2026-11-30")]]
    perfect = tc(call("get_weather", city="seoul", date="2026-11-30"))
    assert tool_process_score(perfect, gold, ALLOWED)["process"] == pytest.approx(1.0)
    # irrelevant subset, no call: format 0 (no tags), name 1 (both empty), key = value = 1 (no gold
    # arguments), parallel 1 (0 == 0) -> 0.25 + 0.15 + 0.20 + 0.30 = 0.90
    s = tool_process_score("I can answer without tools.", [], ALLOWED)
    assert s == pytest.approx({"format": 0, "name": 1, "key": 1, "value": 1, "parallel": 1, "process": 0.9})
    # irrelevant subset with a call: format 1, name 0, key = value = 1, parallel 0 -> 0.10 + 0.15 + 0.20
    s = tool_process_score(F, [], ALLOWED)
    assert s == pytest.approx({"format": 1, "name": 0, "key": 1, "value": 1, "parallel": 0, "process": 0.45})
    # gold with calls, no call made: everything 0
    assert tool_process_score("", gold, ALLOWED)["process"] == 0.0


@pytest.mark.parametrize(("text", "attempted", "official"), [
    # gold [] (a no-call prompt). Components: format 0.10, name 0.25, key 0.15, value 0.20, parallel 0.30;
    # key = value = 1 throughout (no gold arguments).
    # the right direct answer: no tag, format 0; name 1 (both empty), parallel 1 (0 == 0): 0.25 + 0.35 + 0.30
    ("I can answer without tools.", 0.90, 0.90),
    # a clean needless call: format 1/1, name 0 (pred [f] vs gold []), parallel 0 (1 call vs 0): 0.10 + 0.35
    (F, 0.45, 0.45),
    # a broken needless call, an unknown tool: format 0/1. attempted: the tag is a call, name 0, parallel 0 ->
    # 0.35; valid (official): no prediction, name 1, parallel 1 (0 == 0) -> 0.90, as much as the direct answer
    (tc(call("zzz")), 0.35, 0.90),
    # a list mixing a good and a bad item: the whole block is invalid -> as the unknown tool
    (tc([call("f", x=1), call("zzz")]), 0.35, 0.90),
    # bad JSON, a stray close tag: format 0 of 1 tag -> the same
    ("<tool_call>{x</tool_call>", 0.35, 0.90),
    ("</tool_call> I can answer without tools.", 0.35, 0.90),
    # a clean call and an unknown one, two blocks: format 1/2, name 0, parallel 0 (the first valid block holds
    # 1 call) -> 0.05 + 0.35 = 0.40 under both rules: between the broken (0.35) and the clean (0.45) call
    (F + tc(call("zzz")), 0.40, 0.40),
])
def test_a_broken_needless_call_never_scores_above_a_clean_one(text, attempted, official):
    assert tool_process_score(text, [], ALLOWED)["process"] == pytest.approx(attempted)
    assert tool_process_score(text, [], ALLOWED, needless_calls="valid")["process"] == pytest.approx(official)
    assert attempted <= 0.45 or ("<tool_call>" not in text and "</tool_call>" not in text)
    # the reward on a no-call row allowing the same tools: summary 0 (no_call_summary="zero"), so score = process
    row = {**ROW, "gold_tool_calls": [], "allowed_tools": ALLOWED}
    assert HierRReward(judge=FixedJudge())(row, [text]).score == pytest.approx(attempted)
    assert HierRReward(judge=FixedJudge(), needless_calls="valid")(row, [text]).score == pytest.approx(official)


def test_needless_calls_applies_to_tool_turns_beyond_the_gold_steps_only():
    # gold one step [f(x=1)]; turn 0 right (1.0); turn 1 is beyond the gold steps, scored against the empty plan:
    # an unknown tool there scores 0.35 (attempted), 0.90 under the official rule (as if the rollout had stopped)
    gold = [[call("f", x=1)]]
    turns = tool_turn_scores([F, tc(call("zzz"))], gold, ALLOWED)
    assert [d["process"] for d in turns] == pytest.approx([1.0, 0.35])
    assert [d["process"] for d in tool_turn_scores([F, tc(call("zzz"))], gold, ALLOWED,
                                                   needless_calls="valid")] == pytest.approx([1.0, 0.90])
    # on a prompt with gold calls nothing changes: an unknown tool is format 0/1, name 0, key = value = 0 (no
    # prediction), parallel 0 (0 calls vs 1) -> 0 under both rules
    for rule in ("attempted", "valid"):
        assert tool_process_score(tc(call("zzz")), gold, ALLOWED, needless_calls=rule)["process"] == 0.0
    assert HierRReward(judge=FixedJudge()).turn_score(ROW, 1, tc(call("zzz"))) == pytest.approx(0.35)
    with pytest.raises(ValueError, match=r"reward\.needless_calls='all'"):
        HierRReward(needless_calls="all")


def test_strict_correct_ratio_by_hand():
    # ToolPO's C(g): the first unused prediction with g's name and every key of g loosely equal (extra keys of
    # the prediction allowed); ratio = #matched gold calls / #gold calls.
    gold = [call("f", a=1), call("f", a=2)]
    # f(a=1) skips f(a=2, b=0) (a differs) and takes f(a=1); f(a=2) takes f(a=2, b=0) (b is extra): 2/2
    assert strict_correct_ratio([call("f", a=2, b=0), call("f", a=1)], gold) == 1.0
    assert strict_correct_ratio([call("f", a=1)], gold) == 0.5           # f(a=2) finds nothing
    assert strict_correct_ratio([call("f", a="1.0")], gold) == 0.5       # loose: "1.0" == 1
    assert strict_correct_ratio([call("f")], gold) == 0.0                # key a missing
    assert strict_correct_ratio([call("g", a=1), call("g", a=2)], gold) == 0.0  # wrong name
    # first match, not best: gold [f(), f(a=1)], prediction [f(a=1)]: f() (no arguments: the name suffices)
    # takes it, f(a=1) finds nothing left -> 1/2 (in the other gold order 2/2 would be impossible too: 1/2)
    assert strict_correct_ratio([call("f", a=1)], [call("f"), call("f", a=1)]) == 0.5
    assert strict_correct_ratio([call("f", a=1)], [call("f", a=1), call("f")]) == 0.5
    assert strict_correct_ratio([], gold) == 0.0 and strict_correct_ratio([call("f")], []) == 1.0


def test_toolpo_parts_of_the_reward():
    judge = FixedJudge()  # rates 4: summary 0.75
    # the right call and a judged summary: correct ratio 1/1, solved 1[0.75 >= 0.75] = 1
    out = HierRReward(judge=judge)(ROW, [CALL, SUMMARY], tool_responses=['{"rain": true}'])
    assert (out.parts["toolpo_correct_ratio"], out.parts["solved"]) == (1.0, 1.0)
    assert HierRReward(judge=judge, solved_at=0.8)(ROW, [CALL, SUMMARY], tool_responses=["r"]).parts["solved"] == 0.0
    # a wrong value (Busan): ratio 0/1, summary still 0.75: solved 1 (the outcome is the judge's, not the call's)
    out = HierRReward(judge=judge)(ROW, [tc(call("get_weather", city="Busan")), SUMMARY], tool_responses=["r"])
    assert (out.parts["toolpo_correct_ratio"], out.parts["solved"]) == (0.0, 1.0)
    # omission (no tag, gold has a call): officially R_succ = 0 and the ratio 0 (score -0.5 is HierR's)
    out = HierRReward(judge=judge)(ROW, [SUMMARY])
    assert (out.parts["toolpo_correct_ratio"], out.parts["solved"], out.score) == (0.0, 0.0, -0.5)
    # a no-call prompt: nothing to verify, ratio 1; summary 0 there (no_call_summary="zero"): solved 0
    out = HierRReward(judge=judge)({**ROW, "gold_tool_calls": []}, [SUMMARY])
    assert (out.parts["toolpo_correct_ratio"], out.parts["solved"]) == (1.0, 0.0)


def test_process_with_a_same_name_prediction_that_matches_nothing():
    # gold one parallel step [f(a=1), f(b=2)], prediction one block [f(b=2)]: format 1/1; name: pred [f]
    # vs gold [f, f], tp 1 -> 2*1/(1+2) = 2/3; key = value = 0.5 (test_key_value); parallel 1 call vs 2 -> 0.
    # process = 0.10*1 + 0.25*2/3 + 0.15*0.5 + 0.20*0.5 + 0.30*0 = 0.1 + 0.16667 + 0.075 + 0.1 = 0.44167
    s = tool_process_score(tc(call("f", b=2)), [[call("f", a=1), call("f", b=2)]], ALLOWED)
    assert (s["key"], s["value"]) == pytest.approx((0.5, 0.5))
    assert s["process"] == pytest.approx(0.1 + 0.25 * 2 / 3 + 0.075 + 0.1)


def test_empty_gold_steps_are_dropped():
    # official: [[], [f]] reads as one step [f]; parallel then compares against f's step (1 == 1)
    assert normalize_gold_calls([[], [call("f", x=1)]]) == [[call("f", x=1)]]
    assert tool_process_score(F, [[], [call("f", x=1)]], ALLOWED)["process"] == pytest.approx(1.0)


def test_gold_arguments_as_json_string_and_flat_gold():
    text = tc(call("get_weather", city="Seoul"))
    nested = [[{"name": "get_weather", "arguments": '{"city": "Seoul"}'}]]
    assert tool_process_score(text, nested, ALLOWED)["process"] == pytest.approx(1.0)
    # flat name list: one single-call step, no arguments -> key = value = 1, parallel 1 vs 1
    assert tool_process_score(text, ["get_weather"], ALLOWED)["process"] == pytest.approx(1.0)


# ------------------------------------------------------------------------------------------------ gold
def test_normalize_gold_calls():
    a, b = call("a"), call("b", x=1)
    assert normalize_gold_calls([]) == [] and normalize_gold_calls(None) == []
    # flat (first element not a list): ONE parallel step, as the official reward reads it
    assert normalize_gold_calls(["a", "b"]) == [[a, call("b")]]                   # flat names
    assert normalize_gold_calls([{"name": "a"}, {"name": "b", "arguments": '{"x": 1}'}]) == [[a, b]]  # flat
    assert normalize_gold_calls([[a, b], [a]]) == [[a, b], [a]]                     # nested: idempotent
    assert normalize_gold_calls([[{"name": "b", "parameters": {"x": 1}}]]) == [[b]]
    openai = {"type": "function", "function": {"name": "b", "arguments": '{"x": 1}'}}
    assert normalize_gold_calls([[openai]]) == [[b]]
    assert normalize_gold_calls(json.dumps([[b]])) == [[b]]                         # whole gold as JSON
    assert normalize_gold_calls([[{"name": "a", "arguments": ""}]]) == [[a]]
    arr = np.empty(1, dtype=object)                                                 # pandas/parquet arrays
    arr[0] = np.array([{"name": "b", "arguments": '{"x": 1}'}], dtype=object)
    assert normalize_gold_calls(arr) == [[b]]


# ------------------------------------------------------------------------------------------------ reward
class FixedJudge(SummaryJudge):
    """Rates 4 (score 0.75) and records what it was shown."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def rate(self, question, tool_responses, reply):
        self.seen.append((question, tool_responses, reply))
        return 4


ROW = {"question": "Will it rain in Seoul tomorrow?", "allowed_tools": ["get_weather"],
       "gold_tool_calls": [[{"name": "get_weather", "arguments": '{"city": "Seoul"}'}]]}
CALL = tc(call("get_weather", city="Seoul"))
SUMMARY = "Yes, rain is expected in Seoul tomorrow."


@pytest.mark.parametrize(("text", "expected"), [
    ("a</tool_call>b</tool_response> final ", "final"),
    ("x</tool_response>y</tool_response>z", "z"),
    (f"{CALL} done", "done"),
    ("  plain  ", "plain"),
    ("<think>r</think>ans", "ans"),
    (CALL, ""),
])
def test_final_reply(text, expected):
    assert final_reply(text) == expected


def test_reward_total_and_judge_inputs():
    judge = FixedJudge()
    reward = HierRReward(w_process=0.5, w_summary=2.0, judge=judge)
    assert isinstance(reward, Reward)
    out = reward(ROW, [CALL, SUMMARY], tool_responses=['{"rain": true}'])
    # process 1 (perfect call), summary (4-1)/4 = 0.75: score = 0.5*1 + 2*0.75 = 2.0
    assert out.score == pytest.approx(2.0)
    parts = ("process", "summary", "should_call_but_no_call", "judge_failed")
    assert [out.parts[k] for k in parts] == [1, 0.75, 0, 0]
    assert [out.parts[k] for k in ("no_tool_response", "tool_tag", "valid_call", "gold_steps")] == [0, 1, 1, 1]
    assert judge.seen[-1] == (ROW["question"], ['{"rain": true}'], SUMMARY)
    # the score is w_process * process + w_summary * summary: the reward says so (batch.reward_weights)
    assert reward.part_weights == {"process": 0.5, "summary": 2.0}
    assert HierRReward().part_weights == {"process": 1.0, "summary": 1.0}


def test_result_separates_parts_from_per_turn_lists():
    # A RewardResult: the float parts of the episode ([B] in the batch), apart from the per-turn lists (one
    # entry per tool turn: every reply but the last; [B, K] turn_parts) and from the extras (none here).
    out = HierRReward(judge=FixedJudge())(ROW, [CALL, SUMMARY], tool_responses=['{"rain": true}'])
    assert set(out.parts) == {*COMPONENTS, "process", "summary", "should_call_but_no_call", "judge_failed",
                              "toolpo_correct_ratio", "solved", "no_tool_response", "tool_tag", "valid_call",
                              "gold_steps"}
    assert all(type(v) is float for v in out.parts.values())
    # one tool turn (CALL, perfect against gold step 0): process 1, exact
    assert out.turns == {"tool_scores": [1.0], "tool_turn_mask": [1.0], "tool_exact": [1.0]}
    assert out.extras == {} and type(out.score) is float


def test_reward_tool_response_sources():
    judge = FixedJudge()
    reward = HierRReward(judge=judge)
    text = CALL + "<tool_response>from text</tool_response>" + SUMMARY
    reward(ROW, [text], tool_responses=["from kw"])                    # the keyword wins over the transcript
    reward(ROW, [text])                                                # else the transcript
    assert [s[1] for s in judge.seen] == [["from kw"], ["from text"]]
    assert judge.seen[-1][2] == SUMMARY
    out = reward(ROW, [CALL, SUMMARY])                                 # none: summary 0 without the backend
    assert (out.parts["summary"], out.score, len(judge.seen)) == (0.0, 1.0, 2)


def test_reward_reads_the_parquet_row():
    row = {"prompt": [{"role": "user", "content": "Q?"}],
           "reward_model": {"ground_truth": {"allowed_tools": ["get_weather"],
                                             "question_content": "Will it rain?",
                                             "gold_tool_calls": ROW["gold_tool_calls"]}}}
    judge = FixedJudge()
    out = HierRReward(judge=judge)(row, [CALL, SUMMARY], tool_responses=["r"])
    assert out.parts["process"] == 1.0 and judge.seen[-1][0] == "Will it rain?"
    del row["reward_model"]["ground_truth"]["question_content"]
    HierRReward(judge=judge)(row, [CALL, SUMMARY], tool_responses=["r"])
    assert judge.seen[-1][0] == "Q?"                                  # last user message


def test_omission_penalty():
    judge = FixedJudge()
    reward = HierRReward(judge=judge)
    out = reward(ROW, ["It will probably rain."], tool_responses=["r"])
    assert (out.score, out.parts["should_call_but_no_call"], out.parts["summary"]) == (-0.5, 1.0, 0.0)
    assert judge.seen == []                                           # the judge is not asked
    # (a call only inside <think> is no call: the corpus's hierr-unbalanced-call-inside-think)
    # a dangling "</think>" is kept (official: only complete pairs are removed): the call counts, and the
    # judge sees the last turn as it is
    out = reward(ROW, ["plan</think>" + CALL, "read</think>" + SUMMARY], tool_responses=["r"])
    assert (out.parts["should_call_but_no_call"], out.parts["process"]) == (0.0, 1.0)
    assert judge.seen[-1][2] == "read</think>" + SUMMARY
    # an opening tag is a tag: no omission. The block never closes, so nothing is valid: format 0/1, name 0,
    # key = value = 0 (no prediction), parallel 0 (0 calls vs 1) -> process 0; no valid call, so the "r"
    # passed in answered debris and is no real response: summary 0 without the judge -> score 0
    n_seen = len(judge.seen)
    out = reward(ROW, ["<tool_call>{oops", SUMMARY], tool_responses=["r"])
    assert (out.parts["should_call_but_no_call"], out.score, out.parts["no_tool_response"]) == (0.0, 0.0, 1.0)
    # the official rule looks for the opening tag only: a lone </tool_call> is an omission (-0.5), and every
    # component is reported as 0 (name would be 0 anyway; here format 0/1 too)
    out = reward(ROW, ["</tool_call>", SUMMARY], tool_responses=["r"])
    assert (out.parts["should_call_but_no_call"], out.score, out.parts["process"]) == (1.0, -0.5, 0.0)
    assert len(judge.seen) == n_seen                                  # neither case asked the judge
    # flat gold of names (no arguments) and no opening tag: key = value = 1 would give process 0.35, but the
    # omission reports 0 for every component, as the official reward
    out = reward({**ROW, "gold_tool_calls": ["get_weather"]}, ["It rains."])
    assert out.score == -0.5 and all(out.parts[k] == 0 for k in (*COMPONENTS, "process", "summary"))
    # irrelevant subset: gold [] and no call is no omission: process 0.9 + summary 0 (no real response)
    out = reward({**ROW, "gold_tool_calls": []}, [SUMMARY], tool_responses=["r"])
    assert (out.parts["should_call_but_no_call"], out.score) == (0.0, pytest.approx(0.9))
    assert HierRReward(omission_score=-1.0)(ROW, ["no"]).score == -1.0


def test_only_real_tool_responses_reach_the_judge():
    judge = FixedJudge()
    reward = HierRReward(judge=judge)
    # a valid call: the responses passed in are the environment's real ones -> judged, 1 + 0.75
    out = reward(ROW, [CALL, SUMMARY], tool_responses=['{"rain": true}'])
    assert (out.score, out.parts["no_tool_response"], len(judge.seen)) == (1.75, 0.0, 1)
    # no valid block (unknown tool, bad JSON): whatever responses a caller passes answered debris -> the
    # judge is not asked, summary 0; process: format 0/1, name 0, key = value = 0, parallel 0 -> 0
    for debris in ('<tool_call>{"name": "zzz", "arguments": {}}</tool_call>', "<tool_call>{x</tool_call>"):
        out = reward(ROW, [debris, SUMMARY], tool_responses=['{"error": "unknown tool: zzz"}'])
        assert (out.score, out.parts["summary"], out.parts["no_tool_response"], out.parts["valid_call"]) == (0, 0, 1, 0)
        out = reward(ROW, [debris + "<tool_response>{\"error\": \"x\"}</tool_response>" + SUMMARY])
        assert out.parts["summary"] == 0                                    # nor from a transcript
    assert len(judge.seen) == 1


def test_no_call_prompts_pay_no_summary_unless_official():
    row = {**ROW, "gold_tool_calls": []}
    # a valid call on a no-call prompt: format 1, name 0 (pred [get_weather] vs gold []), key = value = 1
    # (no gold arguments), parallel 0 (1 call vs 0) -> process 0.45
    judge = FixedJudge()
    out = HierRReward(judge=judge)(row, [CALL, SUMMARY], tool_responses=["r"])
    assert (out.score, out.parts["summary"], judge.seen) == (pytest.approx(0.45), 0.0, [])  # default "zero"
    # the official reward judges it: 0.45 + 0.75 = 1.2 > 0.9, the direct answer's score
    out = HierRReward(judge=judge, no_call_summary="judge")(row, [CALL, SUMMARY], tool_responses=["r"])
    assert (out.score, out.parts["summary"], len(judge.seen)) == (pytest.approx(1.2), 0.75, 1)
    assert HierRReward(no_call_summary="judge")(row, [SUMMARY]).score == pytest.approx(0.9)
    with pytest.raises(ValueError, match=r"reward\.no_call_summary='always'"):
        HierRReward(no_call_summary="always")


def test_extract_tool_responses():
    text = "<tool_response> a </tool_response>x<tool_response>b</tool_response>"
    assert extract_tool_responses(text) == ["a", "b"]


# ------------------------------------------------------------------------------------------------ per turn
PLAN = [[call("f", x=1)], [call("g", y=2)]]  # two sequential gold steps


@pytest.mark.parametrize(("turn", "text", "process", "exact"), [
    # against step 0 [f(x=1)]: all five components 1
    (0, tc(call("f", x=1)), 1.0, 1.0),
    # against step 1 [g(y=2)]: right name and key, wrong value: .10 + .25 + .15 + 0 + .30 = 0.80
    (1, tc(call("g", y=3)), 0.80, 0.0),
    # against step 1, no call at all: no tag (format 0), empty predictions (name 0, key = value = 0),
    # 0 calls vs 1 (parallel 0) = 0
    (1, "I am done.", 0.0, 0.0),
    # beyond the plan (the empty plan): format .10, name 0 (a call where none is due), key = value = 1
    # (no gold arguments), parallel 0 (1 call vs 0) = .10 + .15 + .20 = 0.45; never exact
    (2, tc(call("f", x=1)), 0.45, 0.0),
])
def test_tool_turn_scores_against_their_own_gold_step(turn, text, process, exact):
    turns = ["filler"] * turn + [text]
    scored = tool_turn_scores(turns, PLAN, ["f", "g"])[turn]
    assert scored["process"] == pytest.approx(process) and scored["exact"] == exact
    assert step_plan(PLAN, 2) == [] and step_plan(PLAN, 1) == [PLAN[1]]


def test_reward_returns_per_turn_tool_scores_and_scores_alternatives_alike():
    row = {"question": "q", "allowed_tools": ["f", "g"], "gold_tool_calls": PLAN}
    reward = HierRReward(judge=FixedJudge())
    replies = [tc(call("f", x=1)), tc(call("g", y=3)), SUMMARY]
    out = reward(row, replies, tool_responses=["r1", "r2"])
    # The last reply is the summary (SLCA's rule); the two before are tool turns 0 and 1 (table above).
    assert out.turns["tool_scores"] == pytest.approx([1.0, 0.80]) and out.turns["tool_turn_mask"] == [1.0, 1.0]
    assert out.turns["tool_exact"] == [1.0, 0.0] and out.parts["gold_steps"] == 2.0
    # The whole-rollout process score is unchanged: value (1 + 0) / 2 = 0.5 -> .1 + .25 + .15 + .1 + .3 = 0.9
    assert out.parts["process"] == pytest.approx(0.9)
    assert reward.turn_score(row, 1, tc(call("g", y=2))) == pytest.approx(1.0)
    assert reward.turn_score(row, 1, "<think>x</think>" + tc(call("g", y=3))) == pytest.approx(0.80)
    single = reward(row, [SUMMARY])  # one reply: a summary, no tool turn
    assert single.turns["tool_scores"] == [] and single.turns["tool_turn_mask"] == [] and single.turns["tool_exact"] == []


# ------------------------------------------------------------------------------------------------ official parity
def test_flat_gold_is_one_parallel_step():
    # official: a flat gold list is one step. Gold [f(x=1), g(y=2)] flat; the reply makes both calls in one
    # parallel block: format 1, name 1, key = value = 1, parallel 1 (2 calls in the first block == 2 in
    # step 0) -> process 1. Two sequential single-call blocks: parallel 0 (1 != 2) -> 1 - 0.30 = 0.70.
    gold = [call("f", x=1), call("g", y=2)]
    assert normalize_gold_calls(gold) == [gold]
    assert tool_process_score(tc(gold), gold, ALLOWED)["process"] == pytest.approx(1.0)
    assert tool_process_score(tc(gold[0]) + tc(gold[1]), gold, ALLOWED)["process"] == pytest.approx(0.70)


@pytest.mark.parametrize("allowed", [None, []], ids=["absent", "empty"])
def test_a_row_without_allowed_tools_scores_zero(allowed):
    # official: no allowed_tools -> its error result, score 0 with every part 0, the judge not asked; even
    # the perfect plan and summary (which score 1 + 0.75 with allowed_tools)
    judge = FixedJudge()
    row = {k: v for k, v in ROW.items() if k != "allowed_tools"}
    if allowed is not None:
        row["allowed_tools"] = allowed
    reward = HierRReward(judge=judge)
    out = reward(row, [CALL, SUMMARY], tool_responses=["r"])
    assert out.score == 0 and all(out.parts[k] == 0 for k in (*COMPONENTS, "process", "summary"))
    assert (out.parts["should_call_but_no_call"], out.turns["tool_scores"], judge.seen) == (0.0, [0.0], [])
    assert reward.turn_score(row, 0, CALL) == 0.0
    assert reward({**row, "allowed_tools": ["get_weather"]}, [CALL, SUMMARY], tool_responses=["r"]).score == 1.75


def test_the_judge_sees_the_results_of_the_good_items_of_a_partly_bad_block():
    # [get_weather(Seoul), zzz()]: the block is invalid (format 0/1, no prediction: name = key = value = 0,
    # parallel 0 vs 1) -> process 0; the environment executed the good item, so its result is real and the
    # summary is judged, as officially: 0 + 0.75
    judge = FixedJudge()
    block = tc([call("get_weather", city="Seoul"), call("zzz")])
    out = HierRReward(judge=judge)(ROW, [block, SUMMARY], tool_responses=['{"rain": true}'])
    assert (out.parts["process"], out.parts["summary"], out.score, out.parts["valid_call"]) == (0.0, 0.75, 0.75, 0.0)
    assert judge.seen == [(ROW["question"], ['{"rain": true}'], SUMMARY)]
