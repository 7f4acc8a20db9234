"""DPA-GRPO's module (docs/methods.md §3): the loss by hand, LoRA roles and reference, the role batches' weight
and advantage bonus in the loss, and scripted rounds end to end (adapters, optimisers, losses, logging).

The game's rules (rewards, cases, shown revision, exploration) are tested on their own, with a scripted actor and
no Trainer, in tests/tasks/test_form_game.py. The rounds here drive the real module, Trainer, tokenizer and LoRA
policy with a scripted engine (a unit-test stand-in: every role's reply is fixed by the script below).
"""
from __future__ import annotations

from dataclasses import replace

import lightning as L
import pytest
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from peft import LoraConfig

from lit_credit.checkpoint import capture_rng
from lit_credit.credit import GRPOCredit
from lit_credit.losses import PolicyLoss, ReinforceSurrogate
from lit_credit.methods import DPAGRPOModule, GRPOModule, PolicyModule
from lit_credit.models import PolicySource, token_logprobs
from lit_credit.rewards import CASES
from lit_credit.rollout import ChatCodec
from lit_credit.rollout.roles import role_batch
from lit_credit.tasks.form import INSTRUCTIONS, action_text
from lit_credit.tasks.form_game import FormGame, decision_action
from lit_credit.train import build
from lit_credit.types import Completion, RoleActions
from tests.tasks.dpa_script import script as game_script

SMALL = ["experiment=dpa_form", "model.embedded.sft_steps=0", "task.num_train=1", "task.num_test=2",
         "task.lines=[1a,15]", "task.rl_lines=null", "data.val_samples=0", "data.prompts_per_step=2", "data.sampling.n=2", "trainer.max_steps=1",
         "+trainer.limit_val_batches=0", "validate_first=false", "logger=csv", "method.optimizer.lr=0.05"]


def test_dpa_loss_by_hand():
    # Two action sequences, tokens 1-2 and 1. Sequence-summed: log pi = -1 - 2 = -3 and -0.5; reference -2.5, -0.5.
    # l_1 = -A_1 log pi_1 + beta (log pi_1 - log pi_ref_1) = -(1)(-3) + 0.04 (-3 + 2.5) = 3 - 0.02 = 2.98
    # l_2 = -(-1)(-0.5) + 0.04 * 0 = -0.5;  loss = mean = (2.98 - 0.5) / 2 = 1.24.
    # d loss / d logp_t = (-A_i + beta) / 2: -0.48 on sequence 1's tokens, (1 + 0.04) / 2 = 0.52 on sequence 2's.
    loss_fn = PolicyLoss(ReinforceSurrogate(), aggregation="seq-mean-token-sum", kl_coef=0.04, kl_estimator="k1")
    logp = torch.tensor([[0.0, -1.0, -2.0, 0.0], [0.0, -0.5, 0.0, 7.0]], requires_grad=True)
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 0, 0]], dtype=torch.float)
    adv = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, -1.0, -1.0, 0.0]])
    ref = torch.tensor([[0.0, -1.5, -1.0, 0.0], [0.0, -0.5, 0.0, 0.0]])
    loss, _ = loss_fn(logp, logp.detach(), adv, mask, ref)
    assert loss.item() == pytest.approx(1.24, abs=1e-6)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[0, -0.48, -0.48, 0], [0, 0.52, 0, 0]]), atol=1e-6)
    # The config's k3 (exp(ref - logp) - (ref - logp) - 1 per token) has gradient 1 - exp(ref - logp): zero where
    # pi = pi_ref, so there only -A / 2 is left: -0.5 on sequence 1's tokens, +0.5 on sequence 2's.
    k3 = PolicyLoss(ReinforceSurrogate(), aggregation="seq-mean-token-sum", kl_coef=0.04, kl_estimator="k3")
    logp = logp.detach().clone().requires_grad_(True)
    k3(logp, logp.detach(), adv, mask, logp.detach())[0].backward()
    assert torch.allclose(logp.grad, torch.tensor([[0, -0.5, -0.5, 0], [0, 0.5, 0, 0]]), atol=1e-6)


