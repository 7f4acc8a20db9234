"""task=bfcl task.categories=[multi_turn_base]: BFCL v4's multi-turn base category as a stateful environment over the
wheel's own backends, each user turn scored by the wheel's own checks.

The verdicts are compared with BFCL's own ``multi_turn_checker`` (imported from the wheel: it imports no API client)
on the same calls: the ground truth replayed passes every turn in both, and perturbed calls fail the same turns with
the same error type.
"""
from __future__ import annotations

import copy
import json
import subprocess
import sys
import uuid

import pytest

pytest.importorskip("bfcl_eval")

from lit_credit.interfaces import fork, resume
from lit_credit.rewards.bfcl import BFCLMultiTurnReward
from lit_credit.tasks import bfcl_multi_turn as mt
from lit_credit.tasks.bfcl import BFCLTask, content_key, load_category, multi_turn_row
from lit_credit.tasks.tool_catalog import dumps
from lit_credit.types import state_hash

CATEGORY = "multi_turn_base"


@pytest.fixture(scope="module")
def rows():
    return [multi_turn_row(e, CATEGORY) for e in load_category(CATEGORY)]


@pytest.fixture(scope="module")
def bfcl_checker():
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker
    return multi_turn_checker


def env(**kw) -> mt.BFCLMultiTurnEnvironment:
    return mt.BFCLMultiTurnEnvironment(**{"user_turns": 7, "max_response_chars": None, **kw})


def call_reply(*calls) -> str:
    return "".join(f'<tool_call>{dumps({"name": n, "arguments": a})}</tool_call>' for n, a in calls)


def call_string(call) -> str:
    """A call as BFCL's handlers decode a tool call for execution: ``name(k=repr(v), ...)``."""
    return f"{call['name']}({','.join(f'{k}={v!r}' for k, v in call['arguments'].items())})"


def bfcl_says(checker, row, episode) -> list[bool]:
    """BFCL's own verdict on the calls the episode made, for each prefix of user turns: whether
    ``multi_turn_checker`` passes turns 0..k (a fresh model name each time: the checker caches instances in the
    globals of its module by model name and entry id)."""
    entry = {"id": row["id"], "initial_config": json.loads(row["initial_config"]),
             "involved_classes": list(row["involved_classes"])}
    truth = json.loads(row["bfcl_ground_truth"])
    decoded = [[[call_string(c) for c in step] for step in turn] for turn in episode.calls]
    decoded += [[] for _ in range(len(truth) - len(decoded))]
    out = []
    for k in range(len(truth)):
        result = checker(decoded[: k + 1], truth[: k + 1], entry, CATEGORY, f"lc_{uuid.uuid4().hex}")
        out.append((bool(result["valid"]), result.get("error_type", "")))
    return out


def prefix_verdicts(episode, n) -> list[tuple[bool, str]]:
    """Ours in the same form: turns 0..k pass when each of them passed; the error type of the first failure."""
    out, first = [], ""
    verdicts = episode.verdicts + [{"valid": False, "error_type": "not reached"}] * (n - len(episode.verdicts))
    for k in range(n):
        if not first and not verdicts[k]["valid"]:
            first = verdicts[k]["error_type"]
        out.append((not first, first))
    return out


def play(row, replies, **kw):
    episode, feedbacks = mt.replay(row, env(**kw), replies)
    return episode, feedbacks


