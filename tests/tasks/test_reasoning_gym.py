"""task=reasoning_gym against the real reasoning-gym package: rows are the package's entries, the held-out split
is disjoint in content, the reward is the dataset's own score_answer, a weighted mix is the package's composite,
revise mode feeds the verdict back, nothing is fetched, and two steps run through the entry point."""
from __future__ import annotations

import json
import socket
from collections import Counter

import pytest

rg = pytest.importorskip("reasoning_gym")

from hydra.utils import instantiate  # noqa: E402
from reasoning_gym.composite import DatasetSpec  # noqa: E402

from lit_credit.tasks import ReasoningGymTask  # noqa: E402
from lit_credit.tasks.reasoning_gym import (  # noqa: E402
    CORRECT,
    NO_ANSWER,
    ReasoningGymReward,
    content_key,
    entry_of,
    extract,
    score,
    verdict,
)
from lit_credit.tasks.revise import RevisionEnvironment  # noqa: E402

# Datasets of several families (arithmetic, algorithmic strings, counting, logic) the tests draw from.
SOME = ["basic_arithmetic", "chain_sum", "spell_backward", "leg_counting", "letter_counting", "word_sorting",
        "gcd", "number_sorting"]


@pytest.fixture
def no_network(monkeypatch):
    """Any connection attempt fails the test: reasoning-gym is procedural, nothing may be fetched."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def package_entry(row):
    """The entry as the package builds it from the row's name, config and index."""
    return rg.create_dataset(row["dataset"], **json.loads(row["config"]))[row["index"]]


# ------------------------------------------------------------------------------------------------ rows
def test_rows_are_the_packages_entries_in_plain_columns(no_network):
    task = ReasoningGymTask(["basic_arithmetic"], num_train=40, num_test=10, size=100, seed=3)
    test, train = task.dataset("test"), task.dataset("train")
    assert set(test.column_names) == {"prompt", "answer", "id", "dataset", "index", "config"}
    assert (len(test), len(train)) == (10, 40)
    direct = rg.create_dataset("basic_arithmetic", seed=3 + 1, size=100)  # the composite's seed rule: seed + i + 1
    for row in [*test, *train]:
        entry = package_entry(row)
        assert row["prompt"] == [{"role": "user", "content": entry["question"]}]
        assert row["answer"] == entry["answer"] and entry_of(row) == entry
        if row["id"].split("/")[1] == "3":  # the first composite of the draw is the package's dataset itself
            assert direct[row["index"]] == entry
    # deterministic, and the test split does not depend on num_train
    again = ReasoningGymTask(["basic_arithmetic"], num_train=5, num_test=10, size=100, seed=3)
    assert again.dataset("test")["id"] == test["id"]
    assert ReasoningGymTask(["basic_arithmetic"], num_train=5, num_test=10, seed=4).dataset("test")["id"] != test["id"]


def test_the_draw_walks_on_past_one_datasets_size():
    task = ReasoningGymTask(["basic_arithmetic"], num_train=60, num_test=10, size=25, seed=0)
    rows = [*task.dataset("test"), *task.dataset("train")]
    assert len({r["id"].split("/")[1] for r in rows}) >= 3  # composites of seeds 0, 25, 50, ...
    for row in rows[::7]:
        assert entry_of(row) == package_entry(row)


def test_held_out_questions_never_train_nor_demonstrate():
    task = ReasoningGymTask([{"name": "leg_counting", "config": {"min_animals": 1, "max_animals": 2}}], num_train=150, num_test=30,
                            size=200)
    test, train = task.dataset("test"), task.dataset("train")
    held = {content_key(r) for r in test}
    assert len(held) == 30 and not held & {content_key(r) for r in train}
    assert len({content_key(r) for r in train}) == 150  # distinct problems
    demos = list(task.demonstrations(300, seed=1))
    assert len(demos) == 300
    assert not held & {content_key({"prompt": [d["messages"][-2]]}) for d in demos}
    for demo in demos[:20]:  # the gold answer of each demonstration scores 1 with the package
        assert demo["messages"][-1]["content"] != ""
    with pytest.raises(ValueError, match=r"task\.num_train=.*task\.num_test=.*widen"):
        ReasoningGymTask([{"name": "basic_arithmetic", "config": {"min_terms": 2, "max_terms": 2, "max_digits": 1,
                                                                  "allow_negation": False}}],
                         num_train=5000, num_test=5).dataset("train")


