"""Shared records passed between rollout, credit, losses and methods.

Shapes: ``B`` rollouts, ``T`` tokens (prompt + response, right-padded), ``K`` turns.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

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
    reward_parts: name -> [B] float components of the reward; inputs a module adds for its estimator may
        have more dims (TCPO's counterfactuals: ``alt_scores`` [B, K, M], ``cf_mask`` [B, K]).
    turn_scores: [B, K] float per-turn verifier scores (0 where ``turn_mask`` is 0), or None.
    turn_mask: [B, K] bool, True where rollout i reached turn k, or None.
    metadata: one dict per rollout (``id``, ``replies``, ``finish``, the task ``row``); never used for grouping.
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
    turn_scores: Tensor | None = None
    turn_mask: Tensor | None = None
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
                out[f.name] = {k: fn(t) for k, t in v.items()}
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
        return replace(picked, metadata=[self.metadata[i] for i in rows] if self.metadata else [])


@dataclass
class CreditTrace:
    """One credited batch of a training step, kept by the module for the credit-records callback.

    source: ``policy`` for the GRPO family; DPA-GRPO's role batches are ``verifier``, ``approver``,
        ``revisions``, ``proposals``.
    advantages: [B, T] the token advantages the loss used.
    cases: [B] long DPA case index of each row (into ``lit_credit.rewards.dpa.CASES``), or None.
    """

    source: str
    batch: RolloutBatch
    advantages: Tensor
    cases: Tensor | None = None
