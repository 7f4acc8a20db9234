"""Several updates per rollout batch make the PPO ratio act: with one update it is exactly 1 (no clip, no DAPO
clip-higher, no GSPO sequence ratio), from the second minibatch on it moves, and GSPO's length-normalised
sequence ratio then differs from the per-token ratios. The shipped configs use several updates."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from lit_credit.config import check_config
from lit_credit.train import CONF_DIR, build

STEP = ["data.prompts_per_step=8", "data.sampling.n=4", "data.sampling.max_new_tokens=6", "callbacks=none",
        "logger=csv", "validate_first=false", "+trainer.limit_val_batches=0", "+trainer.enable_checkpointing=false",
        "trainer.max_steps=1", "method.lr_scheduler=null", "loss.kl_coef=0"]


class Recorder:
    """The module's loss, recording each update's inputs and metrics (the loss itself is untouched)."""

    def __init__(self, loss) -> None:
        self.loss, self.calls = loss, []

    def __call__(self, logp, old, advantages, mask, ref):
        loss, metrics = self.loss(logp, old, advantages, mask, ref)
        self.calls.append({"logp": logp.detach().clone(), "old": old.clone(), "mask": mask.clone(),
                           "advantages": advantages.clone(), **metrics})
        return loss, metrics


def one_step(make_cfg, *overrides: str):
    module, datamodule, trainer = build(make_cfg(*STEP, *overrides))
    module.loss = recorder = Recorder(module.loss)
    trainer.fit(module, datamodule=datamodule)
    assert trainer.global_step == 1  # one training step, whatever its number of updates
    return recorder.calls, trainer.callback_metrics


def test_one_update_per_batch_leaves_the_ratio_exactly_one(make_cfg):
    # ppo_epochs = num_minibatches = 1: old log-probs = the trainer's own (detached), r = exp(0) = 1 on every
    # token, so the clip never binds, at any learning rate: the regime every experiment ran in before.
    calls, metrics = one_step(make_cfg, "loss=dapo", "method.dynamic_sampling=true", "method.num_minibatches=1",
                              "method.optimizer.lr=1e-1")
    (call,) = calls
    assert torch.equal(call["logp"], call["old"])
    assert call["loss/ratio_min"] == call["loss/ratio_max"] == 1.0 and call["loss/clip_frac"] == 0.0
    assert float(metrics["loss/clip_frac"]) == 0.0 and float(metrics["train/updates"]) == 1.0


@pytest.mark.parametrize("loss", ["gspo", "dapo"])
def test_the_ratio_acts_from_the_second_minibatch(loss, make_cfg):
    # 32 rollouts in 4 minibatches of 8, AdamW at lr 1e-2 (no warm-up): 4 updates in one training step. Dynamic
    # sampling (DAPO's own; switched on for GSPO too) fills the step with groups that have a reward spread, so
    # every rollout has a non-zero advantage and the first update has a gradient (the tiny policy is mostly
    # wrong: a random minibatch of plain sampling often has none).
    calls, metrics = one_step(make_cfg, f"loss={loss}", "method.num_minibatches=4", "method.optimizer.lr=1e-2",
                              "method.dynamic_sampling=true")
    assert len(calls) == 4 and float(metrics["train/updates"]) == 4
    first, second = calls[0], calls[1]
    m0 = first["mask"] != 0
    assert (first["advantages"][m0] != 0).all()
    # Minibatch 1: the policy has not moved since the old log-probs were taken: r = 1 up to float noise.
    assert (first["logp"] - first["old"])[m0].abs().max() < 1e-5
    # Minibatch 2, after one update: per-token log-ratios log r_t = logp_t - old_t, and GSPO's
    # length-normalised sequence ratio s_i = exp(sum_t m_t log r_t / sum_t m_t).
    m = second["mask"] != 0
    log_r = torch.where(m, second["logp"] - second["old"], torch.zeros_like(second["logp"]))
    s = torch.exp(log_r.sum(-1) / m.sum(-1))
    present = m.any(-1)
    assert (log_r[m].abs() > 1e-3).any()  # the token ratios moved off 1
    if loss == "gspo":
        assert (s[present] - 1).abs().max() > 1e-3  # the sequence ratio moved off 1
        # ... and differs from the token ratios inside a row: r_t = s_i for every t only if log r is flat
        token_vs_seq = (torch.exp(log_r) - s[:, None]).abs()[m]
        assert token_vs_seq.max() > 1e-3
        # the surrogate's ratio is that sequence ratio (its metric: mean of s_i over rows with tokens)
        assert second["loss/ratio_mean"] == pytest.approx(s[present].mean().item(), rel=1e-5)
    # the clip binds somewhere in the later updates (clip 0.2, DAPO 0.2 / 0.28), never on the first
    assert first["loss/clip_frac"] == 0.0
    assert max(c["loss/clip_frac"] for c in calls[1:]) > 0
    assert float(metrics["loss/clip_frac"]) > 0  # the step's mean over its updates, as logged


def test_lora_dropout_is_off_so_the_first_update_has_ratio_one(make_cfg):
    # model/lora=r8 has lora_dropout 0.05, and PEFT leaves those dropout modules in training mode: the old
    # log-probs (no grad) and a minibatch's (with grad) would see different dropout masks, a ratio off 1 before
    # any update of the step. (In step 1 LoRA's B = 0 hides it: dropout(x) A B = 0.) RL runs the policy in eval
    # mode, so the first minibatch of step 2, after step 1's updates moved B, still has a ratio of 1.
    module, datamodule, trainer = build(make_cfg(*STEP, "trainer.max_steps=2", "model/lora=r8", "loss=dapo",
                                                 "method.num_minibatches=4", "method.optimizer.lr=1e-2",
                                                 "method.dynamic_sampling=true"))
    module.loss = recorder = Recorder(module.loss)
    trainer.fit(module, datamodule=datamodule)
    first = recorder.calls[4]  # step 2, minibatch 1
    m0 = first["mask"] != 0
    assert (first["logp"] - first["old"])[m0].abs().max() < 1e-5


@pytest.mark.parametrize("experiment", ["grpo_arith", "slca_toolcall", "grpo_toolcall", "toolpo_toolcall",
                                        "slca_tcpo_toolcall", "tcpo_math"])
def test_the_grpo_family_experiments_take_several_updates_per_rollout_batch(experiment, make_cfg):
    cfg = make_cfg(f"experiment={experiment}", fast_task=False, fast_model=False)
    check_config(cfg)  # num_minibatches divides prompts_per_step x n
    method, data = cfg.method, cfg.data
    assert method.ppo_epochs * method.num_minibatches > 1
    assert (data.prompts_per_step * data.sampling.n) % method.num_minibatches == 0


def test_grpo_yaml_holds_the_default_every_method_inherits():
    grpo = OmegaConf.load(CONF_DIR / "method" / "grpo.yaml")
    assert (grpo.ppo_epochs, grpo.num_minibatches, grpo.max_sampling_draws) == (1, 4, 10)
    # The GRPO family is method=grpo with a credit, a loss, an augmenter and metric sets from their own groups:
    # none of those files sets the update split (inherited, not overridden), and method=grpo picks no credit.
    parts = [p for group in ("credit", "loss", "augment", "metrics") for p in (CONF_DIR / group).glob("*.yaml")]
    assert {p.stem for p in parts} >= {"dapo", "gspo", "dr_grpo", "slca", "tcpo", "slca_tcpo", "counterfactual"}
    for path in parts:
        text = path.read_text()
        assert "num_minibatches" not in text and "ppo_epochs" not in text, path
    assert "/credit" not in (CONF_DIR / "method" / "grpo.yaml").read_text()


@pytest.mark.parametrize("loss", ["grpo", "dr_grpo", "gspo", "dapo"])
def test_micro_batch_backward_gives_the_whole_batch_gradient(loss, make_cfg):
    """backward_by_micro_batch with a token budget of 1 (every row its own micro-batch: max(1, 1 // width) = 1
    row) must give the gradient of one backward over the whole batch: each row's loss terms depend on its own
    log-probs only, and the aggregations' normalisers (token count, rows, max length) come from the mask.
    Old log-probs 0.3 N(0, 1) off the behaviour ones put the ratios at e^(+-0.3), so the clip binds on some
    tokens; a KL coefficient of 0.05 adds the KL term; random advantages. Each micro-batch is forwarded only
    after the previous one's backward has reached the weights (F B F B ...), so one graph lives at a time. The
    padding runs that line ranks up (one row again, weight 0) leave the gradients exactly as they are."""
    overrides = [o for o in STEP if not o.startswith("loss.kl_coef")]
    module, datamodule, trainer = build(make_cfg(*overrides, f"loss={loss}", "loss.kl_coef=0.05",
                                                 "method.num_minibatches=1"))
    seen, run = {}, module.backward_by_micro_batch
    module.backward_by_micro_batch = lambda batch, *a, **kw: seen.setdefault("batch", batch) and run(batch, *a, **kw)
    trainer.fit(module, datamodule=datamodule)  # the step's real rollout batch, and a trainer to backward with
    batch, mask = seen["batch"], seen["batch"].response_mask
    g = torch.Generator().manual_seed(0)
    advantages = torch.randn(mask.shape, generator=g) * mask
    old = batch.behaviour_logprobs + 0.3 * torch.randn(mask.shape, generator=g)
    ref = batch.behaviour_logprobs - 0.2 * torch.rand(mask.shape, generator=g)
    params = [p for p in module.policy.parameters() if p.requires_grad]
    events = []
    module.policy.register_forward_pre_hook(lambda m, a, kw: events.append("F") if torch.is_grad_enabled() else None,
                                            with_kwargs=True)
    params[0].register_post_accumulate_grad_hook(lambda p: events.append("B"))

    def gradients(budget, padding=0):
        module.logprob_token_budget = budget
        module._micro_batch_count = lambda local: local + padding  # as if another rank had `padding` more
        module.policy.zero_grad(set_to_none=True)
        events.clear()
        logp, _, metrics = run(batch, module.loss, advantages, mask, ref, old)
        return [p.grad.clone() for p in params], logp, metrics, list(events)

    whole, logp_whole, metrics_whole, events_whole = gradients(None)
    micro, logp_micro, metrics_micro, events_micro = gradients(1)
    padded, logp_padded, _, events_padded = gradients(1, padding=2)
    assert events_whole == ["F", "B"] and events_micro == ["F", "B"] * len(batch)
    assert events_padded == ["F", "B"] * (len(batch) + 2)  # two padding runs, weight 0: the same gradients
    torch.testing.assert_close(logp_padded, logp_micro, rtol=0, atol=0)
    for a, b in zip(padded, micro):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert metrics_whole["loss/clip_frac"] > 0  # the clip binds, so the test covers clipped tokens too
    torch.testing.assert_close(logp_micro * mask, logp_whole * mask, rtol=0, atol=1e-5)  # padding differs
    for a, b in zip(micro, whole):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    for key in ("loss/total", "loss/policy", "loss/kl", "loss/clip_frac", "loss/ratio_mean"):
        assert metrics_micro[key] == pytest.approx(metrics_whole[key], rel=1e-4, abs=1e-6)
