"""Shared records passed between tasks, rollout, credit, losses and methods (a game's :class:`GameRecord` and its
:class:`RoleActions` included, so a method reads a game's round without importing the task).

Shapes: ``B`` rollouts, ``T`` tokens (prompt + response, right-padded), ``K`` turns.
"""
from __future__ import annotations

import hashlib
from collections.abc import Hashable
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

import torch
from torch import Tensor


@dataclass
class CreditOutput:
    """What every credit estimator returns.

    advantages: [B, T] float, zero wherever ``response_mask == 0``.
    parts: named per-rollout ([B]) or per-turn ([B, K]) intermediate credits (e.g. ``tool``, ``summary``).
    metrics: scalar diagnostics to log (plain floats).
    """

    advantages: Tensor
    parts: dict[str, Tensor] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class SamplingParams:
    """How the engine samples. ``n`` samples per prompt; ``stop`` strings end a turn.

    Tokens are drawn from ``softmax(logits / temperature)`` cut to its ``top_p`` nucleus (``greedy``: argmax,
    temperature and top_p unused; the batch then carries temperature 1). Trainer log-probs are of the full
    tempered softmax, top-p not renormalised; behaviour log-probs too, but for vLLM at top_p < 1
    (:class:`Completion`).
    """

    n: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 32
    stop: tuple[str, ...] = ()
    greedy: bool = False


@dataclass
class Completion:
    """One sampled continuation of one prompt.

    token_ids: [L] generated ids (stop token included when generated).
    logprobs: [L] behaviour log-probs of those ids, ``log_softmax(logits / T)[id]`` at the sampling
        temperature ``T`` (1 for greedy). Top-p is not renormalised (as in verl): HFEngine gives the full
        tempered softmax at any top_p; VLLMEngine gives it at top_p = 1 and, at top_p < 1, the renormalised
        nucleus (``log p_T(id) - log P_T(nucleus)``, see ``lit_credit.rollout.vllm_engine``).
    """

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str = "stop"  # "stop" | "length" | "error" (the engine failed: no tokens)


@dataclass
class RewardResult:
    """What a reward returns for one episode (:class:`~lit_credit.interfaces.Reward`).

    score: the total reward (``RolloutBatch.scores``).
    parts: named floats of this episode: the reward's components and diagnostics (``RolloutBatch.reward_parts``,
        logged as ``<stage>/reward/<name>``).
    turns: named per-turn lists, one float per turn (``RolloutBatch.turn_parts``, right-padded to [B, K]).
    extras: anything else the reward wants to keep about the episode (not a tensor: the episode's metadata,
        ``RolloutBatch.metadata[i]["reward_extras"]``), e.g. a judge's raw reply.
    """

    score: float
    parts: dict[str, float] = field(default_factory=dict)
    turns: dict[str, list[float]] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass
class Feedback:
    """The environment's answer to one assistant turn (:class:`~lit_credit.interfaces.Environment`).

    done: the episode ends here. messages: chat messages to inject (tool responses, verifier feedback);
    they are tokenised with response mask 0. score: a per-turn verifier score in [0, 1], if any.
    info: anything else (``tool_responses``: the tool outputs the policy saw, for the reward).
    """

    done: bool
    messages: list[dict[str, str]] = field(default_factory=list)
    score: float | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def observation_text(self) -> str:
        """The next observation as text: the messages' contents, one per line ("" when there are none)."""
        return "\n".join(str(m.get("content") or "") for m in self.messages)


