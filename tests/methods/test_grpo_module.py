"""GRPOModule end to end on the embedded tiny policy: every loss variant, the update direction,
TensorBoard and checkpoint outputs, the stale-weights guard and the metric sets chosen in config."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from lit_credit.methods import GRPOModule
from lit_credit.methods.base import weights_hash
from lit_credit.models import token_logprobs
from lit_credit.rollout import HFEngine
from lit_credit.train import build, train
from scripts.tb_scalars import scalars
from tests.credit.common import make_batch

# Every GRPO-family baseline is GRPOModule with a credit, a loss and a dynamic-sampling setting.
METHODS = {"grpo": [], "dr_grpo": ["credit=dr_grpo", "loss=dr_grpo"],
           "dapo": ["loss=dapo", "method.dynamic_sampling=true"], "gspo": ["loss=gspo"]}


@pytest.mark.parametrize("method", METHODS)
def test_fast_dev_run_updates_the_policy(method, make_cfg):
    # 16 prompts x 4 samples: some group holds both right and wrong answers (seeded).
    module, datamodule, trainer = build(make_cfg("debug=fdr", *METHODS[method], "data.prompts_per_step=16",
                                                 "data.sampling.n=4"))
    assert type(module) is GRPOModule and module.dynamic_sampling == (method == "dapo")
    before = copy.deepcopy(module.policy.state_dict())
    trainer.fit(module, datamodule=datamodule)
    assert trainer.global_step == 1
    metrics = trainer.callback_metrics
    assert 0.0 <= float(metrics["train/reward/mean"]) <= 1.0
    assert float(metrics["train/zero_variance_groups"]) < 1.0
    assert any(not torch.equal(before[k], v) for k, v in module.policy.state_dict().items())
    assert torch.isfinite(metrics["loss/total"])
    if method == "dapo":  # dynamic sampling refills the step to 16 groups with a reward spread (or 10 draws)
        draws, found = float(metrics["train/sampling_draws"]), float(metrics["train/informative_groups"])
        assert found == 16 or draws == 10
        kept = float(metrics["train/kept_frac"])
        assert kept == pytest.approx(found / (16 * draws))  # kept groups / drawn groups
        # the extras past 16 are dropped: kept <= the drawn groups' share with a spread (over every draw)
        assert kept <= 1.0 - float(metrics["train/zero_variance_groups"]) + 1e-6  # both float32 metrics






def test_one_step_moves_logprobs_along_the_advantage(make_cfg):
    module, datamodule, trainer = build(make_cfg("debug=fdr", "method.optimizer.lr=1e-3", "data.prompts_per_step=16",
                                                 "data.sampling.n=8", "loss.kl_coef=0"))
    seen = []
    draw = datamodule.experience.draw  # the training steps' draws
    datamodule.experience.draw = lambda *a, **k: seen.append(draw(*a, **k)) or seen[-1]
    trainer.fit(module, datamodule=datamodule)
    batch = seen[0]
    advantages = module.credit(batch).advantages
    with torch.no_grad():
        new, _ = token_logprobs(module.policy, batch.input_ids, batch.attention_mask)
    delta = (new - batch.behaviour_logprobs) * batch.response_mask
    up, down = advantages > 0, advantages < 0
    assert up.any() and down.any(), "the sampled batch should hold both better and worse rollouts"
    # Policy gradient: tokens with positive advantage become likelier, negative ones less likely.
    assert delta[up].mean() > 0 > delta[down].mean()


def test_run_writes_tensorboard_checkpoints_and_an_hf_copy(make_cfg, tmp_path):
    cfg = make_cfg("trainer.max_steps=4", "trainer.val_check_interval=2", "callbacks.checkpoint.every_n_train_steps=2",
                   "callbacks.hf_export.every_n_steps=2", "data.prompts_per_step=2", "data.sampling.n=2",
                   "data.val_prompts=4")
    metrics = train(cfg)
    out = tmp_path / "run"
    series = scalars(out / "tensorboard")
    assert [s for s, _ in series["train/reward/mean"]] == [0, 1, 2, 3]
    assert len(series["val/reward/mean"]) == 3  # before training, after steps 2 and 4
    for tag in ["train/reward/std", "train/zero_variance_groups", "credit/adv_mean", "loss/clip_frac", "loss/kl",
                "train/entropy", "train/response_length", "perf/tokens_per_s", "train/engine_logprob_gap"]:
        assert tag in series, tag
    assert max(v for _, v in series["train/engine_logprob_gap"]) < 1e-4
    ckpt = torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["global_step"] == 4 and ckpt["optimizer_states"] and ckpt["lr_schedulers"]
    assert not any(k.startswith("reference.") for k in ckpt["state_dict"])  # the frozen reference is rebuilt, never saved
    assert ckpt["initial_weights"] == weights_hash(build(cfg)[0].policy)  # ... from these initial weights
    hf = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "hf" / "last")
    trained = {f"policy.{k}": v for k, v in hf.state_dict().items()}
    assert all(torch.equal(trained[k], ckpt["state_dict"][k]) for k in trained if k in ckpt["state_dict"])
    assert metrics["train/reward/mean"] >= 0


class FrozenCopyEngine(HFEngine):
    """Samples from a private copy of the policy and ignores weight updates: a sync that never takes."""

    def bind(self, model, tokenizer):
        super().bind(copy.deepcopy(model), tokenizer)

    def update_weights(self, model):
        pass


def test_a_sync_that_does_not_take_fails_loudly(make_cfg):
    cfg = make_cfg("trainer.max_steps=3", "method.optimizer.lr=1e-2", "method.max_logprob_gap=1e-3", "logger=csv",
                   "callbacks=none", "validate_first=false", "trainer.val_check_interval=100")
    module, datamodule, trainer = build(cfg)
    datamodule.experience.engine = FrozenCopyEngine()
    with pytest.raises(RuntimeError, match="stale weights"):
        trainer.fit(module, datamodule=datamodule)
    assert trainer.global_step >= 1  # the first step is fine; the guard fires once the weights have moved


def scored_batch():
    """4 rollouts scored [2, 1.4, 1, 0] by a reward with part weights 1 + 1 (normalised [1, 0.7, 0.5, 0]), with
    per-turn verifier scores: final turns [1, 0, 0, 1]."""
    return make_batch(torch.ones(4, 3), torch.tensor([0, 0, 1, 1]), torch.tensor([2.0, 1.4, 1.0, 0.0]),
                      reward_weights={"process": 1.0, "summary": 1.0}, metadata=[{"finish": ["stop"]}] * 4,
                      turn_scores=torch.tensor([[1.0], [0.0], [0.0], [1.0]]), turn_mask=torch.ones(4, 1, dtype=torch.bool))


# The metrics= override -> the metric sets it gives (train.yaml's default: none; `metrics=[]` drops an
# experiment's; `metrics=null` is no override Hydra accepts for a group).
METRIC_SETS = {"metrics=tool": ["tool"], "metrics=[]": [], "metrics=[tool,turn]": ["tool", "turn"], None: []}


@pytest.mark.parametrize("override", METRIC_SETS, ids=lambda o: o or "default")
def test_metric_sets_come_from_config(override, make_cfg):
    module, _datamodule, _trainer = build(make_cfg(*([override] if override else [])))
    names = METRIC_SETS[override]
    assert sorted(module.metric_sets) == names
    logs = module.rollout_metrics(scored_batch(), "train")
    # batch_metrics' shared keys always: reward mean (2 + 1.4 + 1 + 0) / 4 = 1.1
    assert logs["train/reward/mean"] == pytest.approx(1.1)
    # metrics=tool: success@0.7 = share of normalised scores >= 0.7 = 2/4; none without it
    success = {k: v for k, v in logs.items() if "/success@" in k}
    if "tool" in names:
        assert success == pytest.approx({"train/success@0.7": 0.5, "train/success@0.8": 0.25,
                                         "train/success@0.9": 0.25, "train/success@1.0": 0.25})
    else:
        assert success == {}
    # metrics=turn: the final-turn success 2/4 and pass@turn1 (max_turns 1 before fit); none without it
    assert ("train/success" in logs) == ("turn" in names) and ("train/pass@turn1" in logs) == ("turn" in names)
    if "turn" in names:
        assert logs["train/success"] == 0.5


def test_over_ranks_reduces_each_key_over_the_ranks_that_logged_it(monkeypatch):
    """Two ranks' logs: ``.../max`` is the max over ranks, ``.../min`` the min, anything else the mean over the
    ranks that logged the key: a turn kind only rank 1 saw keeps rank 1's value, not half of it."""
    from lit_credit.methods import grpo

    ranks = [{"a/max": 1.0, "a/min": 1.0, "loss": 2.0},
             {"a/max": 3.0, "a/min": -1.0, "loss": 4.0, "credit/tool/adv_mean": 0.6}]
    monkeypatch.setattr(grpo, "gather_objects", lambda obj: ranks)
    out = grpo.GRPOModule.over_ranks(ranks[0], grpo.extreme_by_suffix)
    assert out == {"a/max": 3.0, "a/min": -1.0, "loss": 3.0, "credit/tool/adv_mean": 0.6}
    assert grpo.GRPOModule.over_ranks(ranks[0], {"loss": max})["loss"] == 4.0


def test_a_checkpoint_of_other_initial_weights_is_refused(make_cfg):
    """The frozen reference is made again from the policy's initial weights on resume, never saved: a checkpoint
    carries their hash, and resuming with other initial weights (another model.path, a rebuilt warm start) fails."""
    module = build(make_cfg("experiment=grpo_arith"))[0]
    assert module.initial_weights == weights_hash(module.policy)  # built from the weights as loaded
    module.on_load_checkpoint({"initial_weights": module.initial_weights})  # the same weights: fine
    other = copy.deepcopy(module.policy)
    with torch.no_grad():
        next(other.parameters()).view(-1)[0] += 1e-6  # one weight, one ulp or so
    assert weights_hash(other) != module.initial_weights
    with pytest.raises(ValueError, match=r"other initial weights .* model\.path"):
        module.on_load_checkpoint({"initial_weights": weights_hash(other)})
