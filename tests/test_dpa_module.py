"""DPA-GRPO (methods.md §3): the loss by hand, LoRA roles and reference, and one scripted game end to end.

The game test drives the real module, Trainer, tokenizer and LoRA policy with a scripted engine (a unit-test
stand-in: every role's reply is fixed by the script below), so every reward, case and group is known.
"""
from __future__ import annotations

import lightning as L
import pytest
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from peft import LoraConfig

from lit_credit.credit import GRPOCredit
from lit_credit.losses import PolicyLoss, ReinforceSurrogate
from lit_credit.methods import DPAGRPOModule, GRPOModule
from lit_credit.models import PolicySource, token_logprobs
from lit_credit.rewards import CASES
from lit_credit.tasks.form import INSTRUCTIONS, action_text, challenge_text
from lit_credit.train import build
from lit_credit.types import Completion

SMALL = ["experiment=dpa_form", "model.embedded.sft_steps=0", "task.num_train=1", "task.num_test=2",
         "task.lines=[1a,15]", "data.prompts_per_step=2", "data.sampling.n=2", "trainer.max_steps=1",
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


@pytest.fixture
def base_dir(make_cfg):
    return instantiate(make_cfg().model).resolve()


def test_lora_policy_reference_is_the_base_with_adapters_disabled(base_dir):
    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)  # random B: moved
    source = PolicySource(path=str(base_dir), lora=lora)
    loss = PolicyLoss(ReinforceSurrogate(), kl_coef=0.1, kl_estimator="k1")
    module = GRPOModule(source, GRPOCredit(), loss, optimizer=lambda params: torch.optim.SGD(params, lr=0.1))
    base, tok = PolicySource(path=str(base_dir)).load()
    ids = torch.tensor([tok("12 + 3 = 15")["input_ids"]])
    batch = type("B", (), {"input_ids": ids, "attention_mask": torch.ones_like(ids)})()
    assert module.reference is None  # no copy of the base
    assert torch.allclose(module.reference_logprobs(batch), token_logprobs(base, ids, torch.ones_like(ids))[0])
    assert not torch.allclose(module._logprobs(module.policy, batch)[0], module.reference_logprobs(batch))
    params = module.configure_optimizers().param_groups[0]["params"]
    names = {id(p): n for n, p in module.policy.named_parameters()}
    assert params and all("lora_" in names[id(p)] for p in params)


class ScriptedEngine:
    """Replies by role and line from SCRIPT, recording the active adapter of every role's call."""

    def __init__(self, rows):
        self.rows, self.model, self.calls = rows, None, []

    def bind(self, model, tokenizer):
        self.model, self.tok = model, tokenizer

    def update_weights(self, model):
        pass

    def sleep(self):
        pass

    def wake(self):
        pass

    def generate(self, prompts, sampling):
        out = []
        for ids in prompts:
            text = self.tok.decode(ids)
            role = next(r for r, instruction in INSTRUCTIONS.items() if instruction in text)
            row = next(r for r in self.rows if r["context"] + f"line {r['line']}" in text)
            x = None if role == "proposer" else int(text.split(f"line {row['line']}: ")[1].split("\n")[0].split("<")[0])
            self.calls.append((role, self.model.active_adapter))
            replies = script(role, row, x)[:sampling.n]  # validation samples one (greedy)
            out.append([Completion(self.tok(r)["input_ids"] + [self.tok.eos_token_id], [0.0] * (len(self.tok(r)["input_ids"]) + 1), r)
                        for r in replies])
        return out


def script(role, row, x):
    """Decisions by (line, x right): 1a right -> NS (case 1); 1a wrong -> SAC, revisions right but one unparsable,
    REVISE (5a); 15 right -> SAC, no parsable revision, REVISE (2); 15 wrong -> SAC, all revisions the same wrong
    value, KEEP (6a)."""
    gold, line = row["gold"], row["line"]
    if role == "proposer":
        return [str(gold), str(gold + 1)]  # one right, one wrong proposal per line
    right = x == gold
    if role == "verifier":
        if line == "1a" and right:
            return [action_text(line, "NS")]
        return [action_text(line, "SAC") + "\n" + challenge_text({"claim": str(gold)})]
    if role == "reviser":
        if line == "1a":
            return [str(gold), str(gold), "n/a", str(gold + 7), str(gold)]
        return ["n/a"] * 5 if right else [str(gold + 1)] * 5
    decision = "REVISE" if (line == "1a" or right) else "KEEP"
    return [action_text(line, decision)]


@pytest.fixture
def scripted_run(make_cfg):
    def run(*overrides):
        cfg = make_cfg(*SMALL, *overrides, fast_task=False)
        module, datamodule, trainer = build(cfg)
        datamodule.setup("fit")
        datamodule.engine = ScriptedEngine([*datamodule.train_set, *datamodule.val_set])
        games = []
        play = module.play
        module.play = lambda *a, **k: games.append(play(*a, **k)) or games[-1]
        lora = {n: p.detach().clone() for n, p in module.policy.named_parameters()}
        trainer.fit(module, datamodule=datamodule)
        return module, datamodule.engine, games[0], lora, trainer

    return run


