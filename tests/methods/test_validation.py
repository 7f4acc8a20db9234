"""Held-out validation of the comparison protocol: greedy and sampled (``data.val_samples``), pass@k by hand,
sampled validation isolated from the training RNG (training bitwise unchanged), and DPA-GRPO's sampled
proposals."""
from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from lit_credit.analysis.compare import run_scalars
from lit_credit.analysis.metrics import pass_at_k, pass_at_k_metrics
from lit_credit.train import build
from tests.conftest import FAST_MODEL, FAST_TASK, compose_train
from tests.credit.common import make_batch
from tests.methods.test_dpa_module import SMALL as DPA_SMALL
from tests.methods.test_dpa_module import ScriptedEngine

# 8 prompts x 4 samples at lr 1e-3: some rollouts score, so the updates move the policy.
RUN = ["trainer.max_steps=2", "trainer.val_check_interval=1", "data.prompts_per_step=8", "data.sampling.n=4",
       "method.optimizer.lr=1e-3", "data.val_prompts=8", "callbacks=none", "validate_first=true"]


def test_pass_at_k_by_hand():
    # n = 4 samples; pass@k = 1 - C(4 - c, k) / C(4, k).
    # c = 0: C(4, k) / C(4, k) = 1 -> pass@k = 0 for every k.
    # c = 1: k=1: 1 - C(3,1)/C(4,1) = 1 - 3/4 = 1/4; k=2: 1 - 3/6 = 1/2; k=3: 1 - 1/4 = 3/4; k=4: 1 - 0/1 = 1.
    # c = 2: k=1: 1 - 2/4 = 1/2; k=2: 1 - C(2,2)/C(4,2) = 1 - 1/6 = 5/6; k=3: C(2,3) = 0 -> 1; k=4: 1.
    # c = 4: C(0, k) = 0 for k >= 1 -> 1 everywhere.
    got = pass_at_k(torch.tensor([0, 1, 2, 4]), 4)
    hand = torch.tensor([[0, 0, 0, 0], [1 / 4, 1 / 2, 3 / 4, 1], [1 / 2, 5 / 6, 1, 1], [1, 1, 1, 1]], dtype=torch.float64)
    assert torch.allclose(got, hand, atol=1e-12)
    # The product form equals the binomial form for every (n, c, k) up to n = 9.
    for n in range(1, 10):
        table = pass_at_k(torch.arange(n + 1), n)
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert table[c, k - 1].item() == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_k_metrics_normalise_the_score_and_average_over_prompts():
    # HierR-like weights: score_scale = w_process + w_summary = 2, so normalised scores are score / 2:
    # group 0: [1, 0.5, 1] -> c = 2 at success 1.0; group 1: [0.25, 0.25, 0.95] -> c = 0 (1 at success 0.9).
    batch = make_batch(torch.ones(6, 2), torch.tensor([3, 3, 3, 7, 7, 7]), torch.tensor([2.0, 1.0, 2.0, 0.5, 0.5, 1.9]),
                       reward_weights={"process": 1.0, "summary": 1.0})
    # success 1.0: pass@1 = (2/3 + 0) / 2 = 1/3; pass@2 = (1 - C(1,2)/C(3,2) + 0) / 2 = 1/2; pass@3 = 1/2.
    assert pass_at_k_metrics(batch, 1.0, "val/sampled") == pytest.approx(
        {"val/sampled/pass@1": 1 / 3, "val/sampled/pass@2": 1 / 2, "val/sampled/pass@3": 1 / 2})
    # success 0.9: group 1 has c = 1: pass@1 = (2/3 + 1/3) / 2 = 1/2; pass@2 = (1 + 1 - C(2,2)/C(3,2)) / 2
    # = (1 + 2/3) / 2 = 5/6; pass@3 = 1.
    assert pass_at_k_metrics(batch, 0.9, "s") == pytest.approx({"s/pass@1": 1 / 2, "s/pass@2": 5 / 6, "s/pass@3": 1.0})
    uneven = make_batch(torch.ones(3, 2), torch.tensor([0, 0, 1]), torch.tensor([1.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match="n rollouts per prompt"):
        pass_at_k_metrics(uneven, 1.0, "val/sampled")


def test_bad_val_samples_names_the_key(tmp_path, cache_dir):
    cfg = compose_train([*FAST_TASK, *FAST_MODEL, "data.val_samples=-1"], tmp_path / "run", cache_dir)
    with pytest.raises(Exception, match=r"data.val_samples=-1: must be >= 0"):
        build(cfg)


def _run(tmp_path, cache_dir, name, *overrides):
    """A 2-step GRPO run on the tiny model with a validation before and after each step (as lit_credit.train):
    (its TensorBoard scalars, its final policy weights)."""
    cfg = compose_train([*FAST_TASK, *FAST_MODEL, *RUN, *overrides], tmp_path / name, cache_dir)
    module, datamodule, trainer = build(cfg)
    trainer.validate(module, datamodule=datamodule, verbose=False)
    trainer.fit(module, datamodule=datamodule)
    return run_scalars(tmp_path / name), {k: v.clone() for k, v in module.policy.state_dict().items()}


def test_sampled_validation_leaves_training_bitwise_unchanged(tmp_path, cache_dir):
    plain, plain_weights = _run(tmp_path, cache_dir, "greedy", "data.val_samples=0")
    sampled, sampled_weights = _run(tmp_path, cache_dir, "sampled", "data.val_samples=4")
    # Every training-side scalar (rewards, losses, KL, credit, grad norm, entropy) and the greedy validation
    # are exactly equal; only wall-clock rates differ.
    keys = {t for t in plain if not t.startswith("perf/")}
    assert {"train/reward/mean", "loss/total", "train/grad_norm", "val/reward/mean"} <= keys
    assert keys == {t for t in sampled if not t.startswith(("perf/", "val/sampled/"))}
    for tag in sorted(keys):
        assert plain[tag] == sampled[tag], tag
    assert all(torch.equal(plain_weights[k], sampled_weights[k]) for k in plain_weights)
    assert max(plain["train/reward/mean"].values()) > 0  # a learning signal: the updates did move the policy
    # The sampled validation ran with every greedy one, with the batch metrics and pass@1..4 (monotone in k).
    assert not any(t.startswith("val/sampled/") for t in plain)
    assert sorted(sampled["val/sampled/reward/mean"]) == sorted(plain["val/reward/mean"]) and len(plain["val/reward/mean"]) >= 2
    assert "val/sampled/zero_variance_groups" in sampled and "val/sampled/pass@5" not in sampled
    for step in sampled["val/sampled/reward/mean"]:
        curve = [sampled[f"val/sampled/pass@{k}"][step] for k in range(1, 5)]
        assert all(0 <= a <= b <= 1 for a, b in itertools.pairwise(curve))
        # exact_match scores are 0 / 1 and val_success = 1: pass@1 is the sampled mean reward
        assert curve[0] == pytest.approx(sampled["val/sampled/reward/mean"][step], abs=1e-6)


def test_sampled_validation_is_reproducible_and_restores_every_random_state(tmp_path, cache_dir):
    cfg = compose_train([*FAST_TASK, *FAST_MODEL, *RUN, "data.val_samples=3"], tmp_path / "run", cache_dir)
    module, datamodule, _trainer = build(cfg)
    datamodule.setup("validate")
    experience = datamodule.experience
    experience.bind(module.policy, module.tokenizer)
    rows = list(datamodule.val_set)
    torch.manual_seed(123)
    random.seed(5)
    before = (torch.get_rng_state(), random.getstate(), experience.next_group)
    first = experience.sampled_validation(rows)
    assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]
    assert experience.next_group == before[2]  # group ids 0..P-1, the training counter untouched
    torch.manual_seed(999)  # whatever the training RNG holds, the samples are the same (seeded with data.seed)
    again = experience.sampled_validation(rows)
    assert len(first) == 3 * len(rows) and first.group_ids.tolist() == [g for g in range(len(rows)) for _ in range(3)]
    assert torch.equal(first.input_ids, again.input_ids) and torch.equal(first.scores, again.scores)
    assert experience.val_sampled.temperature == 1.0 and not experience.val_sampled.greedy


def test_dpa_validation_samples_the_proposals(tmp_path, cache_dir):
    cfg = compose_train([*FAST_MODEL, *DPA_SMALL, "data.val_samples=2"], tmp_path / "run", cache_dir)
    module, datamodule, trainer = build(cfg)
    datamodule.setup("fit")
    datamodule.experience.engine = ScriptedEngine([*datamodule.train_set, *datamodule.val_set])
    trainer.fit(module, datamodule=datamodule)
    trainer.limit_val_batches = 1.0  # the training run skipped validation
    metrics = trainer.validate(module, datamodule=datamodule, verbose=False)[0]
    # The script proposes [gold, gold + 1] per line: with 2 samples one is right (strict 1) and one wrong (0),
    # so c = 1 of n = 2 on every line: pass@1 = 1/2, pass@2 = 1 - C(1,2)/C(2,2) = 1; mean reward 1/2.
    assert metrics["val/sampled/pass@1"] == pytest.approx(0.5)
    assert metrics["val/sampled/pass@2"] == pytest.approx(1.0)
    assert metrics["val/sampled/reward/mean"] == pytest.approx(0.5)
    assert metrics["val/sampled/zero_variance_groups"] == pytest.approx(0.0)
    # The game is played on the greedy proposals only (gold first: every line ends right).
    assert metrics["val/final/strict"] == pytest.approx(1.0)
    assert not any(k.startswith(("val/sampled/final", "val/sampled/dpa")) for k in metrics)
    assert [role for role, _ in datamodule.experience.engine.calls[-len(datamodule.val_set):]] == ["proposer"] * len(
        datamodule.val_set)
