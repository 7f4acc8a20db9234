"""DPA-GRPO (docs/methods.md §3): the loss by hand, LoRA roles and reference, and one scripted game end to
end.

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

    def generate(self, prompts, sampling):
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
    """Decisions by (line, x right): 1a right -> NS (case 1); 1a wrong -> SAC, revisions [unparsable, wrong, right,
    right, unparsable] (first 0, first parsable 1, first right 2), REVISE (5a with gold_first); 15 right -> SAC, no
    parsable revision, REVISE (2); 15 wrong -> SAC, all revisions x again (wrong), KEEP (6a)."""
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
            return ["n/a", str(gold + 7), str(gold), str(gold), "n/a"]
        return ["n/a"] * 5 if right else [str(gold + 1)] * 5
    decision = "REVISE" if (line == "1a" or right) else "KEEP"
    return [action_text(line, decision)]


@pytest.fixture
def scripted_run(make_cfg):
    def run(*overrides, script_fn=None):
        cfg = make_cfg(*SMALL, *overrides, fast_task=False)
        module, datamodule, trainer = build(cfg)
        datamodule.setup("fit")
        datamodule.engine = ScriptedEngine([*datamodule.train_set, *datamodule.val_set], script_fn)
        games = []
        play = module.play
        module.play = lambda *a, **k: games.append(play(*a, **k)) or games[-1]
        lora = {n: p.detach().clone() for n, p in module.policy.named_parameters()}
        trainer.fit(module, datamodule=datamodule)
        return module, datamodule.engine, games[0], lora, trainer

    return run


NO_EXPLORE = "method.explore_revise=0"  # the scripted tests below fix every decision (exploration has its own test)


def by_case(game, batch, width=2):
    """{case: the batch's scores of that decision} (the loader's line order is random)."""
    return {CASES[int(game.cases[g])]: [round(r, 6) for r in s] for g, s in
            zip(batch.group_ids[::width].tolist(), batch.scores.view(-1, width).tolist())}


def test_scripted_game_rewards_cases_and_updates(scripted_run):
    module, engine, game, before, trainer = scripted_run(NO_EXPLORE)
    x_right = game.x_correct.tolist()
    assert x_right == [True, False, True, False]  # proposals: gold, gold + 1 for each of the 2 lines
    # The loader's order of the two lines is random; the cases are therefore compared as a set.
    assert sorted(CASES[c] for c in game.cases.tolist()) == ["1", "2", "5a", "6a"]
    # Verifier pairs (SAC, NS) for all 4 decisions (every x parsable): right x -> (0, 1), wrong x -> (1, 0).
    pairs = game.verifier.scores.view(-1, 2)
    assert pairs.tolist() == [[0.0, 1.0] if r else [1.0, 0.0] for r in x_right]
    # Approver pairs (KEEP, REVISE), one per challenged decision, from the approver table (alpha .5, cave .2, miss .3):
    # 1a wrong, shown z right (gold_first picks revision 2 of [n/a, gold+7, gold, gold, n/a]): (-miss, 1 + alpha)
    # = (-0.3, 1.5); 15 right, no parsable revision: (1, -0.25); 15 wrong, z wrong: (1, alpha * 0) = (1, 0).
    # The REVISE bonus: REVISE share 2/3 >= target 0.3 -> 1.5 * max(0.3 - 2/3, 0) = 0.
    assert by_case(game, game.approver) == {"5a": [-0.3, 1.5], "2": [1.0, -0.25], "6a": [1.0, 0.0]}
    assert game.counts["revise_bonus"] == 0.0
    # Rarity over the challenged decisions by official case id: 5a -> 5, 2 -> 2, 6a -> 6, one each: mean 1 -> 1 each.
    assert game.approver.reward_parts["weight"].tolist() == [1.0] * 6
    assert "weight" not in game.verifier.reward_parts and "weight" not in game.revisions.reward_parts
    # The reviser's paired update (keep text x, revise text the shown z) on the challenged decisions with a parsable
    # z (15 right has none: skipped): x wrong -> keep 1[x right] + 0.5 S_x = 0, revise 1[x wrong] + 0.5 S_z:
    # 1a (z right) 1.5, 15 (z = x, wrong) 1.0. Pair advantages: revise text +1, keep text -1 on both.
    assert game.revisions_paired and by_case(game, game.revisions) == {"5a": [0.0, 1.5], "6a": [0.0, 1.0]}
    assert module.credit(game.revisions).parts["rollout"].tolist() == pytest.approx([-1.0, 1.0] * 2, abs=1e-6)
    # The pair's actions as the reviser emits them: keep = x (gold + 1) and end of turn, revise = the shown z as sampled.
    codec, rev = module.rollouts.codec, game.revisions
    gold = {r["line"]: r["gold"] for r in trainer.datamodule.train_set}
    actions = {}
    for i in range(len(rev)):
        actions.setdefault(CASES[int(game.cases[int(rev.group_ids[i])])], []).append(
            rev.input_ids[i][rev.response_mask[i].bool()].tolist())
    assert actions["5a"] == [codec.reply_ids(str(gold["1a"] + 1)), codec.reply_ids(str(gold["1a"]))]
    assert actions["6a"] == [codec.reply_ids(str(gold["15"] + 1))] * 2  # z = x: the pair's gradients cancel
    # Scored actions and the reviser pair: log-probs at T = 1 (as the official code scores them).
    assert game.verifier.temperature == game.approver.temperature == game.revisions.temperature == 1.0
    metrics = trainer.callback_metrics
    # Final values: case 1 x (right), 5a z (right), 2 x (right: no revision to take), 6a x (wrong) -> 3/4.
    assert metrics["train/final/strict"].item() == pytest.approx(0.75)
    assert metrics["train/reward/strict"].item() == pytest.approx(0.5)  # the proposals alone
    assert metrics["train/dpa/sac_rate"].item() == pytest.approx(0.75)
    assert metrics["train/dpa/revise_rate"].item() == pytest.approx(2 / 3)
    assert metrics["train/dpa/forced_revise_rate"].item() == 0.0
    assert metrics["train/dpa/shown_correct"].item() == pytest.approx(1 / 3)  # 1a's shown z; 15's two are not
    assert metrics["train/dpa/verifier_acc"].item() == pytest.approx(0.75)  # 15-right was challenged
    assert metrics["train/dpa/unparsable/revision"].item() == pytest.approx(7 / 15)  # 2 + 5 + 0 of 15
    assert sum(metrics[f"train/dpa/case/{c}"].item() for c in CASES) == pytest.approx(1.0)
    # Each role sampled with its own adapter; both adapters moved, the base did not.
    assert {role: a for role, a in engine.calls} == {"proposer": "generator", "verifier": "verifier",
                                                     "reviser": "generator", "approver": "generator"}
    after = dict(module.policy.named_parameters())
    moved = {n for n, p in after.items() if not torch.equal(p.detach(), before[n])}
    assert any(".verifier." in n for n in moved) and any(".generator." in n for n in moved)
    assert all("lora_" in n for n in moved)


def test_shown_revision_first_parsable_and_first(scripted_run):
    # 1a wrong's revisions [n/a, gold+7, gold, gold, n/a]. first_parsable shows gold+7 (wrong): the REVISE is 5b and
    # the approver pair (1, alpha * 0) = (1, 0); first shows "n/a": no parsable revision, (1, -0.25), and no
    # reviser pair for 1a (skip_unparsable_revisions).
    _m, _e, game, _b, _t = scripted_run(NO_EXPLORE, "method.shown_revision=first_parsable")
    assert by_case(game, game.approver) == {"5b": [1.0, 0.0], "2": [1.0, -0.25], "6a": [1.0, 0.0]}
    assert by_case(game, game.revisions) == {"5b": [0.0, 1.0], "6a": [0.0, 1.0]}  # revise 1[x wrong] + 0.5 * 0
    _m, _e, game, _b, _t = scripted_run(NO_EXPLORE, "method.shown_revision=first")
    assert by_case(game, game.approver) == {"5b": [1.0, -0.25], "2": [1.0, -0.25], "6a": [1.0, 0.0]}
    assert by_case(game, game.revisions) == {"6a": [0.0, 1.0]}


def test_the_later_official_commit_group_revisions(scripted_run):
    # shown_revision=first, revision_update=group, no approver pair without a parsable shown revision: the approver
    # trains only on 15 wrong (z = x, wrong: (1, 0)); the revision group is 1a's parsable revisions
    # [gold+7, gold, gold] -> S_z [0, 1, 1] (15 wrong's all 0: skipped; 15 right's all unparsable: none), scored at
    # revision_temperature; with the unparsable ones kept: [-0.25, 0, 1, 1, -0.25].
    args = (NO_EXPLORE, "method.shown_revision=first", "method.revision_update=group",
            "method.train_approver_without_revision=false")
    module, _e, game, _b, _t = scripted_run(*args)
    assert by_case(game, game.approver) == {"6a": [1.0, 0.0]}
    assert not game.revisions_paired and game.revisions.scores.tolist() == [0.0, 1.0, 1.0]
    assert game.revisions.temperature == pytest.approx(0.7)
    # population std: [0, 1, 1] mean 2/3, std sqrt(2/9) = 0.4714045 -> A = [-2/3, 1/3, 1/3] / 0.4714045
    a = module.group_credit(game.revisions).parts["rollout"]
    assert a.tolist() == pytest.approx([-1.4142135, 0.7071068, 0.7071068], abs=1e-6)
    _m, _e, game, _b, _t = scripted_run(*args, "method.skip_unparsable_revisions=false")
    assert game.revisions.scores.tolist() == [-0.25, 0.0, 1.0, 1.0, -0.25]


def unparsable_verifier(role, row, x):
    """The script, but the verifier's reply on 1a right is not a decision."""
    if role == "verifier" and row["line"] == "1a" and x == row["gold"]:
        return ["looks fine to me"]
    return script(role, row, x)