def test_scripted_game_rewards_cases_and_updates(scripted_run):
    module, engine, game, before, trainer = scripted_run()
    x_right = game.x_correct.tolist()
    assert x_right == [True, False, True, False]  # proposals: gold, gold + 1 for each of the 2 lines
    # The loader's order of the two lines is random; the cases are therefore compared as a set.
    by_case = sorted(CASES[c] for c in game.cases.tolist())
    assert by_case == ["1", "2", "5a", "6a"]
    # Verifier pairs (SAC, NS) for all 4 decisions (every x parsable): right x -> (0, 1), wrong x -> (1, 0).
    pairs = game.verifier.scores.view(-1, 2)
    assert pairs.tolist() == [[0.0, 1.0] if r else [1.0, 0.0] for r in x_right]
    # Approver pairs (KEEP, REVISE), one per challenged decision, from the approver table (alpha .5, cave .2, miss .3):
    # 1a wrong, z right: (-miss, 1 + alpha) = (-0.3, 1.5); 15 right, no parsable revision: (1, -0.25);
    # 15 wrong, z wrong: (1, alpha * 0) = (1, 0).
    approver = {CASES[int(game.cases[g])]: [round(r, 6) for r in s] for g, s in
                zip(game.approver.group_ids[::2].tolist(), game.approver.scores.view(-1, 2).tolist())}
    assert approver == {"5a": [-0.3, 1.5], "2": [1.0, -0.25], "6a": [1.0, 0.0]}
    # Revision groups: only 1a-wrong's rewards differ ([1, 1, -0.25, 0, 1]); all-unparsable and all-wrong skipped.
    assert game.revisions.scores.tolist() == [1.0, 1.0, -0.25, 0.0, 1.0]
    assert CASES[int(game.cases[int(game.revisions.group_ids[0])])] == "5a"
    metrics = trainer.callback_metrics
    # Final values: case 1 x (right), 5a z (right), 2 x (right: no revision to take), 6a x (wrong) -> 3/4.
    assert metrics["train/final/strict"].item() == pytest.approx(0.75)
    assert metrics["train/dpa/sac_rate"].item() == pytest.approx(0.75)
    assert metrics["train/dpa/revise_rate"].item() == pytest.approx(2 / 3)
    assert metrics["train/dpa/verifier_acc"].item() == pytest.approx(0.75)  # 15-right was challenged
    assert metrics["train/dpa/unparsable/revision"].item() == pytest.approx(6 / 15)
    assert sum(metrics[f"train/dpa/case/{c}"].item() for c in CASES) == pytest.approx(1.0)
    # Each role sampled with its own adapter; both adapters moved, the base did not.
    assert {role: a for role, a in engine.calls} == {"proposer": "generator", "verifier": "verifier",
                                                     "reviser": "generator", "approver": "generator"}
    after = dict(module.policy.named_parameters())
    moved = {n for n, p in after.items() if not torch.equal(p.detach(), before[n])}
    assert any(".verifier." in n for n in moved) and any(".generator." in n for n in moved)
    assert all("lora_" in n for n in moved)


def test_validation_plays_the_game_greedily(scripted_run):
    module, _engine, _game, _before, trainer = scripted_run()
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


def test_canonical_actions_are_what_the_roles_emit(scripted_run):
    module, *_ = scripted_run()
    codec = module.rollouts.codec
    ns = module.action_ids("15", "NS")
    assert ns == codec.reply_ids(action_text("15", "NS")) and ns[-1] == codec.eos_id  # NS ends the reply
    sac = module.action_ids("15", "SAC")  # SAC goes on with the challenge: a strict prefix of the whole reply
    reply = codec.reply_ids(action_text("15", "SAC") + "\n" + challenge_text({"claim": "1"}))
    assert reply[:len(sac)] == sac and len(reply) > len(sac) and codec.eos_id not in sac


def test_revise_bonus_goes_on_the_revise_advantage(scripted_run):
    # 2 of the 3 challenged decisions REVISE (share 2/3); target 1, balance 1.5 -> bonus 1.5 * (1 - 2/3) = 0.5
    _module, _engine, game, _before, _ = scripted_run("method.revise_balance=1.5", "method.revise_target=1.0")
    assert game.approver.reward_parts["adv_bonus"].tolist() == pytest.approx([0.0, 0.5] * 3)


def test_shared_roles_use_one_adapter(scripted_run):
    module, engine, _game, _before, _ = scripted_run("method.roles=shared")
    assert {a for _, a in engine.calls} == {"generator"}
    assert "verifier" not in module.policy.peft_config
    opt = module.optimizers()  # one adapter: one optimiser, one step on generator + 0.5 x verifier loss
    assert not isinstance(opt, list) and len(opt.param_groups[0]["params"]) == len(module.adapter_params("generator"))


def test_dpa_needs_a_lora_policy(make_cfg):
    cfg = make_cfg(*SMALL, "model.lora=null", fast_task=False)
    with pytest.raises(InstantiationException, match="model/lora=r8"):
        build(cfg)


def test_dpa_module_is_a_grpo_module():
    assert issubclass(DPAGRPOModule, GRPOModule) and issubclass(DPAGRPOModule, L.LightningModule)
