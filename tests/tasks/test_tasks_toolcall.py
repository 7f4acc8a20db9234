"""The toolcall task: catalog, synthetic splits, simulators, environment, demonstrations, parquet loader."""
from __future__ import annotations

import copy
import itertools
import json
import random
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lit_credit.rewards.hierr import HierRReward, normalize_gold_calls, tool_process_score
from lit_credit.rewards.judges import RubricJudge, SummaryJudge
from lit_credit.tasks.tool_catalog import HANDLERS, SCHEMAS, SUBSETS, TEMPLATES, VOCAB, call_hash, fact
from lit_credit.tasks.toolcall import (
    DEFAULT_SUBSETS,
    TRUNCATED,
    LLMToolSimulator,
    ToolCallTask,
    ToolEnvironment,
    ToolSimulator,
    apportion,
    content_key,
    gold_conversation,
    load_toucan_parquet,
    tool_call_text,
    truncate,
)

WEATHER = {"name": "get_weather", "arguments": {"city": "Seoul", "date": "2026-11-30"}}


@pytest.fixture(scope="module")
def task() -> ToolCallTask:
    return ToolCallTask(num_train=200, num_test=60, seed=3)


def rows_of(task: ToolCallTask, split: str, subset: str) -> list[dict]:
    return [r for r in task.dataset(split) if r["subset"] == subset]


def error_of(response: str) -> str:
    return json.loads(response)["error"]


# ------------------------------------------------------------------------------------------------ catalog
def test_catalog_has_compact_valid_schemas_and_templates_use_it():
    assert len(SCHEMAS) >= 12 and set(HANDLERS) == set(SCHEMAS)
    for name, schema in SCHEMAS.items():
        fn = schema["function"]
        assert schema["type"] == "function" and fn["name"] == name and 0 < len(fn["description"]) <= 60
        params = fn["parameters"]
        assert params["type"] == "object" and params["properties"]
        assert set(params["required"]) <= set(params["properties"])
        assert all(p["type"] in ("string", "number") for p in params["properties"].values())
        assert len(json.dumps(schema)) < 300  # the tiny policy reads these in every prompt
    assert {t.subset for t in TEMPLATES} == set(SUBSETS)
    assert len({t.id for t in TEMPLATES}) == len(TEMPLATES)


# ------------------------------------------------------------------------------------------------ splits
def test_subsets_come_in_the_requested_proportions():
    weights = {"single": 0.5, "parallel": 0.2, "multi": 0.2, "irrelevant": 0.1}
    task = ToolCallTask(num_train=200, num_test=50, subsets=weights)
    assert Counter(task.dataset("train")["subset"]) == {"single": 100, "parallel": 40, "multi": 40, "irrelevant": 20}
    assert Counter(task.dataset("test")["subset"]) == apportion(50, weights)
    only = ToolCallTask(num_train=30, num_test=10, subsets="single, irrelevant")
    assert Counter(only.dataset("train")["subset"]) == {"single": 15, "irrelevant": 15}
    assert apportion(10, {"a": 1, "b": 1, "c": 1}) == {"a": 4, "b": 3, "c": 3}


@pytest.mark.parametrize("kwargs, key", [({"subsets": ["single", "chitchat"]}, "task.subsets"),
                                         ({"subsets": {"single": -1}}, "task.subsets"),
                                         ({"max_distractors": -1}, "task.max_distractors"),
                                         ({"values_per_slot": 1}, "task.values_per_slot"),
                                         ({"num_train": None}, "task.num_train"),
                                         ({"num_train": 5000, "subsets": "irrelevant"}, "task.num_train")])
def test_bad_configuration_names_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        ToolCallTask(**kwargs).dataset("train")


def test_values_per_slot_draws_each_slot_from_its_vocabulary_head():
    """values_per_slot=4: every slot value of every question (splits and demonstrations) is among its
    vocabulary's first 4, and the gold calls carry them; the 17 single templates then hold 276 distinct
    questions (e.g. weather: 4 cities x 4 dates = 16; convert: 4 amounts x 4 x 3 ordered currency pairs = 48),
    and asking for more names both counts before drawing anything. (150 train: the 60 held-out contents
    cover more than 60 of the 276 questions, their other phrasings, which train may not use.)"""
    task = ToolCallTask(num_train=150, num_test=60, subsets="single", values_per_slot=4)
    by_id = {t.id: t for t in TEMPLATES}
    rows = task.dataset("train").to_list() + task.dataset("test").to_list()
    for row in rows:
        template_id, values = row["id"].split(":", 1)
        for (_, vocab), value in zip(by_id[template_id].slots, values.split("|")):
            assert value in {str(v) for v in VOCAB[vocab][:4]}, (row["id"], vocab)
    assert len({r["id"] for r in rows}) == 210
    cities = {c["arguments"]["city"] for r in rows for step in normalize_gold_calls(r["gold_tool_calls"]) for c in step
              if "city" in c["arguments"]}
    assert cities == set(VOCAB["city"][:4])
    demo_questions = {m["content"] for d in task.demonstrations(200, seed=1) for m in d["messages"][:1]}
    assert not any(c in q for q in demo_questions for c in VOCAB["city"][4:])
    with pytest.raises(ValueError, match="asked for 360 distinct questions and has 276"):
        ToolCallTask(num_train=300, num_test=60, subsets="single", values_per_slot=4).dataset("train")


