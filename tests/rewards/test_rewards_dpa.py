"""DPA-GRPO role rewards and case taxonomy (docs/methods.md §3); every number hand-computed."""

import pytest
import torch

from lit_credit.credit import dpa_pair_advantages
from lit_credit.rewards import (
    APPROVER_ACTIONS,
    CASES,
    VERIFIER_ACTIONS,
    approver_pair_rewards,
    case_labels,
    case_shares,
    informative_groups,
    rarity_weights,
    revise_bonus,
    revise_share,
    revision_rewards,
    verifier_pair_rewards,
)
from lit_credit.rewards.dpa import reviser_pair_rewards, shown_revision

T, F = True, False


def b(*values):
    return torch.tensor(values, dtype=torch.bool)


def close(got, want):
    torch.testing.assert_close(got, torch.tensor(want, dtype=got.dtype))


# approver situations, one per row: (x_correct, z_correct, has_revision)
X_RIGHT_Z_RIGHT, X_RIGHT_Z_WRONG, X_WRONG_Z_RIGHT, X_WRONG_Z_WRONG = (T, T, T), (T, F, T), (F, T, T), (F, F, T)
NO_REVISION_X_RIGHT, NO_REVISION_X_WRONG = (T, T, F), (F, F, F)  # z_correct ignored without a revision
ROWS = [X_RIGHT_Z_RIGHT, X_RIGHT_Z_WRONG, X_WRONG_Z_RIGHT, X_WRONG_Z_WRONG, NO_REVISION_X_RIGHT, NO_REVISION_X_WRONG]


def approver(rows, **kw):
    x, z, h = zip(*rows)
    return approver_pair_rewards(b(*x), b(*z), b(*h), **kw)


def test_approver_table_defaults():
    assert APPROVER_ACTIONS == ("KEEP", "REVISE")
    # alpha, cave, miss, unparsable = 0.5, 0.2, 0.3, -0.25           KEEP            REVISE
    want = [
        [1.5, 0.5],     # x right, z right:     1 + 0.5*1 = 1.5       0.5*1 = 0.5
        [1.5, -0.2],    # x right, z wrong:     1 + 0.5*1 = 1.5       -cave = -0.2
        [-0.3, 1.5],    # x wrong, z right:     -miss = -0.3          1 + 0.5*1 = 1.5
        [1.0, 0.0],     # x wrong, z wrong:     1                     0.5*0 = 0
        [1.0, -0.25],   # no parsable revision: 1                     -0.25 (z_correct=True ignored)
        [1.0, -0.25],   # no parsable revision, x wrong: same
    ]
    close(approver(ROWS), want)


def test_approver_table_custom_params():
    # alpha=1, cave=0.5, miss=0.7, unparsable=-1
    want = [
        [2.0, 1.0],     # 1 + 1*1 = 2,  1*1 = 1
        [2.0, -0.5],    # 1 + 1*1 = 2,  -0.5
        [-0.7, 2.0],    # -0.7,         1 + 1*1 = 2
        [1.0, 0.0],     # 1,            1*0 = 0
        [1.0, -1.0],    # 1,            unparsable
        [1.0, -1.0],
    ]
    close(approver(ROWS, alpha=1.0, cave=0.5, miss=0.7, unparsable=-1.0), want)


def test_revise_bonus_only_on_revise_column():
    # shaping on: balance 1.5, target 0.3, observed REVISE share 0.1 -> 1.5 * (0.3 - 0.1) = 0.3
    bonus = revise_bonus(0.1, balance=1.5, target=0.3)
    assert bonus == pytest.approx(0.3)
    assert revise_bonus(0.1) == 0.0  # off by default (balance 0)
    assert revise_bonus(0.5, balance=1.5) == 0.0  # share above target: max(0.3 - 0.5, 0) = 0
    with pytest.raises(ValueError, match="revise_share"):
        revise_bonus(1.5, balance=1.5)


