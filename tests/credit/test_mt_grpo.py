"""MT-GRPO: turn-0 tokens get A_out + c * A_turn, later turns A_out (docs/methods.md §0)."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lit_credit.credit import MTGRPOCredit, grpo_advantages, mt_grpo_advantages

from .common import DTYPES, PROPS, TOL, ids, make_batch, ref_group_normalize, t

# prompt, turn 0, feedback, turn 1 (rollout 1 has a longer turn 1), padding
TURN_IDS = torch.tensor([[-1, 0, 0, -1, 1, -1], [-1, 0, -1, 1, 1, 1], [-1, 0, -1, -1, -1, -1]])


def ref_mt_grpo(turn_score, outcome, turn_ids, gids, present=None, c=1.0):
    a_turn, a_out = ref_group_normalize(turn_score, gids, present), ref_group_normalize(outcome, gids)
    out = torch.zeros(turn_ids.shape, dtype=torch.float64)
    for i in range(turn_ids.shape[0]):
        for j in range(turn_ids.shape[1]):
            k = int(turn_ids[i, j])
            out[i, j] = 0.0 if k < 0 else a_out[i] + c * a_turn[i] if k == 0 else a_out[i]
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c", [1.0, 0.5])
def test_hand_table(dtype, c):
    # group 0 = rollouts {0, 1}; rollout 2 alone in group 5 -> 0 everywhere.
    # turn scores [1, 0]: A_turn = +-0.5 / (sqrt(0.5) + 1e-6) = +-0.70710578
    # outcome [1, 0.5]: mean 0.75, std sqrt(0.125) = 0.35355339 -> A_out = +-0.25 / (0.35355339 + 1e-6) = +-0.70710478
    a, o = 0.5 / (0.5**0.5 + 1e-6), 0.25 / (0.125**0.5 + 1e-6)
    out = mt_grpo_advantages(t([1, 0, 1], dtype), t([1, 0.5, 0], dtype), TURN_IDS, ids([0, 0, 5]), c=c)
    f = o + c * a
    want = [[0, f, f, 0, o, 0], [0, -f, 0, -o, -o, -o], [0] * 6]
    torch.testing.assert_close(out.advantages, t(want, dtype), **TOL[dtype])
    torch.testing.assert_close(out.parts["turn"], t([a, -a, 0], dtype), **TOL[dtype])
    torch.testing.assert_close(out.parts["outcome"], t([o, -o, 0], dtype), **TOL[dtype])


def test_turn_presence_guard():
    # only rollout 0 has a turn reward -> A_turn = 0, turn 0 gets A_out alone
    out = mt_grpo_advantages(
        t([1, 0, 1]), t([1, 0.5, 0]), TURN_IDS, ids([0, 0, 5]), turn_present=t([1, 0, 1])
    )
    assert out.parts["turn"].tolist() == [0, 0, 0]
    torch.testing.assert_close(out.advantages[:, 1], out.parts["outcome"])


def test_registered_class_reads_first_turn_score():
    batch = make_batch(
        (TURN_IDS >= 0).float(),
        ids([0, 0, 5]),
        t([1, 0.5, 0]),
        turn_ids=TURN_IDS,
        turn_scores=t([[1, 1], [0, 0.5], [0, 0]]),
        turn_mask=torch.tensor([[True, True], [True, True], [True, False]]),
    )
    want = mt_grpo_advantages(t([1, 0, 0]), t([1, 0.5, 0]), TURN_IDS, ids([0, 0, 5]), c=2.0)
    torch.testing.assert_close(MTGRPOCredit(c=2.0)(batch).advantages, want.advantages)


@pytest.mark.parametrize("seed", range(3))
def test_matches_loop_reference(seed):
    g = torch.Generator().manual_seed(seed)
    b, n_tok = 16, 10
    turn_ids = torch.randint(-1, 3, (b, n_tok), generator=g)
    turn_score, outcome = torch.rand(b, generator=g).double(), torch.rand(b, generator=g).double()
    gids, present = torch.randint(0, 4, (b,), generator=g), torch.rand(b, generator=g) < 0.8
    out = mt_grpo_advantages(turn_score, outcome, turn_ids, gids, turn_present=present, c=0.7)
    torch.testing.assert_close(
        out.advantages, ref_mt_grpo(turn_score, outcome, turn_ids, gids, present, c=0.7)
    )


@PROPS
@given(
    data=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4), st.integers(0, 2)), min_size=1, max_size=8),
    seed=st.integers(0, 2**16),
)
def test_property_c0_is_grpo_and_permutation(data, seed):
    turn_score, outcome, gids = t([d[0] for d in data]), t([d[1] for d in data]), ids([d[2] for d in data])
    turn_ids = torch.randint(-1, 3, (len(data), 7), generator=torch.Generator().manual_seed(seed))
    out = mt_grpo_advantages(turn_score, outcome, turn_ids, gids, c=0.0).advantages
    assert torch.equal(out, grpo_advantages(outcome, (turn_ids >= 0).float(), gids).advantages)
    full = mt_grpo_advantages(turn_score, outcome, turn_ids, gids).advantages
    perm = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))
    assert (full[turn_ids < 0] == 0).all()
    torch.testing.assert_close(
        mt_grpo_advantages(turn_score[perm], outcome[perm], turn_ids[perm], gids[perm]).advantages, full[perm]
    )