@pytest.mark.parametrize("k", [2, 3, 4])
def test_num_questions_counts_every_valid_key(k):
    """num_questions(subset) is the number of distinct valid (template, values) keys, counted here by brute
    force over every value tuple of the first k values per slot (slots of one vocabulary distinct); with
    exactly num_contents (phrasings of one call counted once: weather / weather_rain, convert / convert_q) held
    out, the test split holds every content once."""
    task = ToolCallTask(num_train=0, num_test=0, subsets=["single", "chain"], values_per_slot=k)
    for subset in ("single", "chain"):
        brute = {(t.id, vs) for t in TEMPLATES if t.subset == subset
                 for vs in itertools.product(*(VOCAB[v][:k] for _, v in t.slots)) if t.valid(vs)}
        assert task.num_questions(subset) == len(brute)
    assert task.num_questions("single") == {2: 52, 3: 138, 4: 276}[k]
    # minus the k*k weather_rain and k*k*(k-1) convert_q questions, which repeat a weather / convert call
    assert task.num_contents("single") == {2: 52 - 4 - 4, 3: 138 - 9 - 18, 4: 276 - 16 - 48}[k]
    full = ToolCallTask(num_train=0, num_test=task.num_contents("single"), subsets="single", values_per_slot=k)
    assert len({content_key(r) for r in full.dataset("test")}) == task.num_contents("single")


@pytest.mark.parametrize("value, match", [(2, "'rate2' template of the 'parallel' subset needs 3 distinct"),
                                          (2.5, "must be a positive integer"), (True, "must be a positive integer")])
def test_values_per_slot_below_a_templates_needs_is_refused(value, match):
    """rate2 (parallel) converts one amount into two other currencies: three distinct currencies."""
    with pytest.raises(ValueError, match=match):
        ToolCallTask(subsets="parallel", values_per_slot=value)


def test_demonstrations_with_no_question_left_raise_instead_of_hanging():
    """values_per_slot=2 leaves 52 single questions; 12 held-out contents (14 questions with their other
    phrasings, for this seed) + 38 train use them all, so disjoint demonstrations have none left (the draw
    used to loop forever); without disjointness the 38 train questions remain demonstrable."""
    kwargs = dict(num_train=38, num_test=12, subsets="single", values_per_slot=2)
    task = ToolCallTask(**kwargs)
    held = {content_key(r) for r in task.dataset("test")}
    assert len(task.dataset("train")) + sum(task.content_counts("single")[c] for c in held) == 52
    with pytest.raises(ValueError, match="disjoint_demonstrations"):
        next(iter(ToolCallTask(**kwargs, disjoint_demonstrations=True).demonstrations(1, seed=0)))
    assert len(list(ToolCallTask(**kwargs).demonstrations(5, seed=0))) == 5


def test_disjoint_demonstrations_skip_the_train_questions_too():
    """By default demonstrations skip only the held-out questions, so with 4 values per slot (275 questions)
    most train questions are demonstrated; disjoint_demonstrations=true skips the train questions as well."""
    def demo_questions(task):
        return {d["messages"][0]["content"] for d in task.demonstrations(400, seed=0)}

    kwargs = dict(num_train=100, num_test=60, subsets="single", values_per_slot=4)
    plain, disjoint = ToolCallTask(**kwargs), ToolCallTask(**kwargs, disjoint_demonstrations=True)
    train, test = set(plain.dataset("train")["question"]), set(plain.dataset("test")["question"])
    assert set(disjoint.dataset("train")["question"]) == train  # the splits are the same
    assert len(demo_questions(plain) & train) > 50 and not demo_questions(plain) & test
    assert not demo_questions(disjoint) & (train | test)


def test_splits_are_deterministic_disjoint_and_well_typed(task):
    train, test = task.dataset("train"), task.dataset("test")
    again = ToolCallTask(num_train=200, num_test=60, seed=3)
    assert again.dataset("train").to_list() == train.to_list() and again.dataset("test").to_list() == test.to_list()
    assert ToolCallTask(num_train=20, num_test=60, seed=3).dataset("test")["id"] == test["id"]  # test ignores num_train
    assert ToolCallTask(num_train=200, num_test=60, seed=4).dataset("test")["id"] != test["id"]
    assert len(set(train["id"])) == 200 and len(set(test["id"])) == 60 and not set(train["id"]) & set(test["id"])
    assert not set(train["question"]) & set(test["question"])
    assert set(train.column_names) == {"prompt", "tools", "gold_tool_calls", "allowed_tools", "question", "subset", "id"}
    for row in [*train, *test]:
        tools = json.loads(row["tools"])
        gold = json.loads(row["gold_tool_calls"])
        gold_names = {c["name"] for step in gold for c in step}
        assert row["prompt"] == [{"role": "user", "content": row["question"]}]
        assert [t["function"]["name"] for t in tools] == row["allowed_tools"]
        assert gold_names <= set(row["allowed_tools"]) and len(tools) <= len(gold_names) + 2
        assert len(tools) > len(gold_names) and all(t == SCHEMAS[t["function"]["name"]] for t in tools)
        assert normalize_gold_calls(gold) == gold
        shape = [len(step) for step in gold]
        assert shape == {"single": [1], "parallel": [2], "multi": [1, 1], "irrelevant": []}[row["subset"]]