def test_revise_share_all_or_unforced_by_hand():
    # 10 challenged decisions: the approver itself answers REVISE on 1, exploration forces 3 of its 9 KEEPs.
    own = [True] + [False] * 9
    forced = [False, True, True, True] + [False] * 6
    # all (official): (1 + 3) / 10 = 0.4 >= 0.3 -> bonus 1.5 * max(0.3 - 0.4, 0) = 0
    assert revise_share(own, forced, "all") == pytest.approx(0.4)
    assert revise_bonus(revise_share(own, forced), balance=1.5, target=0.3) == 0.0
    # unforced: 1 / 10 = 0.1 -> bonus 1.5 * (0.3 - 0.1) = 0.3
    assert revise_share(own, forced, "unforced") == pytest.approx(0.1)
    assert revise_bonus(revise_share(own, forced, "unforced"), balance=1.5, target=0.3) == pytest.approx(0.3)
    # Inert at the paper's settings: an approver that never revises, forced on 4 of 10 (explore_revise 0.4):
    # all 0.4 -> bonus 0, exactly when the paper's text wants it largest; unforced 0 -> 1.5 * 0.3 = 0.45.
    never, forced = [False] * 10, [True] * 4 + [False] * 6
    assert revise_bonus(revise_share(never, forced), balance=1.5, target=0.3) == 0.0
    assert revise_bonus(revise_share(never, forced, "unforced"), balance=1.5, target=0.3) == pytest.approx(0.45)
    assert revise_share([], []) == 0.0 == revise_share([], [], "unforced")  # no challenge
    with pytest.raises(ValueError, match=r"game\.revise_share='own': use one of all, unforced"):
        revise_share(own, forced, "own")
    with pytest.raises(ValueError, match="both the approver's own REVISE and a forced one"):
        revise_share([True], [True])
    with pytest.raises(ValueError, match="own_revise has 1 decisions, forced 2"):
        revise_share([True], [False, False])


def test_shown_revision_rules():
    # row 0: parsable [F, T, T, T], right [-, F, T, T] -> scores (gold_first: 2 right + parsable) [0, 1, 3, 3]:
    #        gold_first 2 (the first right one), first_parsable 1, first 0
    # row 1: none right, parsable [F, F, T, F] -> gold_first = first_parsable = 2 (scores [0, 0, 1, 0])
    # row 2: nothing parsable -> 0 for every rule; a "right" flag on an unparsable revision is ignored
    parsable = b(F, T, T, T, F, F, T, F, F, F, F, F).view(3, 4)
    correct = b(T, F, T, T, F, F, F, F, T, F, F, F).view(3, 4)
    assert shown_revision(correct, parsable).tolist() == [2, 2, 0]  # gold_first is the default
    assert shown_revision(correct, parsable, "first_parsable").tolist() == [1, 2, 0]
    assert shown_revision(correct, parsable, "first").tolist() == [0, 0, 0]
    assert shown_revision(correct[:0], parsable[:0]).tolist() == []
    with pytest.raises(ValueError, match=r"method\.shown_revision='best'"):
        shown_revision(correct, parsable, "best")


def test_reviser_pair_rewards():
    # (keep, revise) = (1[x right] + 0.5 S_x, 1[x wrong] + 0.5 S_z), unparsable z: 1[x wrong] - 0.25
    want = [
        [1.5, 0.5],     # x right, z right:  1 + 0.5,  0 + 0.5
        [1.5, 0.0],     # x right, z wrong:  1.5,      0
        [0.0, 1.5],     # x wrong, z right:  0,        1 + 0.5
        [0.0, 1.0],     # x wrong, z wrong:  0,        1
        [1.5, -0.25],   # no parsable z, x right: 1.5, 0 - 0.25 (z_correct=True ignored)
        [0.0, 0.75],    # no parsable z, x wrong: 0,   1 - 0.25
    ]
    x, z, h = zip(*ROWS)
    close(reviser_pair_rewards(b(*x), b(*z), b(*h)), want)
    # pair advantages: keep +1 exactly when x is right, revise +1 exactly when x is wrong
    a = dpa_pair_advantages(reviser_pair_rewards(b(*x), b(*z), b(*h)))
    torch.testing.assert_close(a, torch.tensor([[1.0, -1.0]] * 2 + [[-1.0, 1.0]] * 2 + [[1.0, -1.0], [-1.0, 1.0]]),
                               atol=1e-6, rtol=0)
    close(reviser_pair_rewards(b(F), b(T), b(T), alpha=1.0), [[0.0, 2.0]])