# ------------------------------------------------------------------------------------------------ the wheel
def test_backends_and_checkers_import_without_api_clients():
    code = ("import sys; from lit_credit.tasks.bfcl_multi_turn import checkers, make_instances, backend_config; "
            "checkers(); paths, docs, stateless = backend_config(); make_instances(list(docs)[:8], {}); "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('openai', 'anthropic', 'tree_sitter', 'mistralai', "
            "'google', 'cohere', 'boto3')]; print(bad); assert not bad, bad")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


# ------------------------------------------------------------------------------------------------ rows
def test_rows_split_and_demonstrations(rows):
    row = rows[0]
    assert row["prompt"] == json.loads(row["bfcl_turns"])[0]
    docs = mt.function_docs(mt_data_dir(), row["involved_classes"])
    assert row["allowed_tools"] == [d["name"] for d in docs]
    tools = json.loads(row["tools"])
    assert [t["function"]["name"] for t in tools] == row["allowed_tools"]
    assert all(t["function"]["description"].endswith("Python 3 syntax.") for t in tools)
    assert all(t["function"]["parameters"]["type"] == "object" for t in tools)

    task = BFCLTask([CATEGORY], num_test=20, seed=1)
    train, test = task.dataset("train"), task.dataset("test")
    assert len(test) == 20 and len(train) == len(rows) - 20
    assert {content_key(r) for r in train}.isdisjoint({content_key(r) for r in test})
    env_ = task.environment()
    assert isinstance(env_, mt.BFCLMultiTurnEnvironment) and env_.max_turns == 7 * 21
    held = {content_key(r) for r in test}
    by_question = {r["question"]: r for r in train}
    for demo in task.demonstrations(30, seed=0):
        users = [m for m in demo["messages"] if m["role"] == "user"]
        row = by_question[users[0]["content"]]
        assert content_key(row) not in held
        # the ground truth's calls as tool calls, the executed results as tool messages, "Done." per user turn
        assistant = [m["content"] for m in demo["messages"] if m["role"] == "assistant"]
        assert assistant == mt.gold_replies(row)
        assert len(users) == len(json.loads(row["bfcl_turns"]))
        assert demo["messages"][-1] == {"role": "assistant", "content": mt.CLOSING_REPLY}


def mt_data_dir():
    from lit_credit.tasks.bfcl import data_dir
    return data_dir()


def test_ground_truth_calls_parse_with_positional_arguments(rows):
    row = next(r for r in rows if r["id"] == "multi_turn_base_0")
    steps = mt.gold_steps(row)
    assert steps[0][0] == {"name": "cd", "arguments": {"folder": "document"}}
    assert steps[2] == [{"name": "sort", "arguments": {"file_name": "final_report.pdf"}}]  # sort('final_report.pdf')


# ------------------------------------------------------------------------------------------------ BFCL's verdicts
def test_ground_truth_replay_passes_every_turn_as_bfcl_says(rows, bfcl_checker):
    """A scripted actor replaying the ground truth passes every user turn of every entry (turn scores 1, all_turns
    1), and BFCL's own checker passes the same calls."""
    reward = BFCLMultiTurnReward()
    for i, row in enumerate(rows):
        episode, feedbacks = play(row, mt.gold_replies(row))
        n = len(json.loads(row["bfcl_ground_truth"]))
        assert episode.passed == [True] * n and feedbacks[-1].done, (row["id"], episode.verdicts)
        scores = [f.score for f in feedbacks]
        assert [s for s in scores if s is not None] == [1.0] * n
        result = reward(row, mt.gold_replies(row), turn_scores=scores)
        assert result.score == 1.0 and result.parts["all_turns"] == 1.0
        if i % 4 == 0:  # BFCL's checker on a quarter of the entries (it re-executes every prefix)
            assert bfcl_says(bfcl_checker, row, episode)[-1] == (True, ""), row["id"]


def perturbations(row):
    """(kind, replies): per user turn k, the ground truth with turn k's last call dropped, its first string argument
    changed, or turn k answered without any call."""
    steps = mt.gold_steps(row)
    out = []
    for k, calls in enumerate(steps):
        if not calls:
            continue
        variants = {"drop_last": calls[:-1], "skip_turn": []}
        for j, c in enumerate(calls):
            strings = [a for a, v in c["arguments"].items() if isinstance(v, str)]
            if strings:
                changed = copy.deepcopy(calls)
                changed[j]["arguments"][strings[0]] += "_x"
                variants["wrong_value"] = changed
                break
        for kind, turn_calls in variants.items():
            plan = [*steps[:k], turn_calls, *steps[k + 1:]]
            replies = [r for t in plan for r in [*(call_reply((c["name"], c["arguments"])) for c in t), mt.CLOSING_REPLY]]
            out.append((f"{kind}@{k}", replies))
    return out


def test_wrong_calls_fail_the_turns_bfcl_fails(rows, bfcl_checker):
    """Per perturbation and per prefix of user turns, BFCL's checker passes turns 0..k exactly when every one of our
    turn scores 0..k is 1, and fails with the error type of our first failed turn."""
    seen = set()
    for row in rows[::25]:
        for kind, replies in perturbations(row):
            episode, _ = play(row, replies)
            n = len(json.loads(row["bfcl_ground_truth"]))
            assert bfcl_says(bfcl_checker, row, episode) == prefix_verdicts(episode, n), (row["id"], kind)
            seen |= {v["error_type"] for v in episode.verdicts if not v["valid"]}
    assert {"multi_turn:empty_turn_model_response", "multi_turn:instance_state_mismatch",
            "multi_turn:execution_response_mismatch"} <= seen


def test_a_wrong_directory_fails_that_turn_only(rows, bfcl_checker):
    row = next(r for r in rows if r["id"] == "multi_turn_base_0")
    steps = mt.gold_steps(row)
    replies = mt.gold_replies(row)
    wrong = call_reply(("mkdir", {"dir_name": "tmp"}))  # turn 0: mkdir(dir_name='temp') in the ground truth
    replies[1] = wrong
    episode, feedbacks = play(row, replies)
    assert episode.verdicts[0] == {"valid": False, "error_type": "multi_turn:instance_state_mismatch"}
    assert feedbacks[len(steps[0])].score == 0.0  # the closing reply of turn 0 carries its score
    assert bfcl_says(bfcl_checker, row, episode)[0] == (False, "multi_turn:instance_state_mismatch")
    scores = [f.score for f in feedbacks]
    result = BFCLMultiTurnReward()(row, replies, turn_scores=scores)
    assert result.parts["all_turns"] == 0.0 and result.score == sum(episode.passed) / len(steps)


# ------------------------------------------------------------------------------------------------ episodes
def test_episodes_of_one_row_keep_separate_file_systems(rows):
    row = next(r for r in rows if r["id"] == "multi_turn_base_0")
    e = env()
    a, b = e.episode(row, 1), e.episode(row, 2)
    assert a.reset() == b.reset() == json.loads(row["bfcl_turns"])[0]
    assert a.state_key() == b.state_key()
    fb = a.step(call_reply(("cd", {"folder": "document"}), ("mkdir", {"dir_name": "temp"})))
    assert not fb.done and fb.score is None and [m["role"] for m in fb.messages] == ["tool", "tool"]
    assert json.loads(fb.messages[0]["content"]) == {"current_working_directory": "document"}
    fs_a, fs_b = a.instances["GorillaFileSystem"], b.instances["GorillaFileSystem"]
    assert "temp" in fs_a.root.contents["document"].contents
    assert "temp" not in fs_b.root.contents["document"].contents
    assert fs_a.root is not fs_b.root and a.state_key() != b.state_key()
    # b's own call sees b's file system
    fb = b.step(call_reply(("ls", {})))
    assert "temp" not in fb.messages[0]["content"] and "document" in fb.messages[0]["content"]
    # a clone goes on alone; the original stays
    c = fork(a)
    c.step(call_reply(("mv", {"source": "final_report.pdf", "destination": "temp"})))
    assert c.state_key() != a.state_key()
    assert "final_report.pdf" in fs_a.root.contents["document"].contents
    # replay reaches the same state (the contract's resume)
    again = resume(e, row, 1, [call_reply(("cd", {"folder": "document"}), ("mkdir", {"dir_name": "temp"}))])
    assert again.state_key() == a.state_key() and state_hash(again.state_key()) == state_hash(a.state_key())


def test_state_keys_change_when_a_call_changes_state(rows):
    row = next(r for r in rows if r["id"] == "multi_turn_base_0")
    episode = env().episode(row, 0)
    episode.reset()
    keys = [episode.state_key()]
    episode.step(call_reply(("ls", {})))  # reads only
    keys.append(episode.state_key())
    episode.step(call_reply(("cd", {"folder": "document"})))  # the current directory (private state) moves
    keys.append(episode.state_key())
    episode.step(call_reply(("mkdir", {"dir_name": "temp"})))
    keys.append(episode.state_key())
    episode.step(call_reply(("cd", {"folder": "nowhere"})))  # an error: nothing changes
    keys.append(episode.state_key())
    episode.step("Done.")  # the next user turn: same backends, another request
    keys.append(episode.state_key())
    assert keys[0] == keys[1] and keys[3] == keys[4]
    assert len({keys[1], keys[2], keys[3], keys[5]}) == 4
    assert keys[5][0] == 1 and keys[5][1] == keys[4][1]
    assert isinstance(keys[0], tuple) and repr(keys[0]) == repr(copy.deepcopy(keys[0]))


def test_step_limit_is_bfcl_force_quit(rows):
    row = next(r for r in rows if r["id"] == "multi_turn_base_0")
    episode, feedbacks = play(row, [call_reply(("ls", {}))] * 5, max_steps_per_turn=2)
    assert len(feedbacks) == 3 and feedbacks[-1].done and feedbacks[-1].score == 0.0
    assert episode.verdicts == [{"valid": False, "error_type": "multi_turn:force_terminated"}]
    result = BFCLMultiTurnReward()(row, ["x"] * 3, turn_scores=[f.score for f in feedbacks])
    assert result.score == 0.0 and result.parts["all_turns"] == 0.0 and result.parts["turns_ended"] == 0.25
    with pytest.raises(RuntimeError, match="ended"):
        episode.step("Done.")


def test_unknown_and_refused_calls_are_bfcl_errors(rows):
    row = next(r for r in rows if r["id"] == "multi_turn_base_0")
    episode = env().episode(row, 0)
    episode.reset()
    fb = episode.step(call_reply(("no_such_tool", {}), ("cd", {"folder": 3, "extra": 1})))
    assert fb.messages[0]["content"] == "Error during execution: name 'no_such_tool' is not defined"
    assert fb.messages[1]["content"].startswith("Error during execution:")
    assert mt.execute({}, "kill") == "Error during execution: Function call kill is not allowed."


def test_reward_counts_unfinished_turns_as_failed():
    row = {"id": "r", "bfcl_ground_truth": json.dumps([["a()"], ["b()"], []])}
    reward = BFCLMultiTurnReward()
    result = reward(row, ["x"] * 4, turn_scores=[None, 1.0, None, 0.0])  # cut after two of three user turns
    assert result.score == pytest.approx(1 / 3) and result.parts["all_turns"] == 0.0
    assert result.parts["turns_ended"] == pytest.approx(2 / 3)
    assert result.turns["bfcl_turn_end"] == [0.0, 1.0, 0.0, 1.0]
    assert reward(row, ["x"] * 3, turn_scores=[1.0, 1.0, 1.0]).parts["all_turns"] == 1.0
    with pytest.raises(ValueError, match="turn_scores"):
        reward(row, ["x"])


# ------------------------------------------------------------------------------------------------ entry point
@pytest.mark.slow
def test_two_steps_through_the_entry_point(make_cfg):
    from lit_credit.train import train

    cfg = make_cfg("task=bfcl", "task.categories=[multi_turn_base]", "task.num_test=4", "task.max_steps_per_turn=2",
                   "task.max_response_chars=120", "trainer.max_steps=2", "data.prompts_per_step=2",
                   "data.val_prompts=2", "data.sampling.n=2", "data.sampling.max_new_tokens=32", "data.max_turns=4",
                   "model.embedded.sft_steps=4", "model.embedded.sft_batch_size=4", "validate_first=false",
                   fast_task=False)
    assert cfg.reward._target_ == "lit_credit.rewards.bfcl.bfcl_reward"
    metrics = train(cfg)
    assert any("all_turns" in k for k in metrics), sorted(metrics)
