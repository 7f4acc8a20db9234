"""GRPOModule as SLCA-GRPO and SLCA x TCPO on the toolcall tasks (credit=slca / slca_tcpo, metrics=tool,
augment=counterfactual_tool): the SLCA metrics of a real (tiny) step, the sparse gradient-cosine diagnostic and
the counterfactual tool turns."""
from __future__ import annotations

import pytest
import torch

import lit_credit.methods.grpo as grpo_module
from lit_credit.analysis.metrics import score_scale, step_exact_match
from lit_credit.methods import GRPOModule
from lit_credit.rewards.hierr import normalize_gold_calls
from lit_credit.tasks.toolcall import tool_call_text
from lit_credit.train import build
from lit_credit.types import Completion
from scripts.tb_scalars import scalars
from tests.test_configs import TOOLCALL_SMALL


@pytest.mark.parametrize("experiment", ["slca_toolcall", "grpo_toolcall"])
def test_one_step_logs_success_exact_match_and_segment_gradient_cosine(experiment, make_cfg, monkeypatch):
    cfg = make_cfg(f"experiment={experiment}", "debug=fdr", *TOOLCALL_SMALL, "data.max_turns=2",
                   "data.prompts_per_step=4", "data.sampling.n=4", "data.sampling.max_new_tokens=24",
                   "task.subsets={single:1,irrelevant:1}", fast_task=False)
    module, datamodule, trainer = build(cfg)
    assert type(module) is GRPOModule and list(module.metric_sets) == ["tool"] and module.grad_cosine_every == 10
    assert module.augment is None
    assert type(module.credit).__name__ == {"slca_toolcall": "SLCACredit", "grpo_toolcall": "GRPOCredit"}[experiment]
    seen = []
    draw = datamodule.experience.draw  # the training steps' draws
    datamodule.experience.draw = lambda *a, **k: seen.append(draw(*a, **k)) or seen[-1]
    cosines, cosine = [], grpo_module.segment_grad_cosine  # grad_cosine_every=10: computed at step 0
    monkeypatch.setattr(grpo_module, "segment_grad_cosine", lambda *a: cosines.append(cosine(*a)) or cosines[-1])
    trainer.fit(module, datamodule=datamodule)
    assert len(cosines) == 1 and (cosines[0] is None or -1 - 1e-6 <= cosines[0] <= 1 + 1e-6)
    m = {k: float(v) for k, v in trainer.callback_metrics.items()}
    batch = seen[0]
    # success@t is the share of rollouts with score / (w_process + w_summary) >= t (official weighted_score_norm;
    # HierR's weights 1 + 1 = 2), so it cannot rise with t.
    assert score_scale(batch.reward_weights) == 2.0
    for t in (0.7, 0.8, 0.9, 1.0):
        assert m[f"train/success@{t}"] == pytest.approx((batch.scores / 2 >= t - 1e-9).float().mean().item())
    assert m["train/success@0.7"] >= m["train/success@0.8"] >= m["train/success@0.9"] >= m["train/success@1.0"]
    exact = (batch.reward_parts["name"] == 1) & (batch.reward_parts["key"] == 1) & (batch.reward_parts["value"] == 1)
    assert m["train/tool/exact_match"] == pytest.approx(exact.float().mean().item())
    # The summary judge saw the environment's tool responses (0 when the rollout made no call).
    assert torch.all(batch.reward_parts["summary"][batch.reward_parts["should_call_but_no_call"] == 1] == 0)
    parts = batch.reward_parts
    no_call = parts["gold_steps"] == 0  # 4 prompts of a half-irrelevant train split (seeded): some are
    assert no_call.any() and not no_call.all()
    # the irrelevant-prompt call rate is the share of their rollouts with any tool tag
    assert m["train/tool/irrelevant_call_rate"] == pytest.approx(parts["tool_tag"][no_call].mean().item())
    assert m["train/tool/irrelevant_valid_call_rate"] == pytest.approx(parts["valid_call"][no_call].mean().item())
    assert torch.all(parts["summary"][no_call] == 0)  # no_call_summary="zero": no summary reward there


def test_sparse_diagnostics_are_logged_only_at_the_steps_they_are_computed(make_cfg, tmp_path, monkeypatch):
    cfg = make_cfg("experiment=grpo_arith", "data.prompts_per_step=2", "data.sampling.n=2", "method.grad_cosine_every=2",
                   "trainer.max_steps=3", "trainer.val_check_interval=100", "validate_first=false", "callbacks=none")
    module, datamodule, trainer = build(cfg)
    # SLCA's grad cosine every N steps, here every 2 (its value stubbed to 10 + step: arithmetic replies have no
    # tool segment): Lightning's self.log would re-log a key's last value at every later step; the diagnostic
    # goes straight to the logger, only at steps 0 and 2.
    computed = []
    monkeypatch.setattr(grpo_module, "segment_grad_cosine",
                        lambda *a: computed.append(module.global_step) or 10.0 + module.global_step)
    trainer.fit(module, datamodule=datamodule)
    assert computed == [0, 2]
    assert scalars(tmp_path)["slca/grad_cosine"] == [(0, 10.0), (2, 12.0)]
    assert [s for s, _ in scalars(tmp_path)["train/reward/mean"]] == [0, 1, 2]


