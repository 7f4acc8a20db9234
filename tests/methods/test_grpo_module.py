"""GRPOModule end to end on the embedded tiny policy: every loss variant, the update direction,
TensorBoard and checkpoint outputs, and the stale-weights guard."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from lit_credit.methods.grpo import nonzero_variance_groups
from lit_credit.models import token_logprobs
from lit_credit.rollout import HFEngine
from lit_credit.train import build, train
from scripts.tb_scalars import scalars
from tests.credit.common import make_batch


@pytest.mark.parametrize("method", ["grpo", "dr_grpo", "dapo", "gspo"])
def test_fast_dev_run_updates_the_policy(method, make_cfg):
    # 16 prompts x 4 samples: some group holds both right and wrong answers (seeded).
    module, datamodule, trainer = build(make_cfg("debug=fdr", f"method={method}", "data.prompts_per_step=16",
                                                 "data.sampling.n=4"))
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
        assert kept <= 1.0 - float(metrics["train/zero_variance_groups"]) + 1e-9


def test_nonzero_variance_groups_hand_table():
    # groups 5: scores (1, 1) -> constant, dropped; 9: (0, 1) -> kept; 2: (0.5) singleton -> constant, dropped.
    batch = make_batch(torch.ones(5, 2), torch.tensor([5, 5, 9, 9, 2]), torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5]))
    assert nonzero_variance_groups(batch).tolist() == [False, False, True, True, False]


def test_nonzero_variance_groups_stays_on_the_batch_device():
    # The meta device has shapes but no data: any host sync or CPU scratch tensor would fail here.
    batch = make_batch(torch.ones(5, 2), torch.tensor([5, 5, 9, 9, 2]), torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5]))
    keep = nonzero_variance_groups(batch.to("meta"))
    assert keep.device.type == "meta" and keep.shape == (5,) and keep.dtype == torch.bool


def test_one_step_moves_logprobs_along_the_advantage(make_cfg):
    module, datamodule, trainer = build(make_cfg("debug=fdr", "method.optimizer.lr=1e-3", "data.prompts_per_step=16",
                                                 "data.sampling.n=8", "method.loss.kl_coef=0"))
    seen = []
    generate = datamodule.generate_experience
    datamodule.generate_experience = lambda *a, **k: seen.append(generate(*a, **k)) or seen[-1]
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
    assert any(k.startswith("reference.") for k in ckpt["state_dict"])  # the frozen KL reference travels too
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
    datamodule.engine = FrozenCopyEngine()
    with pytest.raises(RuntimeError, match="stale weights"):
        trainer.fit(module, datamodule=datamodule)
    assert trainer.global_step >= 1  # the first step is fine; the guard fires once the weights have moved