def test_e68b47_recipe_is_its_length_normalised_loss_by_hand(make_cfg):
    # experiment=dpa_form_e68b47: dpa_form with the later official commit e68b47's game keys and loss. e68b47's
    # grpo_group_accumulate_gradients (length_normalize=True) for a pair of k = 2 actions with loss_scale s:
    # (s / k) sum_i [ -A_i lp_i + beta (lp_i - ref_i) ], lp_i / ref_i the MEAN per-token log-probs of action i.
    # Pair A = (+1, -1), s = 2 (a rarity weight, the row weight here), beta 0.04, k1 as in e68b47:
    #   action 1: lp = (-1 - 2) / 2 = -1.5, ref = (-1.5 - 1.0) / 2 = -1.25: 1.5 + 0.04 (-0.25) = 1.49
    #   action 2: lp = ref = -0.5: -(-1)(-0.5) + 0 = -0.5
    #   loss = (2 / 2) (1.49 - 0.5) = 0.99      (summed log-probs, dpa_form: (2 / 2) (2.98 - 0.5) = 2.48)
    # d loss / d logp_t = (s / k) (-A_i + beta) / n_i: (-1 + 0.04) / 2 = -0.48 on action 1's 2 tokens,
    # (1 + 0.04) / 1 = 1.04 on action 2's token.
    cfg = make_cfg("experiment=dpa_form_e68b47", *SMALL[1:], fast_task=False)
    assert (cfg.game.shown_revision, cfg.game.revision_update, cfg.game.train_approver_without_revision) == (
        "first", "group", False)
    assert not make_cfg(*SMALL, fast_task=False).loss.length_normalize  # dpa_form sums, as commit 7da686
    loss_fn = instantiate(cfg.loss, kl_estimator="k1")  # e68b47's KL; the recipe keeps dpa_form's k3
    assert (loss_fn.length_normalize, loss_fn.aggregation, loss_fn.kl_coef) == (True, "seq-mean-token-sum", 0.04)
    logp = torch.tensor([[0.0, -1.0, -2.0, 0.0], [0.0, -0.5, 0.0, 7.0]], requires_grad=True)
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 0, 0]], dtype=torch.float) * 2.0  # weight 2
    adv = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, -1.0, -1.0, 0.0]])
    ref = torch.tensor([[0.0, -1.5, -1.0, 0.0], [0.0, -0.5, 0.0, 0.0]])
    loss, _ = loss_fn(logp, logp.detach(), adv, mask, ref)
    assert loss.item() == pytest.approx(0.99, abs=1e-6)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[0, -0.48, -0.48, 0], [0, 1.04, 0, 0]]), atol=1e-6)
    # The recipe's k3 has zero gradient at pi = pi_ref: (s / k) (-A_i) / n_i = -0.5 and +1.0 are left.
    logp = logp.detach().clone().requires_grad_(True)
    instantiate(cfg.loss)(logp, logp.detach(), adv, mask, logp.detach())[0].backward()
    assert torch.allclose(logp.grad, torch.tensor([[0, -0.5, -0.5, 0], [0, 1.0, 0, 0]]), atol=1e-6)


@pytest.fixture
def base_dir(make_cfg):
    return instantiate(make_cfg().model).prepare()


def test_lora_policy_reference_is_the_base_with_adapters_disabled(base_dir):
    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)  # random B: moved
    source = PolicySource(path=str(base_dir), lora=lora)
    loss = PolicyLoss(ReinforceSurrogate(), kl_coef=0.1, kl_estimator="k1")
    module = GRPOModule(source, GRPOCredit(), loss, optimizer=lambda params: torch.optim.SGD(params, lr=0.1))
    base, tok = PolicySource(path=str(base_dir)).load()
    ids = torch.tensor([tok("12 + 3 = 15")["input_ids"]])
    batch = type("B", (), {"input_ids": ids, "attention_mask": torch.ones_like(ids), "temperature": 1.0})()
    assert module.reference is None  # no copy of the base
    assert torch.allclose(module.reference_logprobs(batch), token_logprobs(base, ids, torch.ones_like(ids))[0])
    assert not torch.allclose(module._logprobs(module.policy, batch)[0], module.reference_logprobs(batch))
    params = module.configure_optimizers().param_groups[0]["params"]
    names = {id(p): n for n, p in module.policy.named_parameters()}
    assert params and all("lora_" in names[id(p)] for p in params)


