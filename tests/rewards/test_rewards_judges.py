"""Summary judges (docs/methods.md §1, "Summary judge"): guards, rubric rule, noise, LLM judge prompt and
retries. The rating parser (``parse_rating``) is tested in the bad-input corpus
(tests/data/bad_inputs/judges.jsonl), the rubric judge's unit interval in tests/test_fuzz.py."""

import random

import pytest

from lit_credit import backends
from lit_credit.rewards.judges import (
    JudgeResult,
    LLMJudge,
    RubricJudge,
    SummaryJudge,
    build_judge_prompt,
    rubric_parts,
    rubric_rating,
    salient_values,
)

Q = "Will it rain in Seoul tomorrow?"
RESP = ['{"city": "Seoul", "date": "2026-11-30", "rain_prob": 0.8, "temp_c": 12.37, "condition": "Rain"}']
GOOD = "Tomorrow (2026-11-30) Seoul will see rain, 80% chance, 12.4 C."


class Const(SummaryJudge):
    def __init__(self, rating, **kw):
        super().__init__(**kw)
        self.rating, self.calls = rating, 0

    def rate(self, question, tool_responses, reply):
        self.calls += 1
        if isinstance(self.rating, Exception):
            raise self.rating
        return self.rating


# ------------------------------------------------------------------------------------------------ base
@pytest.mark.parametrize(("rating", "score"), [(1, 0.0), (2, 0.25), (3, 0.5), (4, 0.75), (5, 1.0)])
def test_rating_to_score(rating, score):
    assert Const(rating)(Q, ["r"], "a long enough reply") == JudgeResult(score, rating, False, "ok")


@pytest.mark.parametrize(("responses", "reply", "reason"), [
    ([], "a long enough reply", "no_tool_response"),
    (["  ", ""], "a long enough reply", "no_tool_response"),
    (None, "a long enough reply", "no_tool_response"),
    (["r"], "123456789", "short_reply"),           # 9 characters < 10
    (["r"], "   12345678   ", "short_reply"),      # trimmed first
    (["r"], None, "short_reply"),
])
def test_guards_score_zero_without_the_backend(responses, reply, reason):
    judge = Const(5)
    assert judge(Q, responses, reply) == JudgeResult(0.0, None, False, reason)
    assert judge.calls == 0 and judge.failures == 0


def test_ten_characters_is_enough():
    assert Const(5)(Q, ["r"], "1234567890").score == 1.0


@pytest.mark.parametrize("bad", [RuntimeError("down"), None, 0, 6, 3.5])
def test_backend_failure_scores_zero_and_is_counted(bad):
    judge = Const(bad)
    result = judge(Q, ["r"], "a long enough reply")
    assert (result.score, result.rating, result.failed) == (0.0, None, True)
    assert result.reason.startswith("judge_failed") and judge.failures == 1


def test_noise_reproducible_and_replicable():
    n = 30
    j1, j2 = Const(5, noise=0.5, seed=7), Const(5, noise=0.5, seed=7)
    r1 = [j1(Q, ["r"], "a long enough reply").rating for _ in range(n)]
    r2 = [j2(Q, ["r"], "a long enough reply").rating for _ in range(n)]
    assert r1 == r2
    # hand replica: one random() per rating; when < p, one randint(1, 5) replaces it
    rng, expected = random.Random(7), []
    for _ in range(n):
        expected.append(rng.randint(1, 5) if rng.random() < 0.5 else 5)
    assert r1 == expected and any(r != 5 for r in r1)
    # the global RNG is untouched, and p = 0 never changes a rating
    random.seed(0)
    x = random.random()
    random.seed(0)
    Const(5, noise=1.0, seed=1)(Q, ["r"], "a long enough reply")
    assert random.random() == x
    assert {Const(3)(Q, ["r"], "a long enough reply").rating for _ in range(20)} == {3}
    with pytest.raises(ValueError):
        Const(3, noise=1.5)


# ------------------------------------------------------------------------------------------------ rubric
def test_salient_values_text_rule():
    text = 'Temperature in Seoul is -3.5 on 2026-11-30, status "partly cloudy". The end.'
    nums, strs = salient_values([text])
    assert nums == {-3.5, 2026.0, 11.0, 30.0}                 # "-11", "-30" are glued to a word: no sign
    assert strs == {"temperature", "seoul", "partly cloudy"}  # "The" is a sentence starter
    # not JSON -> text rule: "1,234" -> 1234, the quoted "bad"; lower-case words are not salient
    assert salient_values(['{"bad": 1,234', "plain 1,234 text"]) == ({1234.0}, {"bad"})
    nums, strs = salient_values(['{"a": [1, true, null, "x", "Busan"], "b": {"c": 2.5}}'])
    assert nums == {1.0, 2.5} and strs == {"busan"}           # bool/null skipped, 1-char string skipped


