"""SLCAGRPOModule on the toolcall task: the SLCA metrics of a real (tiny) step."""
from __future__ import annotations

import pytest
import torch

from lit_credit.methods import SLCAGRPOModule, SLCATCPOModule
from lit_credit.methods.slca_grpo import irrelevant_call_rates, step_exact_match
from lit_credit.rewards.hierr import normalize_gold_calls
from lit_credit.tasks.toolcall import tool_call_text
from lit_credit.train import build
from lit_credit.types import Completion
from scripts.tb_scalars import scalars
from tests.test_configs import TOOLCALL_SMALL


@pytest.mark.parametrize("experiment", ["slca_toolcall", "grpo_toolcall"])
def test_one_step_logs_success_exact_match_and_segment_gradient_cosine(experiment, make_cfg):
    cfg = make_cfg(f"experiment={experiment}", "debug=fdr", *TOOLCALL_SMALL, "data.max_turns=2",
                   "data.prompts_per_step=4", "data.sampling.n=4", "data.sampling.max_new_tokens=24",
                   "task.subsets={single:1,irrelevant:1}", fast_task=False)
    module, datamodule, trainer = build(cfg)
    assert isinstance(module, SLCAGRPOModule)
    assert type(module.credit).__name__ == {"slca_toolcall": "SLCACredit", "grpo_toolcall": "GRPOCredit"}[experiment]
    seen = []
    generate = datamodule.generate_experience
    datamodule.generate_experience = lambda *a, **k: seen.append(generate(*a, **k)) or seen[-1]
    trainer.fit(module, datamodule=datamodule)
    m = {k: float(v) for k, v in trainer.callback_metrics.items()}
    batch = seen[0]
    # success@t is the share of rollouts with score / (w_process + w_summary) >= t (official weighted_score_norm;
    # HierR's weights 1 + 1 = 2), so it cannot rise with t.
    assert module.score_scale() == 2.0
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


def test_irrelevant_call_rates_by_hand():
    # 5 rollouts; gold steps [0, 0, 2, 0, 1] -> rollouts 0, 1, 3 are of no-call prompts. Tool tags [1, 0, 1, 1, 0]
    # -> on them 1, 0, 1: rate 2/3; valid calls [0, 0, 1, 1, 1] -> on them 0, 0, 1: 1/3
    parts = {"gold_steps": torch.tensor([0.0, 0, 2, 0, 1]), "tool_tag": torch.tensor([1.0, 0, 1, 1, 0]),
             "valid_call": torch.tensor([0.0, 0, 1, 1, 1])}
    assert irrelevant_call_rates(parts, "train") == pytest.approx(
        {"train/tool/irrelevant_call_rate": 2 / 3, "train/tool/irrelevant_valid_call_rate": 1 / 3})
    assert irrelevant_call_rates({**parts, "gold_steps": torch.ones(5)}, "val") == {}  # no no-call prompt
    assert irrelevant_call_rates({"gold_steps": parts["gold_steps"]}, "val") == {}     # a reward without tags


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


def test_step_exact_match_by_hand():
    # gold steps [3, 3, 2, 1]; turn k exact? r0 [1, 0, 0], r1 [1, 1, 1], r2 [0, 0, 0], r3 [1, 0, 0].
    # step 1: all four plans have it, exact 1, 1, 0, 1 -> 3/4; step 2: r0, r1, r2 -> 0, 1, 0 -> 1/3;
    # step 3: r0, r1 -> 0, 1 -> 1/2 (r3's exact turn 1 is past its one-step plan: not counted).
    exact = torch.tensor([[1.0, 0, 0], [1, 1, 1], [0, 0, 0], [1, 0, 0]])
    got = step_exact_match(exact, torch.tensor([3.0, 3, 2, 1]))
    assert got == pytest.approx({1: 3 / 4, 2: 1 / 3, 3: 1 / 2})
    # A plan deeper than any rollout's turns: the missing turns are misses.
    assert step_exact_match(torch.tensor([[1.0], [0.0]]), torch.tensor([2.0, 1.0])) == {1: 0.5, 2: 0.0}


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

    def generate(self, prompts, sampling):
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
                   "data.sampling.n=4", "method.cf_top_l=2", "method.cf_samples=2", fast_task=False)
    module, datamodule, trainer = build(cfg)
    assert isinstance(module, SLCATCPOModule) and module.credit.uses_counterfactual
    datamodule.setup("fit")
    engine = datamodule.engine = ScriptedToolEngine([*datamodule.train_set, *datamodule.val_set])
    seen = []
    augment = module.augment_experience
    module.augment_experience = lambda batch: seen.append(batch) or augment(batch)
    trainer.fit(module, datamodule=datamodule)
    batch = seen[0]
    parts = batch.reward_parts
    tool_mask, selected, alt = parts["tool_turn_mask"].bool(), parts["cf_mask"], parts["alt_scores"]
    depth = parts["gold_steps"].long()
    # Every rollout makes one call per gold step, then summarises: tool turns = gold steps.
    assert (tool_mask.sum(1) == depth).all()
    # Sample j's first call is right for even j: turn 0 scores 1 exactly for rollouts 0, 2 of each group.
    j = torch.arange(len(batch)) % 4
    assert ((parts["tool_scores"][:, 0] == 1) == (j % 2 == 0)).all()
    assert ((parts["tool_exact"][:, 0] == 1) == (j % 2 == 0)).all()
    # Top-2 tool turns per group by surprisal: wrong calls (log-prob -1) outrank right ones.
    assert not (selected & ~tool_mask).any() and (selected.sum(1).view(-1, 4).sum(1) == 2).all()
    assert (parts["tool_scores"][selected] < 1).all()
    # Alternatives: the engine's cf call (n = 2) from the exact history, scored per step by the reward.
    cf = [out for n, out in engine.outputs if n == 2]
    assert len(cf) == 1
    rows = [batch.metadata[i]["row"] for i, _ in selected.nonzero().tolist()]
    expected = [[datamodule.reward.turn_score(row, k, c.text) for c in alts]
                for row, (_, k), alts in zip(rows, selected.nonzero().tolist(), cf[0])]
    torch.testing.assert_close(alt[selected], torch.tensor(expected, dtype=alt.dtype))
    assert torch.isnan(alt[~selected]).all()
    # Alternative 0 at turn k is right when k is even: a right call scores 1 against its own gold step.
    assert all(e[0] == 1.0 for e, (_, k) in zip(expected, selected.nonzero().tolist()) if k % 2 == 0)
    m = {k: float(v) for k, v in trainer.callback_metrics.items()}
    for k, v in step_exact_match(parts["tool_exact"], parts["gold_steps"]).items():
        assert m[f"train/step{k}/exact_match"] == pytest.approx(v)
    assert m["train/step1/exact_match"] == 0.5 and m["tcpo/cf_turns"] == 4.0
    assert "credit/turn_type/regress/frac" in m and "val/step1/exact_match" in m
