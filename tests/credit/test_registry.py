"""Estimator registry: names, errors, and that every registered class builds and runs from config."""

import pytest
import torch

from lit_credit import credit
from lit_credit.credit import CreditEstimator, available, get, register, registry
from lit_credit.types import CreditOutput, RolloutBatch

from .common import make_batch


def toy_batch() -> RolloutBatch:
    """Two groups of two rollouts, two turns each, with every field some estimator reads.

    Tokens: [prompt, turn 0 (tool call), tool response, turn 1 (summary), pad] -> mask [0, 1, 0, 1, 0].
    """
    B, nan = 4, float("nan")
    mask = torch.tensor([[0, 1, 0, 1, 0]] * B, dtype=torch.float32)
    turn_ids = torch.tensor([[-1, 0, -1, 1, -1]] * B)
    turn_scores = torch.tensor([[0.0, 1.0], [0.5, 0.5], [1.0, 1.0], [0.0, 0.0]])
    return make_batch(
        mask,
        torch.tensor([3, 3, 8, 8]),
        torch.tensor([1.0, 0.5, 1.0, 0.0]),
        turn_ids=turn_ids,
        reward_parts={
            "process": torch.tensor([0.8, 0.4, 0.2, 0.6]),
            "summary": torch.tensor([0.9, 0.5, 0.1, 0.3]),
            "solved": torch.tensor([1.0, 0.0, 0.0, 0.0]),  # ToolPO's (credit=toolpo)
            "toolpo_correct_ratio": torch.tensor([1.0, 0.5, 0.0, 1.0]),
        },
        turn_parts={
            "tool_scores": torch.tensor([[0.8, 0.0], [0.4, 0.0], [0.2, 0.0], [0.6, 0.0]]),  # turn 0 is a tool turn
            "tool_turn_mask": torch.tensor([[1.0, 0.0]] * B),
        },
        extras={  # TCPO's counterfactuals: two alternatives of turn 0 of each rollout, none of turn 1
            "alt_scores": torch.tensor([[[0.5, 1.0], [nan, nan]]] * B),
            "cf_mask": torch.tensor([[True, False]] * B),
        },
        turn_scores=turn_scores,
        turn_mask=torch.ones(B, 2, dtype=torch.bool),
    )


def test_available_is_sorted_and_has_the_estimators():
    names = available()
    assert names == sorted(names)
    assert {"grpo", "dr_grpo"} <= set(names)


def test_get_returns_the_class():
    assert get("grpo") is credit.GRPOCredit
    assert get("dr_grpo") is credit.DrGRPOCredit


def test_get_miss_lists_valid_names():
    with pytest.raises(KeyError) as err:
        get("grpoo")
    assert "'grpoo'" in str(err.value) and ", ".join(available()) in str(err.value)


def test_register_twice_raises_naming_it():
    with pytest.raises(ValueError, match="'grpo'"):
        register("grpo")(credit.GRPOCredit)


def test_register_new_name(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", {})

    @register("const")
    class Const(CreditEstimator):
        def __call__(self, batch):
            return CreditOutput(batch.response_mask.clone())

    assert available() == ["const"] and get("const") is Const
    assert repr(Const()) == "Const()"


@pytest.mark.parametrize("name", available())
def test_every_estimator_builds_with_defaults_and_runs(name):
    batch = toy_batch()
    out = get(name)()(batch)
    assert isinstance(out, CreditOutput)
    assert out.advantages.shape == batch.response_mask.shape
    assert torch.isfinite(out.advantages).all()
    assert (out.advantages[batch.response_mask == 0] == 0).all()
    assert all(isinstance(v, float) for v in out.metrics.values())


@pytest.mark.parametrize("name", available())
def test_hydra_and_lightning_cli_build_the_same_object(name):
    from hydra.utils import instantiate
    from jsonargparse import ArgumentParser

    cls = get(name)
    path = f"{cls.__module__}.{cls.__qualname__}"
    by_hydra = instantiate({"_target_": path})
    parser = ArgumentParser()
    parser.add_argument("--credit", type=CreditEstimator)
    cfg = parser.parse_object({"credit": {"class_path": path}})
    by_cli = parser.instantiate_classes(cfg).credit
    assert type(by_hydra) is type(by_cli) is cls and vars(by_hydra) == vars(by_cli)
