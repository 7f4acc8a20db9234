"""CounterfactualTurns (TCPO's fixed-history resampling) with a scripted Sampler: which turns are resampled, from
which prefixes, how the alternatives are scored (verifier or reward), and what lands in ``batch.extras``."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from lit_credit.interfaces import Augmenter
from lit_credit.rollout.augment import CounterfactualTurns
from lit_credit.rollout.seeds import mix_seed
from lit_credit.types import Completion, Feedback, SamplingParams
from tests.credit.common import make_batch


class ScriptedSampler:
    """The experience layer as an augmenter sees it: alternative j of a prompt is the text ``"alt{j}"``.

    ``verify`` scores alternative j 1.0 (j = 0), no score at all (j = 1) or 0.25 (j = 2); ``turn_score`` gives
    ``10 * turn + j``. Every call is recorded."""

    def __init__(self) -> None:
        self.sampling = SamplingParams(n=8, temperature=0.7, top_p=0.9, max_new_tokens=5, stop=("\n",))
        self.samples, self.verified, self.turn_scored, self.seeds = [], [], [], []

    def sample(self, prompts, sampling, seeds=None):
        self.samples.append((prompts, sampling))
        self.seeds.append(seeds)
        return [[Completion([1], [-0.5], f"alt{j}") for j in range(sampling.n)] for _ in prompts]

    def sample_messages(self, messages, sampling):  # not used by the augmenter
        raise AssertionError("CounterfactualTurns samples from token prefixes")

    def verify(self, row, turn, reply, prefix=None, seed=0):
        self.verified.append((row["id"], turn, reply))
        return Feedback(done=True, score={"alt0": 1.0, "alt1": None, "alt2": 0.25}[reply])

    def turn_score(self, row, turn, reply):
        self.turn_scored.append((row["id"], turn, reply))
        return 10.0 * turn + int(reply[3:])


def two_groups():
    """4 rollouts, groups [0, 0, 1, 1], 8 tokens; row i's ids are 10 i + position.

    Turn ids and behaviour log-probs (prompt at positions 0-1, feedback between turns, padding after):
      r0: turn 0 at 2-3 (log-probs -1, -1: surprisal 1), turn 1 at 5-6 (-3, -3: 3)
      r1: turn 0 at 2 (-2: 2), turn 1 at 4 (-0.5: 0.5)
      r2: turn 0 at 2-4 (-0.1 each: 0.1), no turn 1
      r3: turn 0 at 2 (-4: 4), turn 1 at 4-5 (-0.2, -0.2: 0.2)
    Tool turns (turn_parts["tool_turn_mask"], what augment.score=reward resamples): r0 turn 0, r1 both, r2 turn
    0, r3 turn 1."""
    turn_ids = torch.tensor([[-1, -1, 0, 0, -1, 1, 1, -1], [-1, -1, 0, -1, 1, -1, -1, -1],
                             [-1, -1, 0, 0, 0, -1, -1, -1], [-1, -1, 0, -1, 1, 1, -1, -1]])
    logp = torch.tensor([[0, 0, -1, -1, 0, -3, -3, 0], [0, 0, -2, 0, -0.5, 0, 0, 0],
                         [0, 0, -0.1, -0.1, -0.1, 0, 0, 0], [0, 0, -4, 0, -0.2, -0.2, 0, 0]])
    turn_mask = torch.tensor([[True, True], [True, True], [True, False], [True, True]])
    batch = make_batch((turn_ids >= 0).float(), torch.tensor([0, 0, 1, 1]), torch.tensor([1.0, 0.0, 1.0, 0.0]),
                       turn_ids=turn_ids, behaviour_logprobs=logp, turn_mask=turn_mask,
                       turn_scores=torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]]),
                       turn_parts={"tool_turn_mask": torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 0.0], [0.0, 1.0]])},
                       metadata=[{"row": {"id": f"q{i}"}} for i in range(4)])
    batch.input_ids = 10 * torch.arange(4)[:, None] + torch.arange(8)
    return batch


def test_verifier_scored_counterfactuals_by_hand():
    batch, sampler = two_groups(), ScriptedSampler()
    augment = CounterfactualTurns(top_l=2, samples=3, score="verifier")
    assert isinstance(augment, Augmenter) and augment.provides == {"alt_scores", "cf_mask"}
    logs = augment(batch, sampler)
    # Top 2 reached turns per group by surprisal: group 0 {(0,0): 1, (0,1): 3, (1,0): 2, (1,1): 0.5} -> (0,1),
    # (1,0); group 1 {(2,0): 0.1, (3,0): 4, (3,1): 0.2} -> (3,0), (3,1).
    selected = batch.extras["cf_mask"]
    assert selected.tolist() == [[False, True], [True, False], [False, False], [True, True]]
    # One engine call with n = samples and otherwise the train sampling, from the exact histories
    # input_ids[i, :turn_start[i, k]]: turn starts (0,1) 5, (1,0) 2, (3,0) 2, (3,1) 4.
    (prompts, sampling), = sampler.samples
    assert sampling == replace(sampler.sampling, n=3)
    assert prompts == [[0, 1, 2, 3, 4], [10, 11], [30, 31], [30, 31, 32, 33]]
    # Each alternative scored by the verifier of its own row and turn: alt0 1, alt1 no score -> 0, alt2 0.25.
    assert sampler.verified == [(f"q{i}", k, f"alt{j}") for i, k in [(0, 1), (1, 0), (3, 0), (3, 1)]
                                for j in range(3)]
    assert not sampler.turn_scored
    alt = batch.extras["alt_scores"]
    assert alt.shape == (4, 2, 3)
    assert alt[selected].tolist() == [[1.0, 0.0, 0.25]] * 4
    assert torch.isnan(alt[~selected]).all()  # not sampled: NaN
    assert logs == pytest.approx({"tcpo/cf_turns": 4.0, "tcpo/cf_alt_mean": 1.25 / 3})


def test_reward_scored_counterfactuals_resample_the_tool_turns_by_hand():
    batch, sampler = two_groups(), ScriptedSampler()
    logs = CounterfactualTurns(top_l=2, samples=2, score="reward")(batch, sampler)
    # Scored turns are the tool turns: group 0 {(0,0): 1, (1,0): 2, (1,1): 0.5} -> (1,0), (0,0); group 1
    # {(2,0): 0.1, (3,1): 0.2} -> both. Turn 1 of r0 (surprisal 3, not a tool turn) is never picked.
    selected = batch.extras["cf_mask"]
    assert selected.tolist() == [[True, False], [True, False], [True, False], [False, True]]
    (prompts, sampling), = sampler.samples
    assert sampling.n == 2 and prompts == [[0, 1], [10, 11], [20, 21], [30, 31, 32, 33]]
    # Scored by the reward's turn score 10 k + j, never by the verifier.
    assert not sampler.verified
    alt = batch.extras["alt_scores"]
    assert alt[selected].tolist() == [[0.0, 1.0], [0.0, 1.0], [0.0, 1.0], [10.0, 11.0]]
    assert torch.isnan(alt[~selected]).all()
    assert logs == pytest.approx({"tcpo/cf_turns": 4.0, "tcpo/cf_alt_mean": (3 * 1 + 21) / 8})


def test_select_all_resamples_every_scored_turn():
    batch, sampler = two_groups(), ScriptedSampler()
    CounterfactualTurns(top_l=1, samples=1, select="all")(batch, sampler)
    assert torch.equal(batch.extras["cf_mask"], batch.turn_mask)  # top_l does not apply
    assert len(sampler.samples[0][0]) == 7


def test_select_random_draws_from_the_augmenters_seed_not_the_global_generator():
    picks = []
    for seed, global_seed in ((3, 0), (3, 1)):
        batch = two_groups()
        torch.manual_seed(global_seed)  # the global generator must not matter
        CounterfactualTurns(top_l=1, samples=1, select="random", seed=seed)(batch, ScriptedSampler())
        picks.append(batch.extras["cf_mask"])
    assert torch.equal(picks[0], picks[1])
    assert (picks[0].view(2, -1).sum(1) == 1).all()  # one reached turn per group


@pytest.mark.parametrize("select", ["surprisal", "random"])
def test_alternatives_do_not_depend_on_the_batch_a_rollout_sits_in(select):
    """Two ranks each hold one whole group of the step (rows 0-1: group 0, rows 2-3: group 1): their
    selections and the alternatives' seeds, concatenated in rank order, are the one-process batch's. The seed
    of turn k of rollout j of group g is mix_seed(seed, 3, g, j, k), j counted within the group: rows 0-3 are
    (g, j) = (0, 0), (0, 1), (1, 0), (1, 1)."""
    def run(batch):
        sampler = ScriptedSampler()
        CounterfactualTurns(top_l=2, samples=2, select=select, score="reward", seed=7)(batch, sampler)
        return batch.extras["cf_mask"], sampler.seeds[0]

    whole_mask, whole_seeds = run(two_groups())
    ranks = [run(two_groups().select(torch.tensor(rows))) for rows in ([0, 1], [2, 3])]
    assert torch.equal(torch.cat([mask for mask, _ in ranks]), whole_mask)
    assert ranks[0][1] + ranks[1][1] == whole_seeds
    g, j = [0, 0, 1, 1], [0, 1, 0, 1]
    assert whole_seeds == [mix_seed(7, 3, g[i], j[i], k) for i, k in whole_mask.nonzero().tolist()]
    assert len(set(whole_seeds)) == len(whole_seeds) == 4  # the top 2 of group 0's 3 tool turns, both of group 1's


@pytest.mark.parametrize("score", ["verifier", "reward"])
def test_a_batch_without_scored_turns_is_left_alone(score):
    batch, sampler = two_groups(), ScriptedSampler()
    batch.turn_scores, batch.turn_parts = None, {}  # neither verifier scores nor tool turns
    assert CounterfactualTurns(score=score)(batch, sampler) == {}
    assert batch.extras == {} and not sampler.samples


def test_no_selected_turn_samples_nothing_and_marks_everything_not_sampled():
    batch, sampler = two_groups(), ScriptedSampler()
    batch.turn_parts["tool_turn_mask"] = torch.zeros(4, 2)
    logs = CounterfactualTurns(score="reward", samples=2)(batch, sampler)
    assert batch.extras["alt_scores"].shape == (4, 2, 2) and torch.isnan(batch.extras["alt_scores"]).all()
    assert not batch.extras["cf_mask"].any()
    assert sampler.samples == [([], replace(sampler.sampling, n=2))]  # the experience layer skips an empty call
    assert logs["tcpo/cf_turns"] == 0.0 and math.isnan(logs["tcpo/cf_alt_mean"])


@pytest.mark.parametrize(("kwargs", "key"), [({"samples": 0}, "augment.samples=0"), ({"top_l": 0}, "augment.top_l=0"),
                                             ({"score": "judge"}, "augment.score='judge'")])
def test_bad_settings_name_the_config_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        CounterfactualTurns(**kwargs)
