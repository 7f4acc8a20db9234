"""The multi-turn rollout loop: the engine samples assistant turns, the environment injects feedback.

Policy tokens get response mask 1 and their turn index; prompt and injected tokens get mask 0 and turn -1.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from lit_credit.backends import BackendFailure, NotRetried, Retry, count
from lit_credit.distributed import any_rank, world
from lit_credit.interfaces import Environment, RolloutEngine
from lit_credit.models.chat import ChatCodec
from lit_credit.rollout.seeds import mix_seed
from lit_credit.types import Completion, Feedback, RewardResult, RolloutBatch, SamplingParams


@dataclass
class Episode:
    row: dict[str, Any]
    group: int
    token_ids: list[int]
    response_mask: list[int] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    turn_scores: list[float | None] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    tool_responses: list[str] = field(default_factory=list)  # what the environment answered, in order

    def __post_init__(self) -> None:
        pad = len(self.token_ids) - len(self.response_mask)
        self.response_mask += [0] * pad
        self.turn_ids += [-1] * pad
        self.logprobs += [0.0] * pad

    def add_reply(self, completion: Completion, turn: int) -> None:
        n = len(completion.token_ids)
        self.token_ids += completion.token_ids
        self.response_mask += [1] * n
        self.turn_ids += [turn] * n
        self.logprobs += completion.logprobs
        self.replies.append(completion.text)
        self.finish_reasons.append(completion.finish_reason)

    def add_feedback(self, ids: list[int]) -> None:
        self.token_ids += ids
        self.response_mask += [0] * len(ids)
        self.turn_ids += [-1] * len(ids)
        self.logprobs += [0.0] * len(ids)


def tool_schemas(row: dict[str, Any]) -> list[dict] | None:
    """The row's tool schemas; datasets store them as a JSON string (one struct type for every row)."""
    tools = row.get("tools")
    return json.loads(tools) if isinstance(tools, str) else tools


FAILED = Completion([], [], "", "error")


def generate(engine: RolloutEngine, prompts: list[list[int]], sampling: SamplingParams,
             retry: Retry | None = None, seeds: list[int] | None = None) -> list[list[Completion]]:
    """``engine.generate`` (prompt ``i`` seeded ``seeds[i]``, or by the engine) through ``retry``; when every
    attempt fails each prompt gets ``sampling.n`` empty completions with finish reason ``"error"`` (no tokens to
    learn from, a zero score from the reward).

    Several processes: ``generate`` is a collective (the ranks of a tensor-parallel vLLM group run one engine;
    an FSDP2 policy's first generation of a phase all-gathers it), so every rank of the world calls it equally
    often: the caller makes the call on every rank (an empty ``prompts`` where a rank has none), and the ranks
    agree after every attempt whether to retry (:class:`~lit_credit.backends.Retry`'s ``agree``,
    :func:`~lit_credit.distributed.any_rank`)."""
    if retry is None:
        return engine.generate(prompts, sampling, seeds)
    try:
        return retry(engine.generate, prompts, sampling, seeds, agree=any_rank if world()[1] > 1 else None)
    except BackendFailure:
        return [[FAILED] * sampling.n for _ in prompts]


def env_step(env: Environment, row: dict[str, Any], turn: int, text: str) -> Feedback:
    """``env.step``; one that raises ends the episode (no turn score) and counts ``backend/environment/errors``."""
    try:
        return env.step(row, turn, text)
    except NotRetried:
        raise
    except Exception:  # an environment bug on odd input must not end the run
        count("backend/environment/errors")
        return Feedback(done=True)