class ScriptedEngine:
    """Replies by role and line from ``script``, recording the active adapter and the prompt of every role's call."""

    def __init__(self, rows, script_fn=None):
        self.rows, self.model, self.calls, self.prompts = rows, None, [], []
        self.script = script_fn or script

    def bind(self, model, tokenizer):
        self.model, self.tok = model, tokenizer

    def update_weights(self, model):
        pass

    def sleep(self):
        pass

    def wake(self):
        pass

    def generate(self, prompts, sampling, seeds=None):
        out = []
        for ids in prompts:
            text = self.tok.decode(ids)
            role = next(r for r, instruction in INSTRUCTIONS.items() if instruction in text)
            row = next(r for r in self.rows if r["context"] + f"line {r['line']}" in text)
            x = None if role == "proposer" else int(text.split(f"line {row['line']}: ")[1].split("\n")[0].split("<")[0])
            self.calls.append((role, self.model.active_adapter))
            self.prompts.append((role, row["line"], x, text))
            replies = self.script(role, row, x)[:sampling.n]  # validation samples one (greedy)
            out.append([Completion(self.tok(r)["input_ids"] + [self.tok.eos_token_id], [0.0] * (len(self.tok(r)["input_ids"]) + 1), r)
                        for r in replies])
        return out


def script(role, row, x):
    """The proposer's two proposals per line (one right, one wrong), then the game's scripted roles
    (:func:`tests.tasks.dpa_script.script`)."""
    if role == "proposer":
        return [str(row["gold"]), str(row["gold"] + 1)]
    return game_script(role, row, str(x))


@pytest.fixture
def scripted_run(make_cfg):
    """A short run on the scripted engine: (module, engine, the first round's game record, its role batches, the
    weights before, trainer)."""
    def run(*overrides, script_fn=None):
        cfg = make_cfg(*SMALL, *overrides, fast_task=False)
        module, datamodule, trainer = build(cfg)
        datamodule.setup("fit")
        datamodule.experience.engine = ScriptedEngine([*datamodule.train_set, *datamodule.val_set], script_fn)
        records, batches = [], []
        play, role_batches = module.game.play, module.role_batches
        module.game.play = lambda *a, **k: records.append(play(*a, **k)) or records[-1]
        module.role_batches = lambda *a: batches.append(role_batches(*a)) or batches[-1]
        lora = {n: p.detach().clone() for n, p in module.policy.named_parameters()}
        trainer.fit(module, datamodule=datamodule)
        return module, datamodule.experience.engine, records[0], batches[0], lora, trainer

    return run


NO_EXPLORE = "game.explore_revise=0"  # the scripted runs below fix every decision (the game's tests cover exploration)


def by_case(record, batch, width=2):
    """{case: the batch's scores of that decision} (the loader's line order is random)."""
    return {CASES[int(record.cases[g])]: [round(r, 6) for r in s] for g, s in
            zip(batch.group_ids[::width].tolist(), batch.scores.view(-1, width).tolist())}