# ------------------------------------------------------------------------------------------------ simulators
def test_simulator_is_deterministic_and_canonical():
    sim = ToolSimulator()
    out = json.loads(sim.respond(WEATHER))
    assert set(out) == {"city", "date", "temp_c", "condition"} and out["city"] == "Seoul"
    assert sim.respond(WEATHER) == ToolSimulator()(WEATHER)
    assert sim.respond({"name": "get_weather", "parameters": {"date": "2026-11-30", "city": " seoul"}}) == \
        sim.respond(WEATHER)  # canonical arguments, "parameters" accepted
    temps = {json.loads(sim.respond({"name": "get_weather", "arguments": {"city": c, "date": "2026-11-30"}}))["temp_c"]
             for c in ("Seoul", "Tokyo", "Paris", "London", "Oslo", "Lima")}
    assert len(temps) > 1
    assert call_hash("x", {"a": 1}) == call_hash("x", {"a": 1.0})
    conv = json.loads(sim.respond({"name": "convert_currency", "arguments": {"amount": 100, "from": "usd", "to": "EUR"}}))
    assert conv == {"amount": 100, "from": "USD", "to": "EUR", "result": 92.0}
    assert json.loads(sim.respond({"name": "calculate", "arguments": {"expression": "12 * 7"}}))["result"] == 84
    dist = [json.loads(sim.respond({"name": "get_distance", "arguments": {"origin": a, "destination": b}}))["km"]
            for a, b in (("Seoul", "Paris"), ("Paris", "Seoul"))]
    assert dist[0] == dist[1] > 0


@pytest.mark.parametrize("call, message", [
    ({"name": "teleport", "arguments": {}}, "unknown tool: teleport"),
    ({"name": "get_weather", "arguments": {"city": "Seoul"}}, "missing argument: date"),
    ({"name": "get_weather", "arguments": {"city": "Seoul", "date": "2026-11-30", "unit": "F"}},
     "unexpected argument: unit"),
    ({"name": "get_weather", "arguments": {"city": 7, "date": "2026-11-30"}}, "argument city must be string"),
    ({"name": "get_weather", "arguments": {"city": "Seoul", "date": "tomorrow"}}, "date must be YYYY-MM-DD"),
    ({"name": "convert_currency", "arguments": {"amount": 5, "from": "USD", "to": "XYZ"}}, "unknown currency code: XYZ"),
    ({"name": "calculate", "arguments": {"expression": "__import__('os')"}}, "invalid expression"),
    ({"name": "get_weather", "arguments": "city=Seoul"}, "arguments must be a JSON object"),
    ({"arguments": {}}, "a call needs a string name"),
    (None, "a call needs a string name"),
    ("get_weather", "a call needs a string name"),
])
def test_simulator_answers_bad_calls_with_an_error(call, message):
    assert error_of(ToolSimulator().respond(call)).startswith(message)


def test_simulator_answers_row_schemas_outside_the_catalog():
    schema = {"type": "function", "function": {"name": "lookup_order", "parameters": {
        "type": "object", "properties": {"order_id": {"type": "integer"}}, "required": ["order_id"]}}}
    sim = ToolSimulator()
    out = json.loads(sim.respond({"name": "lookup_order", "arguments": {"order_id": 42}}, schema))
    assert out["tool"] == "lookup_order" and out["status"] == "ok"
    assert error_of(sim.respond({"name": "lookup_order", "arguments": {"order_id": "x"}}, schema)) == \
        "argument order_id must be integer"
    assert error_of(sim.respond({"name": "lookup_order", "arguments": {"order_id": 42}})) == "unknown tool: lookup_order"


def test_llm_simulator_extracts_json_and_falls_back_to_an_error():
    prompts = []

    def chatty(prompt: str) -> str:
        prompts.append(prompt)
        return 'Sure! ```json\n{"city": "Seoul", "temp_c": 3}\n``` hope this helps'

    sim = LLMToolSimulator(chatty)
    assert sim.respond(WEATHER) == '{"city":"Seoul","temp_c":3}'
    assert '"get_weather"' in prompts[0] and '"2026-11-30"' in prompts[0] and "required" in prompts[0]
    assert error_of(sim.respond({"name": "nope", "arguments": {}})) == "unknown tool: nope" and sim.calls == 1

    def broken(prompt: str) -> str:
        raise RuntimeError("backend down")

    for fn in (broken, lambda p: "no json here"):
        sim = LLMToolSimulator(fn, max_retries=2, backoff=0)
        assert error_of(sim.respond(WEATHER)) == "tool simulator failed" and sim.calls == 3 and sim.failures == 1


# ------------------------------------------------------------------------------------------------ environment
def test_environment_answers_single_parallel_and_multi_step_gold_replies(task):
    env, sim = task.environment(), ToolSimulator()
    assert env.max_turns == 10 and env.max_response_chars == 300
    for subset in ("single", "parallel", "multi"):
        row = rows_of(task, "test", subset)[0]
        frozen = copy.deepcopy(row)
        gold = normalize_gold_calls(row["gold_tool_calls"])
        for turn, step in enumerate(gold):
            fb = env.step(row, turn, tool_call_text(step))
            expected = [sim.respond(c) for c in step]
            assert not fb.done and fb.score is None
            assert fb.messages == [{"role": "tool", "content": r} for r in expected]
            assert fb.info["tool_responses"] == expected and all("error" not in json.loads(r) for r in expected)
        final = env.step(row, len(gold), "Here is what I found: it is sunny.")
        assert final.done and final.messages == [] and final.info["tool_responses"] == []
        assert row == frozen  # rows are shared by the n rollouts of a prompt: never mutated
    parallel = rows_of(task, "test", "parallel")[0]
    assert len(env.step(parallel, 0, tool_call_text(normalize_gold_calls(parallel["gold_tool_calls"])[0])).messages) == 2