class ScriptedToolEngine:
    """Plays the chain prompts: at tool turn k (= tool responses seen so far) sample j makes gold step k's call
    when ``(j + k)`` is even, else the same call with a wrong argument; past the plan it writes a summary.
    Wrong calls get behaviour log-prob -1 per token (surprising), right ones -0.1."""

    def __init__(self, rows):
        self.rows, self.outputs = rows, []

    def bind(self, model, tokenizer):
        self.tok = tokenizer

    def update_weights(self, model):
        pass

    def reply(self, row, turn, j):
        gold = normalize_gold_calls(row["gold_tool_calls"])
        if turn >= len(gold):
            return "All done: the calls went through.", -0.1
        step = [dict(c, arguments=dict(c["arguments"])) for c in gold[turn]]
        if (j + turn) % 2:
            key = next(iter(step[0]["arguments"]))
            step[0]["arguments"][key] = "wrong"
            return tool_call_text(step), -1.0
        return tool_call_text(step), -0.1

    def generate(self, prompts, sampling, seeds=None):
        out = []
        for ids in prompts:
            text = self.tok.decode(ids)
            row = next(r for r in self.rows if r["question"] in text)
            turn = text.count("<tool_response>")
            replies = []
            for j in range(sampling.n):
                reply, lp = self.reply(row, turn, j)
                tokens = self.tok(reply)["input_ids"] + [self.tok.eos_token_id]
                replies.append(Completion(tokens, [lp] * len(tokens), reply))
            out.append(replies)
        self.outputs.append((sampling.n, out))
        return out


def test_slca_tcpo_resamples_tool_turns_scores_them_per_step_and_logs_step_accuracy(make_cfg):
    cfg = make_cfg("experiment=slca_tcpo_toolcall", "credit.preset=tcpo", "debug=fdr", *TOOLCALL_SMALL,
                   "data.sampling.n=4", "augment.top_l=2", "augment.samples=2", fast_task=False)
    module, datamodule, trainer = build(cfg)
    assert type(module) is GRPOModule and module.credit.needs == {"alt_scores", "cf_mask"}
    assert module.augment.score == "reward" and sorted(module.metric_sets) == ["tool", "turn"]
    datamodule.setup("fit")
    engine = datamodule.experience.engine = ScriptedToolEngine([*datamodule.train_set, *datamodule.val_set])
    seen = []
    augment = module.augment_experience
    module.augment_experience = lambda batch: seen.append(batch) or augment(batch)
    trainer.fit(module, datamodule=datamodule)
    batch = seen[0]
    parts, turns = batch.reward_parts, batch.turn_parts
    tool_mask, selected, alt = turns["tool_turn_mask"].bool(), batch.extras["cf_mask"], batch.extras["alt_scores"]
    depth = parts["gold_steps"].long()
    # Every rollout makes one call per gold step, then summarises: tool turns = gold steps.
    assert (tool_mask.sum(1) == depth).all()
    # Sample j's first call is right for even j: turn 0 scores 1 exactly for rollouts 0, 2 of each group.
    j = torch.arange(len(batch)) % 4
    assert ((turns["tool_scores"][:, 0] == 1) == (j % 2 == 0)).all()
    assert ((turns["tool_exact"][:, 0] == 1) == (j % 2 == 0)).all()
    # Top-2 tool turns per group by surprisal: wrong calls (log-prob -1) outrank right ones.
    assert not (selected & ~tool_mask).any() and (selected.sum(1).view(-1, 4).sum(1) == 2).all()
    assert (turns["tool_scores"][selected] < 1).all()
    # Alternatives: the engine's cf call (n = 2) from the exact history, scored per step by the reward.
    cf = [out for n, out in engine.outputs if n == 2]
    assert len(cf) == 1
    rows = [batch.metadata[i]["row"] for i, _ in selected.nonzero().tolist()]
    expected = [[datamodule.experience.reward.turn_score(row, k, c.text) for c in alts]
                for row, (_, k), alts in zip(rows, selected.nonzero().tolist(), cf[0])]
    torch.testing.assert_close(alt[selected], torch.tensor(expected, dtype=alt.dtype))
    assert torch.isnan(alt[~selected]).all()
    # Alternative 0 at turn k is right when k is even: a right call scores 1 against its own gold step.
    assert all(e[0] == 1.0 for e, (_, k) in zip(expected, selected.nonzero().tolist()) if k % 2 == 0)
    m = {k: float(v) for k, v in trainer.callback_metrics.items()}
    for k, v in step_exact_match(turns["tool_exact"], parts["gold_steps"]).items():
        assert m[f"train/step{k}/exact_match"] == pytest.approx(v)
    assert m["train/step1/exact_match"] == 0.5 and m["tcpo/cf_turns"] == 4.0
    assert "credit/turn_type/regress/frac" in m and "val/step1/exact_match" in m