def run_episodes(engine: RolloutEngine, codec: ChatCodec, env: Environment, rows: list[dict[str, Any]],
                 group_ids: list[int], sampling: SamplingParams, max_turns: int = 1,
                 retry: Retry | None = None, seeds: list[int] | None = None) -> list[Episode]:
    """``sampling.n`` episodes per row (grouped by ``group_ids``), each up to ``max_turns`` assistant turns;
    engine calls go through ``retry`` (:func:`generate`). ``seeds[i]``: row i's seed (the engine's without):
    the first turns are sampled with it, turn ``t > 0`` of the row's episode ``k`` with ``mix_seed(seeds[i], k, t)``,
    so an episode's every turn is a function of its seed.

    Several processes: every rank makes as many engine calls as the rank with the most turns (:func:`generate`
    is a collective): after each turn the ranks agree whether any episode goes on
    (:func:`~lit_credit.distributed.any_rank`), and a rank whose episodes all ended calls with no prompt."""
    prompts = [codec.prompt_ids(r["prompt"], tool_schemas(r)) for r in rows]
    episodes = [Episode(row=r, group=g, token_ids=list(p))
                for r, g, p in zip(rows, group_ids, prompts) for _ in range(sampling.n)]
    completions = [c for per_prompt in generate(engine, prompts, sampling, retry, seeds) for c in per_prompt]
    active = list(range(len(episodes)))
    for turn in range(max_turns):
        still = []
        for i, completion in zip(active, completions):
            ep = episodes[i]
            ep.add_reply(completion, turn)
            fb = env_step(env, ep.row, turn, completion.text)
            ep.turn_scores.append(fb.score)
            if fb.done or turn == max_turns - 1 or completion.finish_reason == "error":
                continue
            ep.tool_responses += fb.info.get("tool_responses", [])
            closed = bool(completion.token_ids) and completion.token_ids[-1] == codec.eos_id
            ep.add_feedback(codec.feedback_ids(fb.messages, reply_closed=closed))
            still.append(i)
        active = still
        if turn == max_turns - 1 or not any_rank(bool(active)):  # the last turn: no rank goes on
            break
        follow_seeds = None if seeds is None else \
            [mix_seed(seeds[i // sampling.n], i % sampling.n, turn + 1) for i in active]
        follow = generate(engine, [episodes[i].token_ids for i in active], replace(sampling, n=1), retry, follow_seeds)
        completions = [per_prompt[0] for per_prompt in follow]
    return episodes


def _stack(values: list[float | None]) -> torch.Tensor:
    """One part's floats -> [B]; a missing value (that episode's reward failed) is 0."""
    return torch.tensor([float(v or 0.0) for v in values])


def _stack_turns(values: list[list[float] | None], num_turns: int) -> torch.Tensor:
    """One per-turn part's lists -> [B, K] right-padded with 0 (K: the batch's turns, or the longest list); a
    missing list (that episode's reward failed) is empty."""
    values = [v or [] for v in values]
    width = max(num_turns, *(len(v) for v in values))
    return torch.tensor([[float(x) for x in v] + [0.0] * (width - len(v)) for v in values])


def to_batch(episodes: list[Episode], rewards: list[RewardResult], pad_id: int,
             temperature: float = 1.0) -> RolloutBatch:
    """Right-pad episodes into a RolloutBatch; ``rewards[i]`` is episode i's reward: its ``parts`` become
    ``reward_parts`` ([B]), its ``turns`` ``turn_parts`` ([B, K], :func:`_stack_turns`), its ``extras`` the
    metadata's ``reward_extras``; ``temperature``: what they were sampled at."""
    width = max(len(e.token_ids) for e in episodes)

    def pad(key: str, value: float, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([getattr(e, key) + [value] * (width - len(e.token_ids)) for e in episodes], dtype=dtype)

    input_ids = pad("token_ids", pad_id, torch.long)
    lengths = torch.tensor([len(e.token_ids) for e in episodes])
    attention_mask = (torch.arange(width) < lengths[:, None]).long()
    num_turns = max(len(e.turn_scores) for e in episodes)
    turn_mask = torch.tensor([[k < len(e.turn_scores) for k in range(num_turns)] for e in episodes])
    turn_scores = None
    if any(s is not None for e in episodes for s in e.turn_scores):
        turn_scores = torch.tensor([[float(e.turn_scores[k] or 0.0) if k < len(e.turn_scores) else 0.0
                                     for k in range(num_turns)] for e in episodes])
    parts = {k: _stack([r.parts.get(k) for r in rewards]) for k in dict.fromkeys(k for r in rewards for k in r.parts)}
    turns = {k: _stack_turns([r.turns.get(k) for r in rewards], num_turns)
             for k in dict.fromkeys(k for r in rewards for k in r.turns)}
    return RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=pad("response_mask", 0, torch.float),
        turn_ids=pad("turn_ids", -1, torch.long),
        group_ids=torch.tensor([e.group for e in episodes], dtype=torch.long),
        behaviour_logprobs=pad("logprobs", 0.0, torch.float),
        scores=torch.tensor([float(r.score) for r in rewards]),
        reward_parts=parts,
        turn_parts=turns,
        turn_scores=turn_scores,
        turn_mask=turn_mask,
        metadata=[{"id": e.row.get("id"), "replies": e.replies, "finish": e.finish_reasons, "row": e.row,
                   **({"reward_extras": r.extras} if r.extras else {})} for e, r in zip(episodes, rewards)],
        temperature=temperature,
    )