def test_environment_answers_invalid_blocks_with_errors_and_truncates():
    row = {"prompt": [], "tools": json.dumps([SCHEMAS["get_weather"], SCHEMAS["get_time"]]),
           "allowed_tools": ["get_weather", "get_time"]}
    call = json.dumps(WEATHER)
    # blocks, in order: a call; bad JSON (debris); an unknown tool (error answer); a list block of a call and
    # an item with no string name (debris) and one whose arguments are no object (error answer); then an
    # unclosed open tag (debris). get_time without arguments is a call (official: arguments read as {}),
    # answered by the simulator with the schema's complaint.
    reply = (f"<think><tool_call>ignored</tool_call></think><tool_call>{call}</tool_call> <tool_call>{{bad json"
             "</tool_call><tool_call>{\"name\": \"send_email\", \"arguments\": {}}</tool_call>"
             f"<tool_call>[{call}, {{\"name\": 7}}, {{\"name\": \"get_time\", \"arguments\": \"x\"}}]</tool_call>"
             "<tool_call>{\"name\": \"get_time\"}</tool_call><tool_call>{\"name\": \"get_time\"")
    sim = ToolSimulator()
    answered = sim.respond(WEATHER)
    no_city = sim.respond({"name": "get_time", "arguments": {}})
    assert error_of(no_city) == "missing argument: city"
    # debris_ends_episode=False: every piece answered in order; only the calls' answers are real
    fb = ToolEnvironment(max_turns=3, debris_ends_episode=False).step(row, 0, reply)
    messages = [m["content"] for m in fb.messages]
    assert not fb.done and len(messages) == 8
    assert [messages[0], messages[3], messages[6]] == [answered, answered, no_city]
    assert [error_of(messages[i]) for i in (1, 2, 4, 5, 7)] == [
        "invalid JSON in <tool_call>", "unknown tool: send_email", "a call needs a string name",
        "a call needs an arguments object", "unmatched tag: write <tool_call>{...}</tool_call>"]
    assert fb.info["real"] == [True, False, False, True, False, False, True, False]
    assert fb.info["tool_responses"] == [answered, answered, no_city]
    # debris_ends_episode=True (default, official): debris gets no answer; calls and error answers stay
    env = ToolEnvironment(max_turns=3)
    assert env.debris_ends_episode
    fb = env.step(row, 0, reply)
    assert [m["content"] for m in fb.messages] == [messages[i] for i in (0, 2, 3, 5, 6)]
    assert fb.info["real"] == [True, False, True, False, True] and not fb.done
    for debris in ("<tool_call>{bad json</tool_call> It is sunny.", "</tool_call> It is sunny.", "<tool_call>",
                   '<tool_call>[{"name": null}]</tool_call>'):
        # nothing answered: the episode ends on this reply, as when no tag is written
        assert env.step(row, 0, debris) == env.step(row, 0, "It is sunny.")
        assert ToolEnvironment(debris_ends_episode=False).step(row, 0, debris).messages  # answered, goes on
    assert env.step(row, 0, "<think><tool_call>" + call + "</tool_call></think>It is sunny.").done
    assert env.step(row, 2, f"<tool_call>{call}</tool_call>").done  # the last allowed turn
    short = ToolEnvironment(max_response_chars=40).step(row, 0, f"<tool_call>{call}</tool_call>").messages[0]["content"]
    assert len(short) == 40 and short.endswith(TRUNCATED) and truncate("abc", 40) == "abc"
    three = f"<tool_call>[{call}, {call}, {call}]</tool_call>"
    many = ToolEnvironment(max_calls_per_turn=2, debris_ends_episode=False).step(row, 0, three)
    assert len(many.messages) == 3 and error_of(many.messages[2]["content"]).startswith("too many calls")
    assert len(ToolEnvironment(max_calls_per_turn=2).step(row, 0, three).messages) == 2  # official: dropped


# ------------------------------------------------------------------------------------------------ demonstrations
def test_demonstrations_match_the_reward_the_environment_and_the_test_split(task):
    env, reward = task.environment(), HierRReward()
    test_ids, seen = set(task.dataset("test")["id"]), Counter()
    pairs = list(task.demonstration_rows(120, seed=7))
    assert [d for _, d in pairs] == list(task.demonstrations(120, seed=7))
    for row, demo in pairs:
        seen[row["subset"]] += 1
        assert row["id"] not in test_ids and demo["tools"] == json.loads(row["tools"])
        messages = demo["messages"]
        assert messages[0] == {"role": "user", "content": row["question"]} and messages[-1]["role"] == "assistant"
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        tool_messages = [m["content"] for m in messages if m["role"] == "tool"]
        parts = tool_process_score("\n".join(replies), row["gold_tool_calls"], row["allowed_tools"])
        scored = reward(row, replies, tool_responses=tool_messages)
        assert "<tool_call>" not in replies[-1] and scored.parts["should_call_but_no_call"] == 0
        if row["subset"] == "irrelevant":  # no tag: format is 0, so 0.9 is the most an irrelevant row can get
            assert parts["process"] == pytest.approx(0.9) and tool_messages == [] and len(replies) == 1
            continue
        assert parts["process"] == pytest.approx(1.0)
        assert scored.parts["summary"] >= 0.5  # the rubric judge finds the facts of the responses in the summary
        replayed = []  # the environment answers the gold turns with exactly the demo's tool messages
        for turn, reply in enumerate(replies):
            fb = env.step(row, turn, reply)
            assert fb.done == (turn == len(replies) - 1)
            replayed += fb.info["tool_responses"]
        assert replayed == tool_messages
    assert set(seen) == set(DEFAULT_SUBSETS)


def test_dependent_second_steps_use_the_first_result(task):
    sim = ToolSimulator()
    rows = [r for r in task.dataset("train") if r["id"].startswith(("stock_convert:", "restaurant_event:"))]
    assert rows
    for row in rows:
        first, second = (step[0] for step in normalize_gold_calls(row["gold_tool_calls"]))
        result = json.loads(sim.respond(first))
        if first["name"] == "get_stock_price":
            assert second["arguments"]["amount"] == result["price"]
        else:
            assert second["arguments"]["title"] == f"Dinner at {result['name']}"
    assert fact("get_weather", WEATHER["arguments"], sim.respond(WEATHER)).startswith("The weather in Seoul on 2026-11-30 is ")
    assert fact("get_weather", {}, '{"error":"boom"}') == "get_weather failed: boom."