def state_hash(key: Hashable) -> int:
    """A state key (:meth:`Episode.state_key <lit_credit.interfaces.Episode>`) as an int in ``[0, 2**63)``, the
    same in every process and run (BLAKE2b of its ``repr``; Python's ``hash`` of a str is salted per process)."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


@dataclass
class RolloutBatch:
    """A batch of finished rollouts, prompt and response concatenated and right-padded.

    input_ids: [B, T] long.
    attention_mask: [B, T] long, 1 on real tokens.
    response_mask: [B, T] float, 1 on policy-generated (learnable) tokens; prompt, padding and
        environment-injected tokens (tool responses, verifier feedback) are 0.
    turn_ids: [B, T] long, assistant turn index k on policy tokens, -1 elsewhere.
    group_ids: [B] long, one id per prompt, minted per step (never derived from text).
    behaviour_logprobs: [B, T] float, engine log-probs of the sampled tokens (0 off the response mask);
        position t holds log p(input_ids[t] | input_ids[:t]).
    scores: [B] float, the total reward of each rollout.
    reward_parts: name -> [B] float: the reward's named parts of each rollout (:attr:`RewardResult.parts`).
    turn_parts: name -> [B, K] float: the reward's per-turn lists (:attr:`RewardResult.turns`), right-padded
        with 0 (e.g. HierR's ``tool_scores``, ``tool_turn_mask``).
    extras: name -> [B, ...] tensors that are not rewards, added after scoring for a credit estimator or a
        loss (an augmenter's TCPO counterfactuals ``alt_scores`` [B, K, M] and ``cf_mask`` [B, K]; a DPA role
        batch's ``weight`` and ``adv_bonus`` [B]).
    reward_weights: the reward's weight of each named part in ``scores`` (:attr:`Reward.part_weights
        <lit_credit.interfaces.Reward>`, e.g. HierR's ``{"process": w_process, "summary": w_summary}``), plain
        floats shared by every rollout; {} when the reward has none.
    turn_scores: [B, K] float per-turn verifier scores (0 where ``turn_mask`` is 0), or None.
    turn_mask: [B, K] bool, True where rollout i reached turn k, or None.
    state_keys: [B, K] long, the state each turn's reply was sampled in (:func:`state_hash` of the episode's
        ``state_key()`` before that turn), -1 where rollout i did not reach turn k; or None (a batch not made by the
        rollout loop). Turn k's tokens are those with ``turn_ids == k``.
    observations: per rollout, per turn, the observation text the policy read before that turn's reply (turn 0:
        the prompt's, then each :meth:`Feedback.observation_text`), aligned with ``state_keys``; [] when not kept.
    metadata: one dict per rollout (``id``, ``replies``, ``finish``, the task ``row``, the episode's ``seed``);
        never used for grouping.
    temperature: the sampling temperature T the batch was drawn at (1.0 for greedy); every log-prob of the
        batch (behaviour, old, reference, trainer) is of ``softmax(logits / T)``, the distribution that was
        sampled (top-p not renormalised, as in verl). A batch mixing temperatures cannot be represented.
    """

    input_ids: Tensor
    attention_mask: Tensor
    response_mask: Tensor
    turn_ids: Tensor
    group_ids: Tensor
    behaviour_logprobs: Tensor
    scores: Tensor
    reward_parts: dict[str, Tensor] = field(default_factory=dict)
    turn_parts: dict[str, Tensor] = field(default_factory=dict)
    extras: dict[str, Tensor] = field(default_factory=dict)
    reward_weights: dict[str, float] = field(default_factory=dict)
    turn_scores: Tensor | None = None
    turn_mask: Tensor | None = None
    state_keys: Tensor | None = None
    observations: list[list[str]] = field(default_factory=list)
    metadata: list[dict[str, Any]] = field(default_factory=list)
    temperature: float = 1.0

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def _map(self, fn) -> RolloutBatch:
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor):
                out[f.name] = fn(v)
            elif isinstance(v, dict):
                out[f.name] = {k: fn(t) if isinstance(t, Tensor) else t for k, t in v.items()}
            else:
                out[f.name] = v
        return replace(self, **out)

    def to(self, device: torch.device | str) -> RolloutBatch:
        return self._map(lambda t: t.to(device))

    def per_turn(self, values: Tensor, reduce: str, fill: float) -> Tensor:
        """``values`` [B, T] reduced (``sum``, ``amin``, ``amax``, ...) over the tokens of each turn into [B, K]
        (``fill`` for turns with none); one scatter over the turn ids."""
        num_turns = self.turn_mask.shape[1] if self.turn_mask is not None else int(self.turn_ids.max()) + 1
        on_turn = self.turn_ids >= 0
        index = self.turn_ids.clamp_min(0)
        out = values.new_full((len(self), max(num_turns, 1)), fill)
        return out.scatter_reduce(1, index, torch.where(on_turn, values, fill), reduce=reduce, include_self=True)

    def turn_surprisal(self) -> Tensor:
        """[B, K]: mean negative behaviour log-prob of each turn's tokens (0 for turns not reached)."""
        on_turn = (self.turn_ids >= 0).float()
        nll = self.per_turn(-self.behaviour_logprobs * on_turn, "sum", 0.0)
        count = self.per_turn(on_turn, "sum", 0.0)
        return nll / count.clamp_min(1)

    def turn_starts(self) -> Tensor:
        """[B, K] long: the position of each turn's first token (T for turns not reached), so
        ``input_ids[i, :turn_starts[i, k]]`` is the exact history turn k was sampled from."""
        positions = torch.arange(self.input_ids.shape[1], device=self.input_ids.device).expand_as(self.turn_ids)
        return self.per_turn(positions.float(), "amin", float(self.input_ids.shape[1])).long()

    def select(self, index: Tensor) -> RolloutBatch:
        """Rows ``index`` (a [N] long or [B] bool tensor) of every per-rollout field."""
        if index.dtype == torch.bool:
            index = index.nonzero().squeeze(-1)
        picked = self._map(lambda t: t[index.to(t.device)])
        rows = index.tolist()
        return replace(picked, metadata=[self.metadata[i] for i in rows] if self.metadata else [],
                       observations=[self.observations[i] for i in rows] if self.observations else [])


@dataclass
class CreditTrace:
    """One credited batch of a training step, kept by the module for the credit-records callback.

    source: ``policy`` for the GRPO family; DPA-GRPO's role batches are ``verifier``, ``approver``,
        ``revisions``, ``proposals``.
    advantages: [B, T] the token advantages the loss used.
    cases: [B] long DPA case index of each row (into ``lit_credit.rewards.dpa.CASES``), or None.
    ranks: [B] long, the data-parallel rank that sampled each row, or None (one process).
    """

    source: str
    batch: RolloutBatch
    advantages: Tensor
    cases: Tensor | None = None
    ranks: Tensor | None = None


@dataclass(frozen=True)
class Action:
    """A canonical action of a game role as the role emits it: ``text``, then the end of the turn (``ends_turn``:
    DPA's NS, KEEP, REVISE, the reviser's keep text) or a newline (SAC, which goes on with its challenge line)."""

    text: str
    ends_turn: bool = True


@dataclass
class RoleActions:
    """One role's action sequences to train on: row i is ``prompts[i] + actions[i]``.

    role: whose adapter is trained on them (DPA's ``verifier``, ``approver``, ``reviser``).
    prompts: the prompt ids, as the actor returned them.
    actions: per row an :class:`Action` (canonical text, tokenised by the rollout layer's chat codec) or a
        sampled :class:`Completion` (its token ids as sampled).
    groups: per row its decision (the index of its proposal); pairs share one.
    rewards: [rows] float, the role reward of each row.
    paired: rows 2n, 2n+1 are both actions of one decision (pair credit); else a GRPO group per decision.
    temperature: the temperature of the rows' log-probs (1 for scored actions).
    sampled: the actions are the role's samples at ``temperature`` and keep their behaviour log-probs; else they
        are scored actions (behaviour log-probs 0), a sampled one included (the reviser's revise text).
    weight: [rows] loss weight (the approver's rarity weight), or None (1).
    adv_bonus: [rows] added to each row's advantage (``revise_bonus_on=advantage``), or None (0).
    """

    role: str
    prompts: list[list[int]]
    actions: list[Action | Completion]
    groups: list[int]
    rewards: Tensor
    paired: bool
    temperature: float = 1.0
    sampled: bool = False
    weight: Tensor | None = None
    adv_bonus: Tensor | None = None

    def __len__(self) -> int:
        return len(self.actions)


@dataclass
class GameRecord:
    """One round of a multi-role game (:meth:`Game.play <lit_credit.interfaces.Game>`): what a method reads of it.

    actions: each set of action sequences to train on, by name in the game's order (DPA's ``verifier``,
        ``approver``, ``revisions``); None where a set has no rows this round.
    cases: [N] long, the case of each of the round's N decisions in the game's taxonomy (DPA's, into
        ``lit_credit.rewards.dpa.CASES``); a decision's rows carry it in the credit trace (:attr:`CreditTrace.cases`).

    A game's own record (the form game's ``FormGameRecord``) adds its fields, its :meth:`metrics` and its
    ``headline``: the one metric (a key of :meth:`metrics` after ``<stage>/``) a progress bar shows, or None.
    """

    actions: dict[str, RoleActions | None]
    cases: Tensor
    headline: ClassVar[str | None] = None

    def metrics(self, stage: str) -> dict[str, float]:
        """The round's metrics under ``<stage>/`` (none here; a game's record defines its own)."""
        return {}


def cat_batches(batches: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """Rollout batches stacked into one, in order (a training step's draws under dynamic sampling).

    Every tensor field is right-padded to the largest size of each dimension after the first: ``[B, T]``
    fields to the longest row (``input_ids`` with ``pad_id``, ``turn_ids`` with -1, masks and log-probs with 0),
    ``[B, K]`` per-turn fields to the most turns (0 / False; ``state_keys`` -1). A reward part, turn part, extra or
    ``turn_scores`` that a batch lacks is 0 there (``state_keys`` -1). Lists (``metadata``, ``observations``) are
    concatenated (a batch without observations gives each rollout []); any other field (``temperature``) must agree.
    """
    if len(batches) == 1:
        return batches[0]
    fills = {"input_ids": pad_id, "turn_ids": -1, "state_keys": -1}

    def stack(values: list[torch.Tensor | None], fill: float) -> torch.Tensor | None:
        like = next((v for v in values if v is not None), None)
        if like is None:
            return None
        values = [v if v is not None else like.new_full((len(b), *([1] * (like.dim() - 1))), fill)
                  for v, b in zip(values, batches, strict=True)]
        shape = [max(v.shape[d] for v in values) for d in range(1, like.dim())]
        out = like.new_full((sum(len(v) for v in values), *shape), fill)
        start = 0
        for v in values:  # a handful of draws: one slice copy each
            out[(slice(start, start + len(v)), *(slice(0, size) for size in v.shape[1:]))] = v
            start += len(v)
        return out

    out: dict[str, Any] = {}
    for f in fields(RolloutBatch):
        values = [getattr(b, f.name) for b in batches]
        if f.name == "turn_scores" and any(v is not None for v in values):  # none: 0 on each turn it reached
            values = [v if v is not None or b.turn_mask is None else torch.zeros(b.turn_mask.shape,
                                                                                 device=b.scores.device)
                      for v, b in zip(values, batches, strict=True)]
        if f.name == "reward_weights":
            if any(v != values[0] for v in values):
                raise ValueError(f"cat_batches: the batches' reward_weights differ: {values}")
            out[f.name] = values[0]
        elif isinstance(values[0], dict):
            keys = dict.fromkeys(k for v in values for k in v)
            out[f.name] = {k: stack([v.get(k) for v in values], 0) for k in keys}
        elif f.name == "observations" and any(values):  # a batch that kept none: an empty list per rollout
            out[f.name] = [x for v, b in zip(values, batches, strict=True) for x in (v or [[] for _ in range(len(b))])]
        elif isinstance(values[0], list):
            out[f.name] = [x for v in values for x in v]
        elif isinstance(values[0], torch.Tensor) or values[0] is None:
            out[f.name] = stack(values, fills.get(f.name, 0))
        elif any(v != values[0] for v in values):
            raise ValueError(f"cat_batches: the batches' {f.name} differ: {values}")
        else:
            out[f.name] = values[0]
    return RolloutBatch(**out)