def test_revise_bonus_on_the_reward_never_flips_a_pair_of_the_table():
    # the paper's largest bonus 1.5 * (0.3 - 0) = 0.45 on every REVISE reward: the pair advantages stay the same
    table = approver(ROWS)
    shifted = table + torch.tensor([0.0, revise_bonus(0.0, balance=1.5, target=0.3)])
    assert revise_bonus(0.0, balance=1.5, target=0.3) == pytest.approx(0.45)
    torch.testing.assert_close(dpa_pair_advantages(shifted), dpa_pair_advantages(table))


def test_verifier_pair():
    assert VERIFIER_ACTIONS == ("SAC", "NS")
    # x right: SAC 1[x wrong] = 0, NS 1[x right] = 1; x wrong: SAC 1, NS 0
    close(verifier_pair_rewards(b(T, F)), [[0.0, 1.0], [1.0, 0.0]])


def test_revision_rewards_and_informative_groups():
    correct = b(T, F, T, F, T, F, F, F, F, F).view(2, 5)
    parsable = b(T, T, F, T, T, T, T, T, T, T).view(2, 5)
    # row 0: S_z = 1, 0, (unparsable: correct ignored) -0.25, 0, 1; row 1: all parsable and wrong -> all 0
    r = revision_rewards(correct, parsable)
    close(r, [[1.0, 0.0, -0.25, 0.0, 1.0], [0.0] * 5])
    close(revision_rewards(correct, parsable, unparsable=-1.0)[0], [1.0, 0.0, -1.0, 0.0, 1.0])
    # mixed row kept, all-equal row skipped; an all-unparsable row (all -0.25) is skipped too
    assert informative_groups(r).tolist() == [T, F]
    assert informative_groups(revision_rewards(correct[:1], torch.zeros_like(parsable[:1]))).tolist() == [F]


def test_case_labels_every_case():
    # (x_correct, challenged, revised, z_correct) -> case
    table = [
        ((T, F, F, F), "1"), ((T, F, T, T), "1"),   # x right, NS (revised / z_correct not read)
        ((T, T, T, F), "2"), ((T, T, T, T), "2"),   # x right, SAC, REVISE
        ((T, T, F, T), "3"),                        # x right, SAC, KEEP
        ((F, F, F, F), "4"), ((F, F, T, T), "4"),   # x wrong, NS
        ((F, T, T, T), "5a"), ((F, T, T, F), "5b"),
        ((F, T, F, F), "6a"), ((F, T, F, T), "6b"),
    ]
    x, c, r, z = (b(*col) for col in zip(*(row for row, _ in table)))
    assert [CASES[i] for i in case_labels(x, c, r, z).tolist()] == [name for _, name in table]
    # no parsable revision: z counts as wrong, so a KEEP on a wrong x is 6a (not 6b), a REVISE is 5b
    got = case_labels(b(F, F), b(T, T), b(F, T), b(T, T), has_revision=b(F, F))
    assert [CASES[i] for i in got.tolist()] == ["6a", "5b"]


def test_case_shares():
    # 5 decisions: "1" x2, "4" x1, "6b" x2 -> 0.4, 0.2, 0.4; all other cases 0
    shares = case_shares(torch.tensor([0, 3, 7, 0, 7]))
    assert list(shares) == list(CASES)
    assert shares == pytest.approx({**dict.fromkeys(CASES, 0.0), "1": 0.4, "4": 0.2, "6b": 0.4})
    assert case_shares(torch.tensor([], dtype=torch.long)) == dict.fromkeys(CASES, 0.0)