# ------------------------------------------------------------------------------------------------ the score
@pytest.mark.parametrize("name", SOME)
def test_the_score_is_the_packages_score_answer(name, no_network):
    task = ReasoningGymTask([name], num_train=5, num_test=5, size=50)
    reward = ReasoningGymReward()
    for row in task.dataset("test"):
        entry, dataset = package_entry(row), rg.create_dataset(row["dataset"], **json.loads(row["config"]))
        good, bad = entry["answer"], "#"
        assert dataset.score_answer(good, entry) == 1.0 and dataset.score_answer(bad, entry) == 0.0
        assert score(row, good) == dataset.score_answer(good, entry) == 1.0
        assert score(row, f"thinking...\n<answer>{good}</answer>") == 1.0  # reasoning-gym's answer tags
        assert score(row, bad) == dataset.score_answer(bad, entry) == 0.0
        assert score(row, "") == dataset.score_answer(None, entry) == 0.0
        result = reward(row, [bad, good])  # the final reply decides
        assert result.score == 1.0 and result.parts == {"correct": 1.0, "answered": 1.0, "error": 0.0}
        assert reward(row, [good, bad]).score == 0.0


def test_partial_credit_is_the_packages_too():
    task = ReasoningGymTask(["spell_backward"], num_train=5, num_test=5, size=50)
    row = task.dataset("test")[0]
    entry, dataset = package_entry(row), rg.create_dataset(row["dataset"], **json.loads(row["config"]))
    near = entry["answer"] + "x"
    assert score(row, near) == dataset.score_answer(near, entry)


def test_extract_reads_the_last_answer_tags_else_the_reply():
    assert extract("a <answer>1</answer> b <answer> 2 </answer>") == "2"
    assert extract("  42 \n") == "42" and extract("   ") is None and extract("<answer></answer>") is None


def test_the_reward_scores_a_raising_scorer_zero_and_refuses_other_rows(monkeypatch):
    task = ReasoningGymTask(["basic_arithmetic"], num_train=5, num_test=5, size=50)
    row = task.dataset("test")[0]
    dataset = type(rg.create_dataset("basic_arithmetic", size=1))
    monkeypatch.setattr(dataset, "score_answer", lambda self, answer, entry: 1 / 0)
    result = ReasoningGymReward()(row, [row["answer"]])
    assert result.score == 0.0 and result.parts["error"] == 1.0
    arith_row = {"prompt": [{"role": "user", "content": "What is 1 + 2?"}], "answer": "3", "id": "1+2"}
    with pytest.raises(ValueError, match="task=reasoning_gym"):
        ReasoningGymReward()(arith_row, ["3"])


def test_a_row_whose_entry_changed_is_refused():
    row = dict(ReasoningGymTask(["basic_arithmetic"], num_train=5, num_test=5, size=50).dataset("test")[0])
    row["prompt"] = [{"role": "user", "content": "Calculate something else."}]
    with pytest.raises(RuntimeError, match="no longer asks"):
        score(row, "1")


# ------------------------------------------------------------------------------------------------ a weighted mix
MIX = [{"name": "chain_sum", "weight": 3, "config": {"max_terms": 3}}, {"name": "leg_counting", "weight": 1}]


def test_a_weighted_mix_is_the_packages_composite():
    task = ReasoningGymTask(MIX, num_train=700, num_test=100, size=1000, seed=0)
    rows = [*task.dataset("test"), *task.dataset("train")]
    counts = Counter(r["dataset"] for r in rows)
    assert counts["chain_sum"] / len(rows) == pytest.approx(0.75, abs=0.04)
    # every row is the package composite's own entry at its index (its weighted choice, its sub-dataset)
    specs = [DatasetSpec("chain_sum", 3, {"max_terms": 3, "seed": 1, "size": 1000}),
             DatasetSpec("leg_counting", 1, {"seed": 2, "size": 1000})]
    composite = rg.create_dataset("composite", size=1000, seed=0, datasets=specs)
    for row in rows[::25]:
        entry = composite[row["index"]]
        assert entry["metadata"]["source_dataset"] == row["dataset"] and entry["question"] == entry_of(row)["question"]
        assert score(row, entry["answer"]) == composite.score_answer(entry["answer"], entry) == 1.0


def test_datasets_from_hydra_and_their_mistakes(make_cfg):
    cfg = make_cfg("task=reasoning_gym", "task.datasets=[{name:chain_sum,weight:3,config:{max_terms:3}},leg_counting]",
                   "task.num_train=20", "task.num_test=5", fast_task=False)
    task = instantiate(cfg.task)
    assert task.specs == [{"name": "chain_sum", "weight": 3.0, "config": {"max_terms": 3}},
                          {"name": "leg_counting", "weight": 1.0, "config": {}}]
    assert len(task.dataset("train")) == 20


@pytest.mark.parametrize("datasets, match", [
    (["basic_arithmetc"], r"task\.datasets\[0\]\.name='basic_arithmetc'.*basic_arithmetic"),
    (["chain_sum", "chain_sum"], "names a dataset twice"),
    ([{"name": "chain_sum", "weight": 0}], r"task\.datasets\[0\]\.weight"),
    ([{"name": "chain_sum", "config": {"size": 10}}], r"task\.size"),
    ([{"name": "chain_sum", "config": {"no_such_field": 1}}], r"task\.datasets\[0\]\.config=.*refused it for chain_sum"),
    ([], "task.datasets"),
    (["composite"], "not a reasoning-gym dataset"),
])
def test_bad_datasets_name_the_key(datasets, match):
    with pytest.raises(ValueError, match=match):
        ReasoningGymTask(datasets, num_train=5, num_test=5).dataset("test")