def test_scripted_round_trains_both_adapters_on_the_role_batches(scripted_run):
    module, engine, record, batches, before, trainer = scripted_run(NO_EXPLORE)
    # The round (the game's rules: tests/tasks/test_form_game.py): per line a right and a wrong proposal; cases
    # 1 (1a right, NS), 5a (1a wrong), 2 (15 right, no parsable revision), 6a (15 wrong, KEEP).
    assert sorted(CASES[c] for c in record.cases.tolist()) == ["1", "2", "5a", "6a"]
    verifier, approver, revisions = (batches[name][0] for name in ("verifier", "approver", "revisions"))
    assert list(batches) == ["verifier", "approver", "revisions"] and record.actions["approver"].paired
    assert [batches[name][1] for name in batches] == ["verifier", "approver", "reviser"]  # each set's role
    assert module.role_adapters == {"proposer": "generator", "verifier": "verifier", "reviser": "generator",
                                    "approver": "generator"}  # game.role_adapters (conf/game/form.yaml)
    # Role batches from the record: approver pairs from the table, its rarity weight in extras (no reward part).
    assert by_case(record, approver) == {"5a": [-0.3, 1.5], "2": [1.0, -0.25], "6a": [1.0, 0.0]}
    assert approver.extras["weight"].tolist() == [1.0] * 6 and "adv_bonus" not in approver.extras
    assert approver.reward_parts == {} and verifier.extras == {} and revisions.extras == {}
    # Canonical verifier actions as the role emits them: SAC the decision line and its newline, NS and end of turn.
    codec, gold = module.experience.codec, {r["line"]: r["gold"] for r in trainer.datamodule.train_set}
    line = record.actions["verifier"].actions[0].text.split('"')[3]
    sac, ns = (verifier.input_ids[i][verifier.response_mask[i].bool()].tolist() for i in (0, 1))
    assert sac == codec.line_ids(action_text(line, "SAC")) and ns == codec.reply_ids(action_text(line, "NS"))
    # The reviser pair: keep = x (gold + 1) and end of turn, revise = the shown z as sampled; pair credit +-1.
    actions = {}
    for i in range(len(revisions)):
        actions.setdefault(CASES[int(record.cases[int(revisions.group_ids[i])])], []).append(
            revisions.input_ids[i][revisions.response_mask[i].bool()].tolist())
    assert actions["5a"] == [codec.reply_ids(str(gold["1a"] + 1)), codec.reply_ids(str(gold["1a"]))]
    assert actions["6a"] == [codec.reply_ids(str(gold["15"] + 1))] * 2  # z = x: the pair's gradients cancel
    assert module.credit(revisions).parts["rollout"].tolist() == pytest.approx([-1.0, 1.0] * 2, abs=1e-6)
    assert verifier.temperature == approver.temperature == revisions.temperature == 1.0  # scored, not sampled
    # The credited sets of the step, in update order (verifier first; proposals: proposal_weight 0, not trained).
    assert [t.source for t in module.credit_trace] == ["verifier", "approver", "revisions"]
    assert module.credit_trace[1].cases.tolist() == record.cases[approver.group_ids].tolist()
    # Logged: the record's metrics, the proposals' reward, the losses and each optimiser's gradient norm.
    metrics = trainer.callback_metrics
    assert metrics["train/final/strict"].item() == pytest.approx(0.75)
    assert metrics["train/reward/strict"].item() == pytest.approx(0.5)  # the proposals alone
    assert metrics["train/dpa/sac_rate"].item() == pytest.approx(0.75)
    for key in ("loss/verifier", "loss/generator", "loss/kl/verifier", "loss/kl/approver", "loss/kl/revisions",
                "train/grad_norm/verifier", "train/grad_norm/generator", "train/proposal_logprob", "train/lr"):
        assert torch.isfinite(metrics[key]), key
    assert "loss/kl/proposals" not in metrics
    # Each role sampled with its own adapter; both adapters moved, the base did not; 2 optimiser steps a round.
    assert {role: a for role, a in engine.calls} == {"proposer": "generator", "verifier": "verifier",
                                                     "reviser": "generator", "approver": "generator"}
    after = dict(module.policy.named_parameters())
    moved = {n for n, p in after.items() if not torch.equal(p.detach(), before[n])}
    assert any(".verifier." in n for n in moved) and any(".generator." in n for n in moved)
    assert all("lora_" in n for n in moved) and trainer.global_step == 2


def test_group_revisions_get_the_population_std_group_credit(scripted_run):
    # game.revision_update=group, shown first: the revision group is 1a wrong's parsable revisions [gold+7, gold,
    # gold] -> S_z [0, 1, 1], scored at revision_temperature, not paired. Population std: mean 2/3, std sqrt(2/9) =
    # 0.4714045 -> A = [-2/3, 1/3, 1/3] / 0.4714045 = [-1.4142135, 0.7071068, 0.7071068] on each row's tokens.
    module, _e, record, batches, _b, _t = scripted_run(NO_EXPLORE, "game.shown_revision=first",
                                                       "game.revision_update=group")
    revisions, role = batches["revisions"]
    assert role == "reviser" and not record.actions["revisions"].paired
    assert revisions.scores.tolist() == [0.0, 1.0, 1.0]
    assert revisions.temperature == pytest.approx(0.7)
    trace = next(t for t in module.credit_trace if t.source == "revisions")
    mask = trace.batch.response_mask
    per_row = (trace.advantages * mask).sum(1) / mask.sum(1)
    assert per_row.tolist() == pytest.approx([-1.4142135, 0.7071068, 0.7071068], abs=1e-6)


