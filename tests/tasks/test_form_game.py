"""The form task's DPA game (lit_credit.tasks.form_game) played with a scripted actor: no model, no Trainer.

Two lines, each proposed right (x = gold) and wrong (x = gold + 1): decisions 0..3 = 1a right, 1a wrong,
15 right, 15 wrong. The script fixes every role's reply, so every flag, case, reward and row is known by hand:

* verifier: NS on 1a right, SAC with a challenge elsewhere;
* reviser (K = 5): 1a -> [n/a, gold+7, gold, gold, n/a] (first 0, first parsable 1, first right 2);
  15 right -> all n/a; 15 wrong -> all gold + 1 (= x, wrong);
* approver: REVISE on 1a and on a right x, KEEP on 15 wrong.
"""
from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from lit_credit.interfaces import Game
from lit_credit.rewards import CASES, DPASettings, FormLineReward
from lit_credit.rollout.loop import Trajectory, to_batch
from lit_credit.tasks.form import INSTRUCTIONS, action_text
from lit_credit.tasks.form_game import ROLE_ADAPTERS, FormGame, FormGameRecord, decision_action
from lit_credit.train import CONF_DIR
from lit_credit.types import Action, Completion, GameRecord, SamplingParams
from tests.tasks.dpa_script import script

ROWS = [{"context": "single | w2 52300/4100\n", "line": "1a", "gold": 52300},
        {"context": "single | w2 52300/4100\nform: 1a 52300, 11 52300, 12 14600\n", "line": "15", "gold": 37700}]
SAMPLING = SamplingParams(n=2, temperature=0.8, top_p=0.95, max_new_tokens=10, stop=("\n",))
ROLE_ID = {"verifier": 1, "reviser": 2, "approver": 3}


