"""A game's role actions as token sequences: the RolloutBatches a multi-role method (DPA-GRPO) trains on.

A game (:class:`~lit_credit.interfaces.Game`) is text-level: its record holds, per role, the prompt ids the actor
sampled from and the actions to score (:class:`~lit_credit.types.RoleActions`), each a canonical text
(:class:`~lit_credit.types.Action`) or a sampled :class:`~lit_credit.types.Completion`. :func:`role_batch`
tokenises the texts with the chat codec, exactly as the role emits them, and builds the batch.
"""
from __future__ import annotations

from collections.abc import Sequence

from lit_credit.models.chat import ChatCodec
from lit_credit.rollout.loop import Trajectory, to_batch
from lit_credit.types import Action, Completion, RewardResult, RoleActions, RolloutBatch


def action_batch(prompts: Sequence[list[int]], actions: Sequence[list[int]], groups: Sequence[int],
                 rewards: Sequence[float], pad_id: int, logprobs: Sequence[list[float]] | None = None,
                 temperature: float = 1.0) -> RolloutBatch:
    """Sequences ``prompt + action`` with response mask 1 on the action tokens, one group id and score each;
    their log-probs are taken at ``temperature`` (what they were sampled at; 1 for scored actions), their
    behaviour log-probs are ``logprobs`` (None: 0)."""
    episodes = []
    for i, (prompt, action, group) in enumerate(zip(prompts, actions, groups)):
        ep = Trajectory(row={}, group=group, token_ids=list(prompt))
        ep.add_reply(Completion(list(action), list(logprobs[i]) if logprobs else [0.0] * len(action), ""), 0)
        episodes.append(ep)
    return to_batch(episodes, [RewardResult(r) for r in rewards], pad_id, temperature=temperature)


def action_ids(action: Action | Completion, codec: ChatCodec) -> list[int]:
    """The tokens of one action: a sample's as sampled; a canonical text's as the role emits it, the text and
    the end of turn (``reply_ids``) or, for an action the reply goes on after, the text and a newline
    (``line_ids``)."""
    if isinstance(action, Completion):
        return list(action.token_ids)
    return codec.reply_ids(action.text) if action.ends_turn else codec.line_ids(action.text)


def role_batch(actions: RoleActions, codec: ChatCodec) -> RolloutBatch:
    """The RolloutBatch of one role's actions: the sequences, group ids and rewards, log-probs at the set's
    temperature (sampled actions keep their behaviour log-probs), and the set's per-row ``weight`` and
    ``adv_bonus`` as ``batch.extras``."""
    if actions.sampled and not all(isinstance(a, Completion) for a in actions.actions):
        raise ValueError(f"{actions.role}: a sampled action set holds only Completions (they carry the behaviour "
                         "log-probs); canonical actions are scored (sampled=False)")
    logprobs = [a.logprobs for a in actions.actions] if actions.sampled else None
    batch = action_batch(actions.prompts, [action_ids(a, codec) for a in actions.actions], actions.groups,
                         actions.rewards.tolist(), codec.pad_id, logprobs, actions.temperature)
    extras = {"weight": actions.weight, "adv_bonus": actions.adv_bonus}
    batch.extras.update({k: v for k, v in extras.items() if v is not None})
    return batch


__all__ = ["action_batch", "action_ids", "role_batch"]