def test_weight_and_advantage_bonus_enter_the_loss(make_cfg):
    # Two verifier-style pairs scored (1, 0): pair advantages A = +-1 on the action tokens. With the loss
    # (REINFORCE, seq-mean-token-sum over B = 4 rows) L = (1/B) sum_i w_i (-(A_i + b_i) S_i + beta KL_i), S_i the
    # summed log-prob of row i: a bonus b moves L by -(1/B) sum_i b_i S_i; a weight w scales each row's term, so
    # L(w) = sum_i w_i L(e_i), e_i the one-hot weights.
    module, _d, _t = build(make_cfg(*SMALL, fast_task=False))
    module.manual_backward = lambda loss: loss.backward()  # no trainer here; the gradients are not looked at
    codec = ChatCodec(module.tokenizer)
    prompt = codec.prompt_ids([{"role": "user", "content": "line 15: 37700"}])
    actions = [decision_action("15", d) for d in ("SAC", "NS")] * 2

    def loss(weight=None, bonus=None):
        acts = RoleActions("verifier", [prompt] * 4, actions, [0, 0, 1, 1], torch.tensor([1.0, 0.0, 1.0, 0.0]),
                           paired=True, weight=weight, adv_bonus=bonus)
        batch = role_batch(acts, codec)
        return module.action_backward(batch, "verifier")["loss/total"], batch

    base, batch = loss()
    with torch.no_grad():
        summed = (module._logprobs(module.policy, batch)[0] * batch.response_mask).sum(1)
    bonus = torch.tensor([0.0, 0.5, 0.0, 0.5])
    assert loss(bonus=bonus)[0] == pytest.approx(base - (bonus * summed).sum().item() / 4, rel=1e-5)
    one_hot = [loss(weight=torch.eye(4)[i])[0] for i in range(4)]
    assert sum(one_hot) == pytest.approx(base, rel=1e-5)
    weight = torch.tensor([2.0, 0.5, 1.0, 0.0])
    assert loss(weight=weight)[0] == pytest.approx(sum(w * v for w, v in zip(weight.tolist(), one_hot)), rel=1e-5)


def test_loss_reduction_sums_over_decisions(scripted_run):
    # The verifier's step comes first, before any update: same game, same weights. sum (official) = the pair mean
    # x the number of pairs (4 decisions) -> loss/verifier(sum) = 4 x loss/verifier(mean).
    *_, summed = scripted_run(NO_EXPLORE)
    *_, mean = scripted_run(NO_EXPLORE, "method.loss_reduction=mean")
    total, per = summed.callback_metrics["loss/verifier"].item(), mean.callback_metrics["loss/verifier"].item()
    assert per != 0 and total == pytest.approx(4 * per, rel=1e-5)


def test_bad_keys_name_the_key(make_cfg):
    for key, value in [("method.loss_reduction", "max"), ("method.roles", "three"), ("game.shown_revision", "best")]:
        with pytest.raises(InstantiationException, match=rf"{key}={value!r}: use"):
            build(make_cfg(*SMALL, f"{key}={value}", fast_task=False))


def test_no_game_is_refused_at_setup(make_cfg):
    module, _d, _t = build(make_cfg(*SMALL, "~game", fast_task=False))
    with pytest.raises(ValueError, match="select it with game=form"):
        module.setup("fit")


def test_the_exploration_generator_is_checkpointed(make_cfg):
    module, _d, _t = build(make_cfg(*SMALL, fast_task=False))
    assert isinstance(module.game, FormGame) and module.random_sources() == {"module": module, "game": module.game}
    module.game._explore.random()  # moved off its seed: the checkpoint holds this state
    saved = capture_rng(module.random_sources())["private"]
    assert saved["game._explore"] == module.game._explore.getstate()