def proposals(xs=None):
    """The scored proposals: 1a right, 1a wrong, 15 right, 15 wrong (the form oracle's parts)."""
    xs = xs or [str(r["gold"] + d) for r in ROWS for d in (0, 1)]
    rows = [r for r in ROWS for _ in range(2)]
    reward = FormLineReward()
    episodes = []
    for i, (row, x) in enumerate(zip(rows, xs)):
        ep = Trajectory(row=row, group=i // 2, token_ids=[7, 7])
        ep.add_reply(Completion([9], [0.0], x), 0)
        episodes.append(ep)
    return to_batch(episodes, [reward(row, [x]) for row, x in zip(rows, xs)], pad_id=0)


class ScriptedActor:
    """Replies from ``script_fn`` by role, line and x; prompt ids ``[role id, call's prompt index]``; completion
    k of a prompt has token ids ``[100 + k]`` and log-prob ``-0.1 (k + 1)``. Records every call."""

    def __init__(self, script_fn=script):
        self.script, self.calls = script_fn, []

    def __call__(self, role, messages, sampling):
        assert messages is not None
        self.calls.append((role, [m[1]["content"] for m in messages], sampling))
        prompts, outs = [], []
        for j, m in enumerate(messages):
            assert m[0]["content"] == INSTRUCTIONS[role]
            text = m[1]["content"]
            row = next(r for r in ROWS if text.startswith(r["context"] + f"line {r['line']}:"))
            x = text.split(f"line {row['line']}: ")[1].split("\n")[0]
            replies = self.script(role, row, x)[:sampling.n]
            prompts.append([ROLE_ID[role], j])
            outs.append([Completion([100 + k], [-0.1 * (k + 1)], r) for k, r in enumerate(replies)])
        return prompts, outs


def play(*, actor=None, training=True, **keys):
    keys = {"explore_revise": 0.0, **keys}  # every decision scripted (exploration has its own tests)
    game, actor = FormGame(**keys), actor or ScriptedActor()
    return game.play(proposals(), actor, SAMPLING, training), actor, game


def cases(record):
    return [CASES[c] for c in record.cases.tolist()]


def test_the_game_is_a_game():
    """FormGame is a Game, and its record the GameRecord a method reads (the role actions by set, the cases)."""
    assert isinstance(FormGame(), Game) and FormGame.roles == ("proposer", "verifier", "reviser", "approver")
    record, _, _ = play()
    assert isinstance(record, FormGameRecord) and isinstance(record, GameRecord)
    assert list(record.actions) == ["verifier", "approver", "revisions"] and len(record.cases) == 4


def test_scripted_round_flags_cases_and_final_values():
    record, actor, _ = play()
    assert record.x_correct.tolist() == [True, False, True, False]
    assert record.challenged.tolist() == [False, True, True, True]  # NS only on 1a right
    # gold_first: 1a wrong shows revision 2 (right); 15 right has no parsable one; 15 wrong shows gold + 1.
    assert record.has_revision.tolist() == [False, True, False, True]
    assert record.z_correct.tolist() == [False, True, False, False]
    assert record.revised.tolist() == [False, True, True, False]
    # 1 (right, NS), 5a (wrong, SAC, REVISE, z right), 2 (right, SAC, REVISE), 6a (wrong, SAC, KEEP, z wrong)
    assert cases(record) == ["1", "5a", "2", "6a"]
    # Final: x, z (right), x (REVISE without a parsable z keeps x), x (wrong) -> 3/4.
    assert record.final_strict.tolist() == [True, True, True, False]
    m = record.metrics("train")
    assert m["train/final/strict"] == pytest.approx(0.75)
    assert m["train/final/lenient"] == 1.0  # x = gold + 1 is within $5: every final value is lenient-right
    assert m["train/dpa/sac_rate"] == pytest.approx(0.75)
    assert m["train/dpa/revise_rate"] == pytest.approx(2 / 3)
    assert m["train/dpa/verifier_acc"] == pytest.approx(0.75)  # 15 right was challenged
    assert m["train/dpa/unparsable/revision"] == pytest.approx(7 / 15)  # 2 + 5 + 0 of 15
    assert m["train/dpa/revision_correct"] == pytest.approx(2 / 15)  # 1a's two golds
    assert m["train/dpa/shown_correct"] == pytest.approx(1 / 3)
    assert m["train/dpa/forced_revise_rate"] == 0.0 and m["train/dpa/revise_bonus"] == 0.0  # share 2/3 >= 0.3
    assert m["train/dpa/case/1"] == m["train/dpa/case/5a"] == m["train/dpa/case/2"] == m["train/dpa/case/6a"] == 0.25
    # The actor: verifier (4 prompts, one reply each, role_max_new_tokens, no stop), reviser (the 3 challenged,
    # K = 5 at revision_temperature), approver (the 3 challenged); the approver sees the shown revision.
    (v, v_msgs, v_s), (r, r_msgs, r_s), (a, a_msgs, a_s) = actor.calls
    assert (v, r, a) == ("verifier", "reviser", "approver") and (len(v_msgs), len(r_msgs), len(a_msgs)) == (4, 3, 3)
    assert (v_s.n, v_s.max_new_tokens, v_s.stop, v_s.temperature) == (1, 64, (), 0.8)
    assert (r_s.n, r_s.temperature, r_s.stop) == (5, 0.7, ())
    assert a_s == v_s
    assert [t.rsplit("revision: ", 1)[1] for t in a_msgs] == ["52300", "", "37701"]


def test_role_rewards_and_rows():
    record, _, _ = play()
    v = record.actions["verifier"]
    # Verifier pairs (SAC, NS) on every parsable x: r(SAC) = 1[x wrong], r(NS) = 1[x right]; the prompt of each
    # decision's call, the canonical actions (SAC goes on with the challenge; NS ends the reply).
    assert (v.role, v.paired, v.temperature, v.sampled) == ("verifier", True, 1.0, False)
    assert v.groups == [0, 0, 1, 1, 2, 2, 3, 3]
    assert v.rewards.tolist() == [0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    assert v.prompts == [[1, i] for i in range(4) for _ in range(2)]
    assert v.actions[:2] == [Action(action_text("1a", "SAC"), ends_turn=False), Action(action_text("1a", "NS"))]
    assert v.weight is None and v.adv_bonus is None
    # Approver pairs (KEEP, REVISE) on the challenged, from the table (alpha .5, cave .2, miss .3, unparsable -.25):
    # 1a wrong, z right: (-miss, 1 + alpha) = (-0.3, 1.5); 15 right, no revision: (1, -0.25); 15 wrong, z wrong:
    # (1, alpha * 0) = (1, 0). Bonus 0 (REVISE share 2/3 >= target 0.3).
    a = record.actions["approver"]
    assert a.groups == [1, 1, 2, 2, 3, 3] and a.prompts == [[3, j] for j in range(3) for _ in range(2)]
    assert a.rewards.tolist() == pytest.approx([-0.3, 1.5, 1.0, -0.25, 1.0, 0.0])
    assert a.actions[1] == decision_action("1a", "REVISE") == Action(action_text("1a", "REVISE"), ends_turn=True)
    # Rarity over the challenged by official case id: 5a -> 5, 2, 6a -> 6, one each: mean 1 -> weight 1 each.
    assert a.weight.tolist() == [1.0] * 6 and a.adv_bonus is None
    # Reviser pairs (keep text x, revise text the shown z) where z is parsable (1a wrong, 15 wrong): keep =
    # 1[x right] + 0.5 S_x = 0; revise = 1[x wrong] + 0.5 S_z: 1.5 (z right), 1.0 (z wrong). Scored at T 1.
    r = record.actions["revisions"]
    assert (r.role, r.paired, r.temperature, r.sampled) == ("reviser", True, 1.0, False)
    assert r.groups == [1, 1, 3, 3] and r.prompts == [[2, 0], [2, 0], [2, 2], [2, 2]]
    assert r.rewards.tolist() == [0.0, 1.5, 0.0, 1.0]
    assert r.actions[0] == Action("52301") and r.actions[2] == Action("37701")  # x as the reviser replies it
    assert r.actions[1].token_ids == [102] and r.actions[3].token_ids == [100]  # the shown samples: 2, and 0
    assert record.counts["revision_groups"] == 2.0


def test_shown_revision_first_parsable_and_first():
    # first_parsable: 1a wrong shows gold + 7 (wrong): REVISE is 5b, approver (1, alpha * 0) = (1, 0), reviser
    # (0, 1[x wrong] + 0.5 * 0) = (0, 1).
    record, actor, _ = play(shown_revision="first_parsable")
    assert cases(record) == ["1", "5b", "2", "6a"]
    assert record.actions["approver"].rewards.tolist() == pytest.approx([1.0, 0.0, 1.0, -0.25, 1.0, 0.0])
    assert record.actions["revisions"].rewards.tolist() == [0.0, 1.0, 0.0, 1.0]
    assert record.actions["revisions"].actions[1].token_ids == [101]
    assert actor.calls[2][1][0].endswith("revision: 52307")
    # first: 1a wrong shows "n/a": no parsable revision, approver (1, -0.25), no reviser pair (skip_unparsable).
    record, actor, _ = play(shown_revision="first")
    assert cases(record) == ["1", "5b", "2", "6a"] and record.has_revision.tolist() == [False, False, False, True]
    assert record.actions["approver"].rewards.tolist() == pytest.approx([1.0, -0.25, 1.0, -0.25, 1.0, 0.0])
    assert record.actions["revisions"].groups == [3, 3]
    assert actor.calls[2][1][0].endswith("revision: ")
    # ... and with skip_unparsable_revisions=false the pair of 1a wrong stays: revise 1[x wrong] + unparsable.
    record, _, _ = play(shown_revision="first", skip_unparsable_revisions=False)
    assert record.actions["revisions"].groups == [1, 1, 2, 2, 3, 3]
    assert record.actions["revisions"].rewards.tolist() == pytest.approx([0.0, 0.75, 1.5, -0.25, 0.0, 1.0])


def test_group_revisions_the_later_official_commit():
    # shown first, revision_update=group, no approver pair without a parsable shown revision: the approver trains
    # only on 15 wrong (1, 0); the revision group is 1a wrong's parsable revisions [gold+7, gold, gold] -> S_z
    # [0, 1, 1] as sampled (log-probs kept, T 0.7); 15 wrong's all 0: skipped; 15 right's none parsable.
    keys = {"shown_revision": "first", "revision_update": "group", "train_approver_without_revision": False}
    record, _, _ = play(**keys)
    assert record.actions["approver"].groups == [3, 3]
    assert record.actions["approver"].rewards.tolist() == [1.0, 0.0]
    r = record.actions["revisions"]
    assert (r.role, r.paired, r.temperature, r.sampled) == ("reviser", False, 0.7, True)
    assert r.groups == [1, 1, 1] and r.rewards.tolist() == [0.0, 1.0, 1.0] and r.prompts == [[2, 0]] * 3
    assert [c.token_ids for c in r.actions] == [[101], [102], [103]]
    assert [c.logprobs for c in r.actions] == [[-0.2], [pytest.approx(-0.3)], [-0.4]]
    assert record.counts["revision_groups"] == 1.0
    # Unparsable revisions kept (-0.25 each): 1a wrong [-0.25, 0, 1, 1, -0.25]; 15 right all -0.25 (equal: skipped).
    record, _, _ = play(**keys, skip_unparsable_revisions=False)
    assert record.actions["revisions"].rewards.tolist() == [-0.25, 0.0, 1.0, 1.0, -0.25]


def unparsable_verifier(role, row, x):
    """The script, but the verifier's reply on 1a right is not a decision."""
    if role == "verifier" and row["line"] == "1a" and x == str(row["gold"]):
        return ["looks fine to me"]
    return script(role, row, x)


def test_unparsable_verdict_counts_as_sac():
    # SAC (official): 1a right is challenged with an empty challenge; the approver REVISEs on 1a -> case 2 (its
    # shown revision is gold: the final value stays right).
    record, actor, _ = play(actor=ScriptedActor(unparsable_verifier))
    assert cases(record) == ["2", "5a", "2", "6a"] and record.challenged.all()
    assert record.final_strict.tolist() == [True, True, True, False]
    assert record.counts["unparsable/verifier"] == pytest.approx(0.25)
    assert 'challenge: {"claim": "", "argument": "", "evidence": ""}' in actor.calls[1][1][0]
    assert record.actions["verifier"].groups == [0, 0, 1, 1, 2, 2, 3, 3]  # x parsable: the pair still trains
    record, _, _ = play(actor=ScriptedActor(unparsable_verifier), unparsable_verdict="NS")
    assert cases(record) == ["1", "5a", "2", "6a"]


def test_unparsable_approver_keeps_and_unparsable_x_trains_no_verifier_pair():
    def odd(role, row, x):
        return ["maybe"] if role == "approver" else script(role, row, x)

    # Approver replies unparsable: KEEP everywhere -> 1, 6b (z right, kept), 3, 6a; counted 3/3.
    record, _, _ = play(actor=ScriptedActor(odd))
    assert cases(record) == ["1", "6b", "3", "6a"] and record.counts["unparsable/approver"] == 1.0
    # An unparsable x ("n/a") on 15 wrong: x counts as wrong, no verifier pair for it.
    game = FormGame(explore_revise=0.0)
    record = game.play(proposals(["52300", "52301", "37700", "n/a"]), ScriptedActor(), SAMPLING, True)
    assert record.actions["verifier"].groups == [0, 0, 1, 1, 2, 2]


def test_forced_revise_and_rarity():
    # explore_revise=1: every challenged decision that is not REVISE (15 wrong's KEEP) is forced: 6a -> 5b, taking
    # z (gold + 1, wrong). REVISE share 3/3, forced 1/3, final still 3/4. Rarity by official case id over the
    # challenged [5a, 2, 5b] -> ids [5, 2, 5], counts 2 and 1, mean 3/2: weights 5a, 5b (3/2)/2 = 0.75, case 2 1.5.
    record, _, _ = play(explore_revise=1.0)
    assert cases(record) == ["1", "5a", "2", "5b"] and record.revised.tolist() == [False, True, True, True]
    assert record.counts["forced_revise_rate"] == pytest.approx(1 / 3)
    assert record.final_strict.tolist() == [True, True, True, False]
    assert record.actions["approver"].weight.tolist() == pytest.approx([0.75, 0.75, 1.5, 1.5, 0.75, 0.75])


def test_exploration_draws_from_the_seeded_generator_only_when_training():
    # One non-REVISE decision per round (15 wrong): one draw of random.Random(seed) per round, forced when < 0.5.
    game, actor = FormGame(explore_revise=0.5, seed=3), ScriptedActor()
    reference = random.Random(3)
    forced = [bool(game.play(proposals(), actor, SAMPLING, True).revised[3]) for _ in range(12)]
    assert forced == [reference.random() < 0.5 for _ in range(12)]
    assert any(forced) and not all(forced)  # the seed exercises both outcomes
    # Validation: one revision, no exploration, no draw.
    state = game._explore.getstate()
    actor.calls.clear()
    record = game.play(proposals(), actor, SAMPLING, training=False)
    assert game._explore.getstate() == state and not record.revised[3]
    assert actor.calls[1][2].n == 1 and record.counts["forced_revise_rate"] == 0.0
    # One revision: 1a wrong's only one is "n/a" -> no parsable revision (REVISE keeps x).
    assert record.has_revision.tolist() == [False, False, False, True]


def test_revise_bonus_on_the_reward_or_the_advantage():
    # Share 2/3, target 1, balance 1.5 -> bonus 1.5 * (1 - 2/3) = 0.5. On the reward (official): REVISE + 0.5:
    # (-0.3, 2.0), (1, 0.25), (1, 0.5). On the advantage: the rewards as the table, adv_bonus 0.5 on each REVISE row.
    shaping = {"revise_balance": 1.5, "revise_target": 1.0}
    record, _, _ = play(**shaping)
    assert record.counts["revise_bonus"] == pytest.approx(0.5)
    assert record.actions["approver"].rewards.tolist() == pytest.approx([-0.3, 2.0, 1.0, 0.25, 1.0, 0.5])
    assert record.actions["approver"].adv_bonus is None
    record, _, _ = play(**shaping, revise_bonus_on="advantage")
    assert record.actions["approver"].rewards.tolist() == pytest.approx([-0.3, 1.5, 1.0, -0.25, 1.0, 0.0])
    assert record.actions["approver"].adv_bonus.tolist() == pytest.approx([0.0, 0.5] * 3)


def test_revise_share_all_counts_forced_revises_and_unforced_does_not():
    # explore_revise=1: the approver itself revises 1a wrong and 15 right (2 of the 3 challenged), 15 wrong's KEEP
    # is forced. Target 1, balance 1.5. all (official): share 3/3 = 1 -> bonus 0; unforced: 2/3 -> 1.5 * (1 - 2/3)
    # = 0.5 on the REVISE rewards (5a -0.3 / 1.5 + 0.5, 2: 1 / -0.25 + 0.5, 5b: 1 / 0 + 0.5).
    shaping = {"revise_balance": 1.5, "revise_target": 1.0, "explore_revise": 1.0}
    record, _, _ = play(**shaping)
    assert (record.counts["revise_share"], record.counts["revise_bonus"]) == (1.0, 0.0)
    assert record.counts["unforced_revise_rate"] == pytest.approx(2 / 3)
    assert record.counts["forced_revise_rate"] == pytest.approx(1 / 3)
    record, _, _ = play(**shaping, revise_share="unforced")
    assert record.counts["revise_share"] == pytest.approx(2 / 3)
    assert record.counts["revise_bonus"] == pytest.approx(0.5)
    assert record.actions["approver"].rewards.tolist() == pytest.approx([-0.3, 2.0, 1.0, 0.25, 1.0, 0.5])
    assert record.metrics("train")["train/dpa/revise_share"] == pytest.approx(2 / 3)


def test_no_challenge_calls_every_role_and_trains_the_verifier_only():
    def all_ns(role, row, x):
        return [action_text(row["line"], "NS")] if role == "verifier" else script(role, row, x)

    record, actor, _ = play(actor=ScriptedActor(all_ns))
    assert [(role, len(msgs)) for role, msgs, _ in actor.calls] == [("verifier", 4), ("reviser", 0), ("approver", 0)]
    assert cases(record) == ["1", "4", "1", "4"] and record.actions["approver"] is None
    assert record.actions["revisions"] is None and record.actions["verifier"] is not None
    assert record.metrics("train")["train/dpa/revise_rate"] == 0.0


@pytest.mark.parametrize("key, value, message", [
    ("shown_revision", "best", "game.shown_revision='best': use one of gold_first"),
    ("unparsable_verdict", "KEEP", "game.unparsable_verdict='KEEP': use one of SAC, NS"),
    ("revision_update", "both", "game.revision_update='both': use one of paired, group"),
    ("revise_bonus_on", "loss", "game.revise_bonus_on='loss': use one of reward, advantage"),
    ("revisions", 0, "game.revisions=0: must be >= 1"),
    ("explore_revise", 1.5, r"game.explore_revise=1.5: must be in \[0, 1\]"),
    ("revise_share", "own", "game.revise_share='own': use one of all, unforced"),
])
def test_bad_keys_name_the_key(key, value, message):
    with pytest.raises(ValueError, match=message):
        FormGame(**{key: value})


def test_proposals_without_the_form_oracle_are_refused():
    batch = proposals()
    batch.reward_parts = {"strict": batch.reward_parts["strict"]}
    with pytest.raises(ValueError, match=r"lack \['lenient', 'parsable'\]: use task=form with reward=form_line"):
        FormGame().play(batch, ScriptedActor(), SAMPLING, True)
    assert torch.equal(proposals().scores, torch.tensor([1.0, 0.0, 1.0, 0.0]))


# --- settings: DPA's role-reward settings are one dataclass, the form game is it, one config key per field ------
def test_the_form_game_is_the_dpa_settings_and_its_conf_file_lists_every_field_with_its_default():
    # A setting is a field of DPASettings (or of the form game's own rules) plus its line in conf/game/form.yaml:
    # the file holds exactly the fields, each at its default (seed and role_adapters are interpolated/derived).
    assert issubclass(FormGame, DPASettings)
    conf = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "game" / "form.yaml"))
    assert conf.pop("_target_") == "lit_credit.tasks.form_game.FormGame"
    assert conf.pop("seed") == "${seed}" and conf.pop("role_adapters") == ROLE_ADAPTERS
    fields = {f.name: f.default for f in dataclasses.fields(FormGame)}
    assert fields.pop("seed") == 0 and fields.pop("role_adapters") is None
    assert conf == fields


