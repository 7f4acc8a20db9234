"""SLCAGRPOModule on the toolcall task: the SLCA metrics of a real (tiny) step."""
from __future__ import annotations

import pytest
import torch

from lit_credit.methods import SLCAGRPOModule
from lit_credit.train import build
from scripts.tb_scalars import scalars
from tests.test_configs import TOOLCALL_SMALL


@pytest.mark.parametrize("experiment", ["slca_toolcall", "grpo_toolcall"])
def test_one_step_logs_success_exact_match_and_segment_gradient_cosine(experiment, make_cfg):
    cfg = make_cfg(f"experiment={experiment}", "debug=fdr", *TOOLCALL_SMALL, "data.max_turns=2",
                   "data.prompts_per_step=4", "data.sampling.n=4", "data.sampling.max_new_tokens=24",
                   fast_task=False)
    module, datamodule, trainer = build(cfg)
    assert isinstance(module, SLCAGRPOModule)
    assert type(module.credit).__name__ == {"slca_toolcall": "SLCACredit", "grpo_toolcall": "GRPOCredit"}[experiment]
    seen = []
    generate = datamodule.generate_experience
    datamodule.generate_experience = lambda *a, **k: seen.append(generate(*a, **k)) or seen[-1]
    trainer.fit(module, datamodule=datamodule)
    m = {k: float(v) for k, v in trainer.callback_metrics.items()}
    batch = seen[0]
    # success@t is the share of rollouts with score >= t, so it cannot rise with t.
    for t in (0.7, 0.8, 0.9, 1.0):
        assert m[f"train/success@{t}"] == pytest.approx((batch.scores >= t - 1e-9).float().mean().item())
    assert m["train/success@0.7"] >= m["train/success@0.8"] >= m["train/success@0.9"] >= m["train/success@1.0"]
    exact = (batch.reward_parts["name"] == 1) & (batch.reward_parts["key"] == 1) & (batch.reward_parts["value"] == 1)
    assert m["train/tool/exact_match"] == pytest.approx(exact.float().mean().item())
    # The summary judge saw the environment's tool responses (0 when the rollout made no call).
    assert torch.all(batch.reward_parts["summary"][batch.reward_parts["should_call_but_no_call"] == 1] == 0)


def test_sparse_diagnostics_are_logged_only_at_the_steps_they_are_computed(make_cfg, tmp_path):
    cfg = make_cfg("experiment=grpo_arith", "data.prompts_per_step=2", "data.sampling.n=2",
                   "trainer.max_steps=3", "trainer.val_check_interval=100", "validate_first=false", "callbacks=none")
    module, datamodule, trainer = build(cfg)
    # What SLCA's grad cosine does every N steps, here every 2: Lightning's self.log would re-log a key's last
    # value at every later step; the diagnostics path must not.
    module.credit_diagnostics = lambda batch, adv: {"x/diag": 10.0 + module.global_step} \
        if module.global_step % 2 == 0 else {}
    trainer.fit(module, datamodule=datamodule)
    assert scalars(tmp_path)["x/diag"] == [(0, 10.0), (2, 12.0)]
    assert [s for s, _ in scalars(tmp_path)["train/reward/mean"]] == [0, 1, 2]