def test_chain_steps_copy_a_value_of_the_previous_response_and_gold_turns_score_one():
    # toolcall_multistep's subset: every later call carries a value of the previous step's response.
    task = ToolCallTask(num_train=120, num_test=30, subsets={"chain": 1.0}, max_distractors=1, max_turns=4)
    sim, reward = ToolSimulator(), HierRReward()
    copied = {"find_restaurant": ("name", "title"), "create_event": ("event_id", "subject"),
              "web_search": ("top_result", "text"), "translate_text": ("translation", "subject"),
              "get_stock_price": ("price", "amount"), "convert_currency": ("result", "subject"),
              "get_flight_status": ("gate", "title"), "get_news": ("headline", "text")}
    depths = Counter()
    for row, demo in task.demonstration_rows(60, seed=1):
        steps = [step[0] for step in normalize_gold_calls(row["gold_tool_calls"])]
        depths[len(steps)] += 1
        for prev, nxt in itertools.pairwise(steps):
            result = json.loads(sim.respond(prev))
            if prev["name"] == "get_exchange_rate":
                assert nxt["arguments"]["expression"].endswith(f"* {result['rate']}")
            else:
                out_key, in_key = copied[prev["name"]]
                assert str(nxt["arguments"][in_key]) == str(result[out_key])
        replies = [m["content"] for m in demo["messages"] if m["role"] == "assistant"]
        scored = reward(row, replies)
        assert scored.turns["tool_scores"] == [1.0] * len(steps) and scored.turns["tool_exact"] == [1.0] * len(steps)
    assert set(depths) == {2, 3}
    assert set(task.dataset("test")["subset"]) == {"chain"}


# ------------------------------------------------------------------------------------------------ no reward hack
class TopJudge(SummaryJudge):
    """The most generous judge there is: every reply it is asked about is excellent (5 -> 1.0). A reply it
    is never asked about (no real tool response, a no-call prompt) scores 0, which is what the guards
    must secure."""

    def rate(self, question, tool_responses, reply):
        return 5


def play(env, reward, row, replies):
    """One episode as ``run_episodes`` + ``Experience.score`` play it, with scripted replies: each
    reply goes to the environment; the episode ends when it is done (or at its last turn), and the responses
    of the turns before are what the reward is given."""
    used, responses = [], []
    for turn, text in enumerate(replies[: env.max_turns]):
        used.append(text)
        fb = env.step(row, turn, text)
        if fb.done or turn == env.max_turns - 1:
            break
        responses += fb.info.get("tool_responses", [])
    return reward(row, used, tool_responses=responses)


def debris_forms(answer: str) -> dict[str, list[str]]:
    """Tool-call debris before ``answer``: its own turn, or the same turn."""
    return {
        "lone open tag": ["<tool_call>", answer],
        "lone close tag": ["</tool_call>", answer],
        "invalid JSON block": ["<tool_call>{bad json</tool_call>", answer],
        "unknown tool name": ['<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>', answer],
        "arguments no object": ['<tool_call>{"name": "get_weather", "arguments": "x"}</tool_call>', answer],
        "no string name": ['<tool_call>[{"name": null}]</tool_call>', answer],
        "empty list block": ["<tool_call>[]</tool_call>", answer],
        "block then direct answer": [f"<tool_call>{{oops</tool_call> {answer}"],
        "close tag then direct answer": [f"</tool_call> {answer}"],
    }


def valid_calls(task: ToolCallTask) -> dict[str, dict]:
    """One schema-valid gold call per tool name, from the task's rows that have calls."""
    calls: dict[str, dict] = {}
    for split in ("train", "test"):
        for row in task.dataset(split):
            for step in normalize_gold_calls(row["gold_tool_calls"]):
                for c in step:
                    calls.setdefault(c["name"], c)
    return calls


@pytest.mark.parametrize("ends", [True, False], ids=["debris-ends", "debris-answered"])
@pytest.mark.parametrize("judge", [RubricJudge(), TopJudge()], ids=["rubric", "top"])
def test_no_reply_beats_the_direct_answer_on_irrelevant_prompts(task, judge, ends):
    env = ToolEnvironment(max_turns=task.max_turns, max_response_chars=task.max_response_chars,
                          debris_ends_episode=ends)
    reward = HierRReward(judge=judge)
    pairs = [(r, d) for r, d in task.demonstration_rows(80, seed=5) if r["subset"] == "irrelevant"]
    calls, sim = valid_calls(task), ToolSimulator()
    assert len(pairs) >= 5
    for row, demo in pairs:
        answer = demo["messages"][-1]["content"]
        # the right direct answer: no tag -> format 0, name 1 (both empty), key = value = 1 (no gold arguments),
        # parallel 1 (0 calls == 0) = 0.9; no tool response -> summary 0: score 0.9
        direct = play(env, reward, row, [answer])
        assert (direct.score, direct.parts["summary"], direct.parts["tool_tag"]) == (pytest.approx(0.9), 0.0, 0.0)
        for form, replies in debris_forms(answer).items():
            out = play(env, reward, row, replies)
            # debris holds no valid block: process 0.9 as above (format 0 of >= 1 tag); the environment's
            # error answers are no real response -> summary 0: a tie with the direct answer, never more
            assert out.score <= direct.score + 1e-9, form
            assert (out.parts["summary"], out.parts["valid_call"], out.parts["tool_tag"]) == (0.0, 0.0, 1.0), form
        # a real, valid call to an allowed tool, then a faithful summary of its result: format 1, name 0
        # (a call where none is due), key = value = 1, parallel 0 (1 call vs 0) = 0.45; the summary of a
        # no-call prompt is 0 (no_call_summary="zero"): 0.45 < 0.9
        name = next(n for n in row["allowed_tools"] if n in calls)
        c = calls[name]
        replies = [tool_call_text([c]), fact(name, c["arguments"], sim.respond(c)) + " " + answer]
        out = play(env, reward, row, replies)
        assert (out.score, out.parts["summary"], out.parts["valid_call"]) == (pytest.approx(0.45), 0.0, 1.0)
        # the official reward (no_call_summary="judge") judges it like any reply backed by a tool result:
        # 0.45 + the judge's score, which beats the direct answer whenever the judge gives more than 0.45
        official = play(env, HierRReward(judge=judge, no_call_summary="judge"), row, replies)
        assert official.score == pytest.approx(0.45 + official.parts["summary"]) and official.parts["summary"] > 0
        if isinstance(judge, TopJudge):
            assert official.score == pytest.approx(1.45) and official.score > direct.score
        # debris stays harmless under the official setting too: no real response, nothing to judge
        for form, replies in debris_forms(answer).items():
            assert play(env, HierRReward(judge=judge, no_call_summary="judge"), row, replies).parts["summary"] == 0, form