def test_the_dpa_settings_compute_the_table_and_the_bonus_from_their_fields():
    # x right, z right, revision shown: KEEP 1 + alpha = 1.25, REVISE alpha = 0.25 (alpha 0.25);
    # x right, z wrong: KEEP 1.25, REVISE -cave = -0.5; no revision: KEEP 1, REVISE unparsable = -1;
    # x wrong, z right: KEEP -miss = -0.7, REVISE 1 + alpha = 1.25; x wrong, z wrong: KEEP 1, REVISE 0.
    s = DPASettings(alpha=0.25, cave=0.5, miss=0.7, unparsable=-1.0, revise_balance=2.0, revise_target=0.5)
    got = s.approver_rewards(torch.tensor([True, True, True, False, False]),
                             torch.tensor([True, False, True, True, False]),
                             torch.tensor([True, True, False, True, True]))
    torch.testing.assert_close(got, torch.tensor([[1.25, 0.25], [1.25, -0.5], [1.0, -1.0], [-0.7, 1.25],
                                                  [1.0, 0.0]]))
    # bonus 2 * max(0.5 - share, 0): 0.6 at share 0.2, 0 at 0.7; per seed on a tensor of shares (the benchmark)
    assert s.bonus(0.2) == pytest.approx(2.0 * (0.5 - 0.2)) and s.bonus(0.7) == 0.0
    torch.testing.assert_close(s.bonus(torch.tensor([0.2, 0.7, 0.0])), torch.tensor([0.6, 0.0, 1.0]))
    with pytest.raises(ValueError, match=r"revise_share must be in \[0, 1\]"):
        s.bonus(torch.tensor([0.2, 1.5]))


def test_a_game_override_reaches_the_settings_field(make_cfg):
    game = instantiate(make_cfg("experiment=dpa_form", "game.revise_share=unforced", "game.alpha=0.1",
                                fast_task=False).game)
    assert type(game) is FormGame and game == FormGame(revise_share="unforced", alpha=0.1)