def test_unparsable_verdict_counts_as_sac(scripted_run):
    # 1a right's unparsable verdict is a challenge (official): the reviser sees an empty challenge, the approver
    # REVISEs (1a) -> case 2 instead of 1; SAC on all 4 decisions.
    _m, engine, game, _b, trainer = scripted_run(NO_EXPLORE, script_fn=unparsable_verifier)
    assert sorted(CASES[c] for c in game.cases.tolist()) == ["2", "2", "5a", "6a"]
    metrics = trainer.callback_metrics
    assert metrics["train/dpa/sac_rate"].item() == 1.0
    assert metrics["train/dpa/unparsable/verifier"].item() == pytest.approx(0.25)
    empty = 'challenge: {"claim": "", "argument": "", "evidence": ""}'
    assert any(role == "reviser" and line == "1a" and empty in text for role, line, _x, text in engine.prompts)
    _m, _e, game, _b, _t = scripted_run(NO_EXPLORE, "method.unparsable_verdict=NS", script_fn=unparsable_verifier)
    assert sorted(CASES[c] for c in game.cases.tolist()) == ["1", "2", "5a", "6a"]


def test_forced_revise_exploration_and_rarity(scripted_run):
    # explore_revise=1: every challenged decision that is not REVISE (15 wrong's KEEP) is forced to REVISE: 6a -> 5b.
    # The forced REVISE counts: REVISE share 3/3, forced 1/3, final 15 wrong takes z (gold + 1, wrong).
    # Rarity over the challenged decisions by official case id: 5a, 5b -> 5 (2), 2 -> 2 (1): mean 3/2 ->
    # weights 5a, 5b: (3/2) / 2 = 0.75, case 2: 1.5 (a pair's two rows share it).
    _m, _e, game, _b, trainer = scripted_run("method.explore_revise=1.0")
    assert sorted(CASES[c] for c in game.cases.tolist()) == ["1", "2", "5a", "5b"]
    metrics = trainer.callback_metrics
    assert metrics["train/dpa/revise_rate"].item() == 1.0
    assert metrics["train/dpa/forced_revise_rate"].item() == pytest.approx(1 / 3)
    assert metrics["train/final/strict"].item() == pytest.approx(0.75)
    weights = {CASES[int(game.cases[g])]: w for g, w in
               zip(game.approver.group_ids.tolist(), game.approver.reward_parts["weight"].tolist())}
    assert weights == pytest.approx({"5a": 0.75, "5b": 0.75, "2": 1.5})