def plan_replies(row) -> list[str]:
    """The right plan: each gold step's calls in one turn, then the gold summary (one fact per call)."""
    demo = gold_conversation(row, ToolSimulator())
    return [m["content"] for m in demo["messages"] if m["role"] == "assistant"]


@pytest.mark.parametrize("ends", [True, False], ids=["debris-ends", "debris-answered"])
@pytest.mark.parametrize("judge", [RubricJudge(), TopJudge()], ids=["rubric", "top"])
@pytest.mark.parametrize("subset", ["multi", "chain"])
def test_debris_never_beats_the_right_plan_on_multi_step_prompts(judge, subset, ends):
    task = ToolCallTask(num_train=40, num_test=12, subsets={subset: 1.0}, max_distractors=1, max_turns=6,
                        debris_ends_episode=ends)
    env, reward = task.environment(), HierRReward(judge=judge)
    for row in task.dataset("test"):
        plan = plan_replies(row)
        right = play(env, reward, row, plan)
        # every gold step executed: process 1; the summary is judged against the real responses
        assert right.parts["process"] == pytest.approx(1.0) and right.parts["summary"] > 0
        calls, summary = plan[:-1], plan[-1]
        variants = {f"{form}, no plan": replies for form, replies in debris_forms(summary).items()}
        for form, replies in debris_forms(summary).items():
            variants[f"{form}, then the plan"] = [replies[0], *calls, summary]   # a debris turn first
        variants["close tag glued to the first call"] = [calls[0] + "</tool_call>", *calls[1:], summary]
        variants["invalid block beside the first call"] = [calls[0] + "<tool_call>{x</tool_call>", *calls[1:],
                                                           summary]
        variants["lone open tag after the summary"] = [*calls, summary + " <tool_call>"]
        for name, replies in variants.items():
            out = play(env, reward, row, replies)
            # without the plan: no valid call -> process 0 and no real response -> summary 0 (a lone close
            # tag is an omission, -0.5). With the plan: the same real responses, but format < 1 (a tag that
            # is no valid block) -> process < 1. Either way below the right plan.
            assert out.score < right.score, (row["id"], name)


# ------------------------------------------------------------------------------------------------ parquet
def _schema_json(*names: str) -> str:
    return json.dumps([SCHEMAS[n] for n in names])


def _record(question, names, gold, subset, index):
    return {"prompt": [{"role": "user", "content": question}], "data_source": "toucan_toolcall",
            "tools": _schema_json(*names),
            "reward_model": {"style": "rule", "ground_truth": {
                "allowed_tools": list(names), "gold_tool_calls": gold, "question_content": question,
                "tool_schemas": _schema_json(*names), "subset_name": subset}},
            "extra_info": {"need_tools_kwargs": True, "original_turn_index": 0, "index": index}}


