"""The arithmetic task (its verifier, reward=exact_match: tests/rewards/test_rewards_exact_match.py)."""
from __future__ import annotations

import pytest

from lit_credit.tasks import ArithTask


def test_splits_are_disjoint_deterministic_and_correct():
    task = ArithTask(max_operand=9, num_test=20, ops="+-*")
    train, test = task.dataset("train"), task.dataset("test")
    # 10 * 10 ordered pairs for -, 10 * 11 / 2 unordered ones for + and * (a + b is b + a): 210 problems
    assert len(test) == 20 and len(train) == 210 - 20
    assert not set(train["id"]) & set(test["id"])
    assert ArithTask(max_operand=9, num_test=20, ops="+-*").dataset("test")["id"] == test["id"]
    for row in test:
        a, op, b = row["prompt"][0]["content"].removeprefix("What is ").removesuffix("?").split()
        assert int(row["answer"]) == eval(f"{a}{op}{b}")
    demos = list(task.demonstrations(50, seed=1))
    assert len(demos) == 50 and not {d["messages"][0]["content"] for d in demos} & \
        {r["prompt"][0]["content"] for r in test}


@pytest.mark.parametrize("kwargs, key", [({"ops": "/"}, "task.ops"), ({"max_operand": 0}, "task.max_operand"),
                                         ({"max_operand": 3, "num_test": 40}, "task.num_train")])
def test_bad_configuration_names_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        ArithTask(**kwargs)
