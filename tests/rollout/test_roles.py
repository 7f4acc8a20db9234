"""A game's role actions as token sequences (lit_credit.rollout.roles): canonical texts as the roles emit them,
sampled completions as sampled, per-row weight and advantage bonus in ``batch.extras``."""
from __future__ import annotations

import pytest
import torch

from lit_credit.models import build_tokenizer
from lit_credit.rollout import ChatCodec
from lit_credit.rollout.roles import action_ids, role_batch
from lit_credit.tasks.form import action_text, challenge_text
from lit_credit.tasks.form_game import decision_action
from lit_credit.types import Action, Completion, RoleActions


@pytest.fixture(scope="module")
def codec():
    corpus = [action_text("15", d) + "\n" + challenge_text({"claim": "12"}) for d in ("NS", "SAC")] * 20
    return ChatCodec(build_tokenizer(corpus, 300))


def test_canonical_actions_are_what_the_roles_emit(codec):
    ns = action_ids(decision_action("15", "NS"), codec)
    assert ns == codec.reply_ids(action_text("15", "NS")) and ns[-1] == codec.eos_id  # NS ends the reply
    # SAC goes on with the challenge line: its action is the decision line and its newline, a strict prefix of
    # the whole reply, without the end of turn.
    sac = action_ids(decision_action("15", "SAC"), codec)
    reply = codec.reply_ids(action_text("15", "SAC") + "\n" + challenge_text({"claim": "1"}))
    assert sac == codec.line_ids(action_text("15", "SAC")) and reply[:len(sac)] == sac
    assert len(reply) > len(sac) and codec.eos_id not in sac
    assert action_ids(Completion([5, 6], [-1.0, -2.0], "x"), codec) == [5, 6]  # a sample: its ids as sampled


def test_role_batch_rows_rewards_and_extras(codec):
    keep = Action("12")
    sampled = Completion([7, 8, codec.eos_id], [-0.5, -0.25, -0.125], "13")
    acts = RoleActions("reviser", [[1, 2, 3], [1, 2, 3]], [keep, sampled], [4, 4], torch.tensor([0.0, 1.5]),
                       paired=True, weight=torch.tensor([0.75, 0.75]), adv_bonus=torch.tensor([0.0, 0.5]))
    batch = role_batch(acts, codec)
    ids = codec.reply_ids("12")
    width = 3 + max(len(ids), 3)
    assert batch.input_ids.shape == (2, width) and batch.group_ids.tolist() == [4, 4]
    assert batch.scores.tolist() == [0.0, 1.5] and batch.temperature == 1.0
    assert batch.input_ids[0, :3 + len(ids)].tolist() == [1, 2, 3, *ids]
    assert batch.input_ids[1, :6].tolist() == [1, 2, 3, 7, 8, codec.eos_id]
    assert batch.response_mask[0].tolist() == [0, 0, 0] + [1] * len(ids) + [0] * (width - 3 - len(ids))
    # A scored set: behaviour log-probs 0, also for the sampled revise text; weight and bonus are extras.
    assert batch.behaviour_logprobs.abs().sum() == 0
    assert batch.reward_parts == {} and set(batch.extras) == {"weight", "adv_bonus"}
    assert batch.extras["weight"].tolist() == [0.75, 0.75] and batch.extras["adv_bonus"].tolist() == [0.0, 0.5]
    # A sampled set keeps its behaviour log-probs at its temperature; canonical texts cannot be in one.
    group = RoleActions("reviser", [[1]], [sampled], [0], torch.tensor([1.0]), paired=False, temperature=0.7,
                        sampled=True)
    batch = role_batch(group, codec)
    assert batch.temperature == 0.7 and batch.behaviour_logprobs[0, 1:].tolist() == [-0.5, -0.25, -0.125]
    assert batch.extras == {}
    with pytest.raises(ValueError, match="a sampled action set holds only Completions"):
        role_batch(RoleActions("reviser", [[1]], [keep], [0], torch.tensor([1.0]), paired=False, sampled=True),
                   codec)