def test_toucan_parquet_loader(tmp_path):
    nested = [
        _record("Will it rain in Seoul on 2026-11-30?", ["get_weather"], [[WEATHER]], "single", 0),
        _record("Time in Oslo and Lima?", ["get_time", "get_weather"],
                [[{"name": "get_time", "arguments": {"city": "Oslo"}}, {"name": "get_time", "arguments": {"city": "Lima"}}]],
                "parallel", 1),
        _record("Hi there!", ["get_news"], [], "irrelevant", 2),
    ]
    table = pa.Table.from_pylist(nested)  # arguments become one struct {city, date}: None gaps to drop
    assert pa.types.is_struct(table.schema.field("reward_model").type)
    pq.write_table(table, tmp_path / "nested.parquet")
    flat = [_record("Weather then news?", ["get_weather", "get_news"], ["get_weather", "get_news"], "multi", 3),
            _record("Thanks!", ["get_news"], [], "irrelevant", 4)]
    flat[0]["extra_info"] = {"need_tools_kwargs": True, "original_turn_index": 0}  # no index: file-row id
    flat[1]["extra_info"] = {"need_tools_kwargs": True, "original_turn_index": 0}
    pq.write_table(pa.Table.from_pylist(flat), tmp_path / "flat.parquet")

    ds = load_toucan_parquet(tmp_path / "nested.parquet")
    assert ds.column_names == ["prompt", "tools", "gold_tool_calls", "allowed_tools", "question", "subset", "id"]
    rows = ds.to_list()
    assert json.loads(rows[0]["gold_tool_calls"]) == [[WEATHER]]
    assert json.loads(rows[1]["gold_tool_calls"])[0][1] == {"name": "get_time", "arguments": {"city": "Lima"}}
    assert json.loads(rows[2]["gold_tool_calls"]) == [] and rows[2]["subset"] == "irrelevant"
    assert [r["id"] for r in rows] == ["0", "1", "2"] and rows[1]["allowed_tools"] == ["get_time", "get_weather"]
    assert rows[0]["prompt"] == [{"role": "user", "content": rows[0]["question"]}]
    assert json.loads(rows[1]["tools"]) == [SCHEMAS["get_time"], SCHEMAS["get_weather"]]

    flat_rows = load_toucan_parquet(tmp_path / "flat.parquet").to_list()
    # a flat gold list is one parallel step, as the official reward reads it
    assert json.loads(flat_rows[0]["gold_tool_calls"]) == [[{"name": "get_weather", "arguments": {}},
                                                            {"name": "get_news", "arguments": {}}]]
    assert [r["id"] for r in flat_rows] == ["flat-0", "flat-1"]
    assert len(load_toucan_parquet(tmp_path)) == 5  # a directory: every parquet file in it

    # The loaded rows work with the environment and the reward.
    reply = tool_call_text(normalize_gold_calls(rows[1]["gold_tool_calls"])[0])
    assert len(ToolEnvironment().step(rows[1], 0, reply).messages) == 2
    assert tool_process_score(reply, rows[1]["gold_tool_calls"], rows[1]["allowed_tools"])["process"] == 1.0
    demo = gold_conversation(rows[0], ToolSimulator())
    assert demo["messages"][1]["content"] == tool_call_text([WEATHER])

    task = ToolCallTask(parquet_path=str(tmp_path), num_test=2, num_train=None, seed=1)
    train, test = task.dataset("train"), task.dataset("test")
    assert len(train) == 3 and len(test) == 2 and not set(train["id"]) & set(test["id"])
    split = ToolCallTask(parquet_path=tmp_path / "nested.parquet", test_parquet_path=tmp_path / "flat.parquet",
                         subsets=["single", "multi", "irrelevant"])
    assert split.dataset("train")["subset"] == ["single", "irrelevant"] and len(split.dataset("test")) == 2
    demos = list(split.demonstrations(3, seed=0))
    assert len(demos) == 3 and all(d["messages"][1]["content"] == tool_call_text([WEATHER]) for d in demos)
    flat_only = ToolCallTask(parquet_path=tmp_path / "flat.parquet", test_parquet_path=tmp_path / "nested.parquet")
    with pytest.raises(ValueError, match="fit its tool schemas"):  # names without arguments teach errors
        next(iter(flat_only.demonstrations(1, seed=0)))


def _call_json(message):
    """The JSON inside an assistant turn's ``<tool_call>`` block (an object, or a list when parallel)."""
    return json.loads(message["content"].removeprefix("<tool_call>").removesuffix("</tool_call>"))


def test_wrong_tool_demonstrations_call_a_distractor_at_the_asked_rate():
    """wrong_tool_demonstrations=0.4 over 500 single-call demonstrations: each demonstration is wrong with
    probability 0.4 (an independent draw), so the wrong count is Binomial(500, 0.4): mean 200, sd
    sqrt(500 * 0.4 * 0.6) = 10.95; 160..240 is +-3.65 sd. A wrong one keeps the row's prompt and tools and
    calls one of the row's distractors (never a gold tool), then summarises that tool's response; a right one
    is the gold conversation. p=0 leaves the demonstrations exactly as before."""
    kwargs = dict(num_train=200, num_test=60, subsets="single")
    noisy = ToolCallTask(**kwargs, wrong_tool_demonstrations=0.4)
    clean = list(ToolCallTask(**kwargs).demonstration_rows(500, seed=0))
    wrong = 0
    for (row, demo), (clean_row, clean_demo) in zip(noisy.demonstration_rows(500, seed=0), clean):
        assert row == clean_row  # the questions are the same draw; only the replies differ
        gold = normalize_gold_calls(row["gold_tool_calls"])[0][0]
        call = _call_json(demo["messages"][1])
        assert demo["messages"][0] == row["prompt"][0] and [m["role"] for m in demo["messages"]] == [
            "user", "assistant", "tool", "assistant"]
        assert [t["function"]["name"] for t in demo["tools"]] == row["allowed_tools"]
        if call["name"] == gold["name"]:
            assert demo == clean_demo
            continue
        wrong += 1
        assert call["name"] in row["allowed_tools"]
        response = ToolSimulator().respond(call)
        assert demo["messages"][2]["content"] == response
        assert demo["messages"][3]["content"] == fact(call["name"], call["arguments"], response)
    assert 160 <= wrong <= 240
    assert [d for _, d in ToolCallTask(**kwargs, wrong_tool_demonstrations=0.0).demonstration_rows(50, seed=0)] == [
        d for _, d in clean[:50]]