# ------------------------------------------------------------------------------------------------ revise mode
def test_revise_mode_feeds_the_verdict_back():
    task = ReasoningGymTask(["basic_arithmetic"], num_train=5, num_test=5, size=50, revise=True, max_turns=3)
    env, row = task.environment(), task.dataset("test")[0]
    assert isinstance(env, RevisionEnvironment) and env.max_turns == 3
    assert ReasoningGymTask(["basic_arithmetic"], num_train=5, num_test=5).environment().max_turns == 1
    wrong = env.step(row, 0, "12345678")
    assert (wrong.done, wrong.score) == (False, 0.0)
    assert wrong.messages == [{"role": "user", "content": "Your answer scores 0 out of 1. Try again."}]
    assert env.step(row, 0, "").messages == [{"role": "user", "content": NO_ANSWER}]
    right = env.step(row, 1, row["answer"])
    assert (right.done, right.score, right.messages) == (True, 1.0, [])
    assert env.step(row, 2, "0").done  # the last turn ends it
    # the verdict's score is the package's; a partial score is said as such
    spell = ReasoningGymTask(["spell_backward"], num_train=5, num_test=5, size=50).dataset("test")[0]
    near = verdict(spell, package_entry(spell)["answer"] + "x")
    assert 0 < near.score < 1 and near.feedback == f"Your answer scores {near.score:.3g} out of 1. Try again."
    keep = ReasoningGymTask(["basic_arithmetic"], num_train=5, num_test=5, size=50, revise=True,
                            stop_on_success=False).environment()
    kept = keep.step(row, 0, row["answer"])
    assert (kept.done, kept.score, kept.messages) == (False, 1.0, [{"role": "user", "content": CORRECT}])


def test_revise_demonstrations_show_a_wrong_answer_its_verdict_and_the_fix():
    task = ReasoningGymTask(["basic_arithmetic"], num_train=20, num_test=10, size=100, revise=True, revise_frac=0.5)
    demos = list(task.demonstrations(200, seed=1))
    revised = [d["messages"] for d in demos if len(d["messages"]) == 4]
    assert 60 < len(revised) < 140 and all(len(d["messages"]) in (2, 4) for d in demos)
    for _user, wrong, feedback, right in revised[:10]:
        assert feedback["content"].startswith("Your answer scores") and wrong["content"] != right["content"]
    keep = ReasoningGymTask(["basic_arithmetic"], num_train=20, num_test=10, size=100, revise=True,
                            stop_on_success=False, max_turns=3)
    for demo in keep.demonstrations(30, seed=1):
        assert sum(m["role"] == "assistant" for m in demo["messages"]) == 3
    assert "Your answer scores" in "".join(task.corpus(20))  # the tokenizer sees the verifier's words
    assert ReasoningGymTask(["basic_arithmetic"], num_train=5, num_test=5).revise is False


def test_a_system_prompt_asks_for_answer_tags_and_the_demonstrations_use_them():
    task = ReasoningGymTask(["basic_arithmetic"], num_train=5, num_test=5, size=50, system_prompt="direct")
    row = task.dataset("test")[0]
    assert row["prompt"][0]["role"] == "system" and "<answer>" in row["prompt"][0]["content"]
    demo = next(iter(task.demonstrations(1, seed=0)))["messages"]
    assert demo[-1]["content"].startswith("<answer>") and demo[0] == row["prompt"][0]


# ------------------------------------------------------------------------------------------------ entry point
def test_the_task_conf_composes_with_its_reward(make_cfg):
    cfg = make_cfg("task=reasoning_gym", "reward=reasoning_gym", fast_task=False)
    assert isinstance(instantiate(cfg.reward), ReasoningGymReward) and isinstance(instantiate(cfg.task), ReasoningGymTask)
    assert list(cfg.task.datasets) == ["basic_arithmetic"] and cfg.task.revise is False


@pytest.mark.slow
@pytest.mark.parametrize("revise", [False, True])
def test_two_steps_through_the_entry_point(make_cfg, revise, no_network):
    from lit_credit.train import train

    extra = ["task.revise=true", "method=tcpo", "reward=reasoning_gym"] if revise else ["reward=reasoning_gym"]
    cfg = make_cfg("task=reasoning_gym", "task.datasets=[basic_arithmetic]", "trainer.max_steps=2",
                   "task.num_train=200", "task.num_test=8", "data.prompts_per_step=2", "data.val_prompts=4",
                   "data.sampling.n=2", *extra, fast_task=False)
    metrics = train(cfg)
    assert metrics["train/reward/answered"] >= 0.0  # reward=reasoning_gym's part
    if revise:
        assert metrics["train/reward/turns"] >= 1.0 and "train/pass@turn1" in metrics, sorted(metrics)