def test_rarity_weights():
    labels = torch.tensor([0, 0, 0, 4])
    # counts: case "1" 3, case "5a" 1 -> mean over present cases 2 -> weights 2/3 (x3) and 2/1
    close(rarity_weights(labels, power=1.0), [2 / 3, 2 / 3, 2 / 3, 2.0])
    close(rarity_weights(labels, power=2.0), [4 / 9, 4 / 9, 4 / 9, 4.0])  # squared
    close(rarity_weights(labels), [1.0] * 4)  # power 0 (default): shaping off
    # the official case ids (5a/5b one case, 6a/6b one): challenged cases 3 3 3 5a 5b 6a -> ids 3 3 3 5 5 6,
    # counts 3, 2, 1, mean 6/3 = 2 -> 2/3 (x3), 1, 1, 2; by the 8 cases: counts 3, 1, 1, 1, mean 6/4 = 1.5
    # -> 0.5 (x3), 1.5, 1.5, 1.5
    challenged = torch.tensor([CASES.index(c) for c in ("3", "3", "3", "5a", "5b", "6a")])
    close(rarity_weights(challenged, 1.0, merge_subcases=True), [2 / 3, 2 / 3, 2 / 3, 1.0, 1.0, 2.0])
    close(rarity_weights(challenged, 1.0), [0.5, 0.5, 0.5, 1.5, 1.5, 1.5])


def test_shape_errors():
    with pytest.raises(ValueError, match="z_correct has N=1 but x_correct has N=2"):
        approver_pair_rewards(b(T, F), b(T), b(T, T))
    with pytest.raises(ValueError, match="has_revision"):
        approver_pair_rewards(b(T), b(T), torch.tensor([1]))
    with pytest.raises(ValueError, match="x_correct must be a 1-D bool"):
        verifier_pair_rewards(b(T, F).view(2, 1))
    with pytest.raises(ValueError, match="parsable has shape"):
        revision_rewards(b(T, F).view(1, 2), b(T, F, T).view(1, 3))
    with pytest.raises(ValueError, match="correct must be a 2-D"):
        revision_rewards(b(T, F), b(T, F))
    with pytest.raises(ValueError, match="rewards must be a 2-D"):
        informative_groups(torch.zeros(3))
    with pytest.raises(ValueError, match="revised has N=1"):
        case_labels(b(T, F), b(T, F), b(T), b(T, F))
    with pytest.raises(ValueError, match="labels must index CASES"):
        case_shares(torch.tensor([0, 8]))
    with pytest.raises(ValueError, match="labels must be a 1-D integer"):
        rarity_weights(torch.tensor([0.0, 1.0]), power=1.0)


def test_pairs_give_plus_minus_one_or_zero():
    # dpa_pair_advantages: (r - mean) / (std_pop + eps) within a pair -> +-1 (up to eps), 0 on a tie
    # x right z right (1.5, 0.5): KEEP +1, REVISE -1; x wrong z right (-0.3, 1.5): KEEP -1, REVISE +1;
    # a tied pair (1, 1) -> 0, 0
    a = dpa_pair_advantages(torch.cat([approver([X_RIGHT_Z_RIGHT, X_WRONG_Z_RIGHT]), torch.tensor([[1.0, 1.0]])]))
    torch.testing.assert_close(a, torch.tensor([[1.0, -1.0], [-1.0, 1.0], [0.0, 0.0]]), atol=1e-6, rtol=0)
    assert a[2].tolist() == [0.0, 0.0]
    # verifier, x wrong: (SAC 1, NS 0) -> SAC +1, NS -1
    torch.testing.assert_close(dpa_pair_advantages(verifier_pair_rewards(b(F))), torch.tensor([[1.0, -1.0]]),
                               atol=1e-6, rtol=0)