def test_validation_plays_the_game_greedily(scripted_run):
    module, _engine, _record, _batches, _before, trainer = scripted_run()
    trainer.limit_val_batches = 1.0  # the training run above skipped validation
    metrics = trainer.validate(module, datamodule=trainer.datamodule, verbose=False)[0]
    # Greedy: one proposal per line, the script's first (the gold value), one revision. 1a right -> NS (case 1);
    # 15 right -> SAC, the revision "n/a" unparsable, REVISE -> x is kept (case 2). Both lines end right.
    lines = [r["line"] for r in trainer.datamodule.val_set]
    share_1a = lines.count("1a") / len(lines)
    assert metrics["val/final/strict"] == pytest.approx(1.0)
    assert metrics["val/dpa/case/1"] == pytest.approx(share_1a)
    assert metrics["val/dpa/case/2"] == pytest.approx(1 - share_1a)
    assert metrics["val/dpa/sac_rate"] == pytest.approx(1 - share_1a)
    assert "val/dpa/revise_bonus" not in metrics and "val/zero_variance_groups" not in metrics


def test_shared_roles_use_one_adapter(scripted_run):
    module, engine, *_ = scripted_run("method.roles=shared")
    assert {a for _, a in engine.calls} == {"generator"}
    assert "verifier" not in module.policy.peft_config
    opt = module.optimizers()  # one adapter: one optimiser, one step on generator + 0.5 x verifier loss
    assert not isinstance(opt, list) and len(opt.param_groups[0]["params"]) == len(module.adapter_params("generator"))


def test_dpa_needs_a_lora_policy(make_cfg):
    cfg = make_cfg(*SMALL, "model.lora=null", fast_task=False)
    with pytest.raises(InstantiationException, match="model/lora=r8"):
        build(cfg)


def test_dpa_module_is_a_policy_module():
    assert issubclass(DPAGRPOModule, PolicyModule) and not issubclass(DPAGRPOModule, GRPOModule)
    assert issubclass(DPAGRPOModule, L.LightningModule)


def test_grpo_form_is_the_papers_grpo_row(make_cfg):
    # The official baseline: groups of 2, population std, REINFORCE on sequence-summed log-probs, k1 KL beta 0.04,
    # one update per batch. A group scoring [1, 0]: mean 0.5, population std 0.5 -> A = +-0.5 / (0.5 + 1e-8) = +-1.
    from tests.credit.common import make_batch

    cfg = make_cfg("experiment=grpo_form", "model.embedded.sft_steps=0", "task.num_train=1", "task.num_test=2",
                   fast_task=False)
    module, datamodule, _trainer = build(cfg)
    loss = module.loss
    assert isinstance(loss.surrogate, ReinforceSurrogate) and loss.aggregation == "seq-mean-token-sum"
    assert (loss.kl_coef, loss.kl_estimator) == (0.04, "k1")
    assert (module.ppo_epochs, module.num_minibatches, datamodule.experience.sampling.n) == (1, 1, 2)
    batch = make_batch(torch.ones(2, 3), torch.tensor([0, 0]), torch.tensor([1.0, 0.0]))
    assert module.credit(batch).parts["rollout"].tolist() == pytest.approx([1.0, -1.0], abs=1e-7)
    # log-probs at T = 1 (the official completion_logprob_sum: log_softmax(logits)) of proposals sampled at
    # T 0.8: the trainer's log-probs of a batch that carries temperature 0.8 are those of softmax(logits / 1)
    assert (module.logprob_temperature, datamodule.experience.sampling.temperature) == (1.0, 0.8)
    tokens = replace(batch, input_ids=torch.tensor([[5, 6, 7], [7, 6, 5]]), temperature=0.8)
    want = token_logprobs(module.policy, tokens.input_ids, tokens.attention_mask, None, temperature=1.0)[0]
    torch.testing.assert_close(module._logprobs(module.policy, tokens)[0], want)
    tempered = token_logprobs(module.policy, tokens.input_ids, tokens.attention_mask, None, temperature=0.8)[0]
    assert not torch.allclose(want, tempered)
    with pytest.raises(ValueError, match=r"method\.logprob_temperature=0\.0: must be > 0"):
        GRPOModule(module.source, module.credit, module.loss, logprob_temperature=0.0)