def test_revise_bonus_on_the_reward_or_the_advantage(scripted_run):
    # 2 of the 3 challenged decisions REVISE (share 2/3); target 1, balance 1.5 -> bonus 1.5 * (1 - 2/3) = 0.5.
    # On the reward (official): REVISE scores + 0.5: 5a (-0.3, 2.0), 2 (1, 0.25), 6a (1, 0.5); the pair advantages
    # stay +-1 (the bonus never flips a pair of this table); on the advantage: +0.5 on each REVISE row.
    shaping = (NO_EXPLORE, "method.revise_balance=1.5", "method.revise_target=1.0")
    module, _e, game, _b, _t = scripted_run(*shaping)
    assert by_case(game, game.approver) == {"5a": [-0.3, 2.0], "2": [1.0, 0.25], "6a": [1.0, 0.5]}
    assert game.counts["revise_bonus"] == pytest.approx(0.5) and "adv_bonus" not in game.approver.reward_parts
    signs = module.credit(game.approver).parts["rollout"].view(-1, 2).round().tolist()
    assert {CASES[int(game.cases[g])]: s for g, s in zip(game.approver.group_ids[::2].tolist(), signs)} == \
        {"5a": [-1.0, 1.0], "2": [1.0, -1.0], "6a": [1.0, -1.0]}
    _m, _e, game, _b, _t = scripted_run(*shaping, "method.revise_bonus_on=advantage")
    assert game.approver.reward_parts["adv_bonus"].tolist() == pytest.approx([0.0, 0.5] * 3)
    assert by_case(game, game.approver) == {"5a": [-0.3, 1.5], "2": [1.0, -0.25], "6a": [1.0, 0.0]}