def test_wrong_tool_demonstrations_on_chains_go_wrong_at_one_uniform_step():
    """Chains have 2 or 3 steps and, with max_distractors=1, exactly one distractor per prompt. At p = 0.6 over
    600 demonstrations a wrong one keeps the gold steps before its wrong step k, then calls the distractor with
    its simulator response, and summarises every call made (one fact each); nothing follows the wrong call.
    k is uniform over the steps: among the m wrong 3-step demonstrations each k is Binomial(m, 1/3), sd
    sqrt(2m/9), so each count lies within m/3 +- 4 sd (and likewise m/2 +- 4 sqrt(m/4) for 2-step ones).
    The wrong count is Binomial(600, 0.6): mean 360, sd 12; 312..408 is +-4 sd. The wrong call is the gold
    call of some `single` question of the distractor (its values are borrowed, not the row's); p=0 stays the
    gold stream."""
    kwargs = dict(num_train=120, num_test=30, subsets={"chain": 1.0}, max_distractors=1, max_turns=4)
    task = ToolCallTask(**kwargs, wrong_tool_demonstrations=0.6)
    noisy = list(task.demonstration_rows(600, seed=0))
    clean = list(ToolCallTask(**kwargs).demonstration_rows(600, seed=0))
    singles = {json.dumps(step[0], sort_keys=True)
               for t in TEMPLATES if t.subset == "single"
               for values in itertools.product(*(VOCAB[v] for _, v in t.slots)) if t.valid(values)
               for step in normalize_gold_calls(task.synthetic_row((t.id, values))["gold_tool_calls"])}
    sim, wrong_at = ToolSimulator(), {2: Counter(), 3: Counter()}
    for (row, demo), (clean_row, clean_demo) in zip(noisy, clean):
        assert row == clean_row
        assert clean_demo == gold_conversation(row, sim)
        if demo == clean_demo:
            continue
        gold = normalize_gold_calls(row["gold_tool_calls"])
        (distractor,) = set(row["allowed_tools"]) - {c["name"] for step in gold for c in step}
        turns = demo["messages"][len(row["prompt"]):]
        calls = [_call_json(m) for m in turns[:-1:2]]
        k = len(calls) - 1
        assert [m["role"] for m in turns] == ["assistant", "tool"] * (k + 1) + ["assistant"]
        assert calls[:k] == [{"name": s[0]["name"], "arguments": s[0]["arguments"]} for s in gold[:k]]
        assert calls[k]["name"] == distractor and json.dumps(calls[k], sort_keys=True) in singles
        responses = [m["content"] for m in turns[1::2]]
        assert responses == [sim.respond(c) for c in calls]
        assert turns[-1]["content"] == " ".join(fact(c["name"], c["arguments"], r) for c, r in zip(calls, responses))
        assert demo["tools"] == clean_demo["tools"]
        wrong_at[len(gold)][k] += 1
    assert 312 <= sum(map(sum, (c.values() for c in wrong_at.values()))) <= 408
    for n, counts in wrong_at.items():
        m = sum(counts.values())
        assert set(counts) == set(range(n)) and m > 50
        assert all(abs(counts[k] - m / n) <= 4 * (m * (1 / n) * (1 - 1 / n)) ** 0.5 for k in range(n)), counts


def test_a_wrong_parallel_step_becomes_one_distractor_call():
    """A parallel question has one step of two calls; its wrong demonstration replaces that step with one call
    of a distractor (a JSON object, not a list), its response and its fact; the right ones are gold."""
    kwargs = dict(num_train=60, num_test=20, subsets="parallel", max_distractors=1)
    noisy = ToolCallTask(**kwargs, wrong_tool_demonstrations=0.5).demonstration_rows(100, seed=0)
    wrong = 0
    for (row, demo), (_, clean_demo) in zip(noisy, ToolCallTask(**kwargs).demonstration_rows(100, seed=0)):
        if demo == clean_demo:
            continue
        wrong += 1
        call = _call_json(demo["messages"][1])
        gold_names = {c["name"] for c in normalize_gold_calls(row["gold_tool_calls"])[0]}
        assert isinstance(call, dict) and call["name"] in set(row["allowed_tools"]) - gold_names
        assert [m["role"] for m in demo["messages"]] == ["user", "assistant", "tool", "assistant"]
        assert demo["messages"][3]["content"] == fact(call["name"], call["arguments"], demo["messages"][2]["content"])
    assert 30 <= wrong <= 70  # Binomial(100, 0.5): mean 50, sd 5, +-4 sd


def test_wrong_tool_demonstrations_need_synthetic_questions(tmp_path):
    with pytest.raises(ValueError, match=r"task\.wrong_tool_demonstrations=0\.5: parquet"):
        ToolCallTask(parquet_path=tmp_path / "rows.parquet", wrong_tool_demonstrations=0.5)


def test_the_noisy_demonstrator_enters_the_sft_cache_key_only_when_on():
    """p = 0 keeps the key it had before the demonstrator existed (no new field); p > 0 keys the
    demonstrator's version, so a warm start from an earlier wrong-demonstration recipe is not reused."""
    from lit_credit.models.embedded import _task_identity

    kwargs = dict(num_train=20, num_test=5, subsets="single")
    assert "wrong_demonstrator_version" not in _task_identity(ToolCallTask(**kwargs))
    assert _task_identity(ToolCallTask(**kwargs, wrong_tool_demonstrations=0.5))["wrong_demonstrator_version"] == 2


@pytest.mark.parametrize("value", [-0.1, 1.0, True])
def test_wrong_tool_demonstrations_outside_a_fraction_is_refused(value):
    with pytest.raises(ValueError, match=r"task\.wrong_tool_demonstrations"):
        ToolCallTask(subsets="single", wrong_tool_demonstrations=value)


def test_wrong_tool_demonstrations_with_every_distractor_question_held_out_raise():
    """values_per_slot=2 leaves 52 single questions, 44 distinct in content, and num_test = 44 holds out all of
    them, so a wrong demonstration finds no question of any distractor tool to borrow: a named error, not a
    hang."""
    task = ToolCallTask(num_train=0, num_test=44, subsets="single", values_per_slot=2, wrong_tool_demonstrations=0.5)
    assert task.num_questions("single") == 52 and task.num_contents("single") == 44
    row = task.dataset("test")[0]
    with pytest.raises(ValueError, match=r"task\.wrong_tool_demonstrations: every single question"):
        task.wrong_tool_demonstration(row, random.Random(0))