def test_rubric_parts_hand_computed():
    # salient: strings {seoul, 2026-11-30, rain}, numbers {0.8, 12.37}: |S| = 5.
    # found: seoul, 2026-11-30, rain (substrings), 12.37 as "12.4" (|12.37 - 12.4| = 0.03 <= 0.05);
    # 0.8 is not (the reply says 80). use = 4 / min(5, 8) = 0.8.
    # terms: rain, seoul, tomorrow ("will", "it", "in" are stop words / short) -> prefixes rain, seoul, tomor:
    # all present -> complete 1. 64 chars <= 1500 -> concise 1.
    assert rubric_parts(Q, RESP, GOOD) == pytest.approx({"use": 0.8, "complete": 1.0, "concise": 1.0})
    # q = 0.5*0.8 + 0.3 + 0.2 = 0.9 -> 1 + floor(3.6 + 0.5) = 5
    assert rubric_rating(Q, RESP, GOOD) == 5
    # nothing used, no term addressed: q = 0.2 -> 1 + floor(0.8 + 0.5) = 2
    bad = "I could not find anything useful here."
    assert rubric_parts(Q, RESP, bad) == {"use": 0.0, "complete": 0.0, "concise": 1.0}
    assert rubric_rating(Q, RESP, bad) == 2
    # k_facts caps the denominator: 4 found / min(5, 4) = 1
    assert rubric_parts(Q, RESP, GOOD, k_facts=4)["use"] == 1.0
    # concision: 3000 characters with max_chars 1500 -> 1500 / 3000
    assert rubric_parts(Q, RESP, "x" * 3000)["concise"] == 0.5
    # no salient values, no key terms -> both 1
    expected = {"use": 1.0, "complete": 1.0, "concise": 1.0}
    assert rubric_parts("How are you?", ["ok"], "I am fine, thanks.") == expected


@pytest.mark.parametrize(("reply", "found"), [
    ("about 23.5", True),   # |23.456 - 23.5| = 0.044 <= 0.05
    ("about 23", True),     # 0.456 <= 0.5
    ("about 23.4", False),  # 0.056 > 0.05
    ("about 123", False),   # a different number, not a substring match
])
def test_rubric_number_rounding(reply, found):
    assert rubric_parts("", ['{"t": 23.456}'], reply)["use"] == float(found)


def test_rubric_rating_rounds_half_up():
    reply = "Seoul 2026-11-30 rain 12.37 0.8 tomorrow"      # use = complete = concise = 1
    assert rubric_rating(Q, RESP, reply, weights=(0.625, 0.0, 0.0)) == 4   # 1 + floor(2.5 + 0.5)
    assert rubric_rating(Q, RESP, reply, weights=(0.375, 0.0, 0.0)) == 3   # 1 + floor(1.5 + 0.5)
    assert rubric_rating(Q, RESP, reply, weights=(0.0, 0.0, 0.0)) == 1


def test_rubric_judge_end_to_end():
    assert RubricJudge()(Q, RESP, GOOD) == JudgeResult(1.0, 5, False, "ok")
    assert RubricJudge()(Q, RESP, "short") == JudgeResult(0.0, None, False, "short_reply")
    ratings = [RubricJudge(noise=1.0, seed=3)(Q, RESP, GOOD).rating for _ in range(2)]
    assert ratings[0] == ratings[1]


# ------------------------------------------------------------------------------------------------ LLM judge
XML = "<response_quality><reasoning>Uses the forecast.</reasoning><rating>4</rating></response_quality>"


class Fake:
    def __init__(self, *outputs):
        self.outputs, self.prompts = list(outputs), []

    def __call__(self, prompt):
        self.prompts.append(prompt)
        out = self.outputs.pop(0) if len(self.outputs) > 1 else self.outputs[0]
        if isinstance(out, Exception):
            raise out
        return out


def test_llm_judge_prompt_and_valid_reply():
    fake = Fake(XML)
    judge = LLMJudge(fake, backoff=0)
    assert judge(Q, ["resp one", "resp two"], GOOD) == JudgeResult(0.75, 4, False, "ok")
    (prompt,) = fake.prompts
    assert prompt == build_judge_prompt(Q, ["resp one", "resp two"], GOOD)
    for part in (Q, "[1] resp one", "[2] resp two", GOOD, "<rating>N</rating>", "<response_quality>"):
        assert part in prompt
    assert "...[truncated]" in build_judge_prompt(Q, ["x" * 50], GOOD, max_response_chars=10)


@pytest.mark.parametrize("first", ["garbage", RuntimeError("timeout")])
def test_llm_judge_retries(first):
    fake = Fake(first, XML)
    judge = LLMJudge(fake, max_retries=2, backoff=0)
    assert judge(Q, ["r"], GOOD).rating == 4
    assert (judge.calls, judge.failures) == (2, 0)


def test_llm_judge_failure_is_counted(monkeypatch):
    slept = []
    monkeypatch.setattr(backends, "sleep", slept.append)
    judge = LLMJudge(Fake("garbage"), max_retries=2, backoff=0.5)
    result = judge(Q, ["r"], GOOD)
    assert (result.score, result.rating, result.failed) == (0.0, None, True)
    assert (judge.calls, judge.failures) == (3, 1)      # 1 + max_retries calls
    assert slept == [0.5, 1.0]                          # backoff * 2**(r-1) before retry r
    judge(Q, [], GOOD)                                  # a guard is not a failure and calls nothing
    assert (judge.calls, judge.failures) == (3, 1)