def test_loss_reduction_sums_over_decisions(scripted_run):
    # The verifier's step comes first, before any update: same game, same weights. sum (official) = the pair mean
    # x the number of pairs (4 decisions) -> loss/verifier(sum) = 4 x loss/verifier(mean).
    _m, _e, _g, _b, summed = scripted_run(NO_EXPLORE)
    _m, _e, _g, _b, mean = scripted_run(NO_EXPLORE, "method.loss_reduction=mean")
    total, per = summed.callback_metrics["loss/verifier"].item(), mean.callback_metrics["loss/verifier"].item()
    assert per != 0 and total == pytest.approx(4 * per, rel=1e-5)


def test_bad_keys_name_the_key(make_cfg):
    for key, value in [("shown_revision", "best"), ("unparsable_verdict", "KEEP"), ("revision_update", "both"),
                       ("revise_bonus_on", "loss"), ("loss_reduction", "max")]:
        with pytest.raises(InstantiationException, match=f"method.{key}={value!r}: use one of"):
            build(make_cfg(*SMALL, f"method.{key}={value}", fast_task=False))


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
    assert (module.ppo_epochs, module.num_minibatches, datamodule.sampling.n) == (1, 1, 2)
    batch = make_batch(torch.ones(2, 3), torch.tensor([0, 0]), torch.tensor([1.0, 0.0]))
    assert module.credit(batch).parts["rollout"].tolist() == pytest.approx([1.0, -1.0], abs=1e-7)
