"""The multi-turn rollout loop: the engine samples assistant turns, each rollout's episode of the environment
answers them (:class:`~lit_credit.interfaces.Episode`).

Policy tokens get response mask 1 and their turn index; prompt and injected tokens get mask 0 and turn -1. A
:class:`Trajectory` records one rollout: its tokens and, per turn, the reply, the turn score, the observation text
and the state key the reply was sampled in.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from lit_credit.backends import BackendFailure, NotRetried, Retry, count
from lit_credit.distributed import any_rank, world
from lit_credit.interfaces import Environment, Episode, RolloutEngine, open_episode, step_many
from lit_credit.models.chat import ChatCodec
from lit_credit.rollout.seeds import mix_seed
from lit_credit.types import Completion, Feedback, RewardResult, RolloutBatch, SamplingParams, state_hash

EPISODE_STREAM = -1  # rollout k of a row seeded s: its episode's seed is mix_seed(s, k, EPISODE_STREAM)


@dataclass
class Trajectory:
    """One rollout as the loop records it: its tokens (prompt, replies, injected feedback) with their masks, and per
    turn the reply, the turn score, the finish reason, the ``observations`` (text the policy read before the reply)
    and the ``state_keys`` (:func:`~lit_credit.types.state_hash` of the episode's state before the reply); ``seed``
    is its episode's seed (:meth:`Environment.episode <lit_credit.interfaces.Environment>`)."""

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
    observations: list[str] = field(default_factory=list)
    state_keys: list[int] = field(default_factory=list)
    seed: int = 0

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

    def observe(self, text: str, episode: Episode) -> None:
        """The observation ``text`` the next reply is sampled after, and the episode's state key then."""
        self.observations.append(text)
        self.state_keys.append(state_hash(episode.state_key()))

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


def env_steps(env: Environment, episodes: list[Episode], replies: list[str]) -> list[Feedback]:
    """Each episode stepped with its reply (:func:`~lit_credit.interfaces.step_many`: one ``env.step_many`` call
    where the environment has it). An episode whose step raises ends (no turn score) and counts
    ``backend/environment/errors``; a batched call that raises ends every episode of the call, each counted."""
    if getattr(env, "step_many", None) is not None:
        try:
            return step_many(env, episodes, replies)
        except NotRetried:
            raise
        except Exception:  # an environment bug on odd input must not end the run
            count("backend/environment/errors", len(episodes))
            return [Feedback(done=True) for _ in episodes]
    return [episode_step(e, r) for e, r in zip(episodes, replies, strict=True)]


def episode_step(episode: Episode, text: str) -> Feedback:
    """``episode.step``; one that raises ends the episode (no turn score) and counts ``backend/environment/errors``."""
    try:
        return episode.step(text)
    except NotRetried:
        raise
    except Exception:  # an environment bug on odd input must not end the run
        count("backend/environment/errors")
        return Feedback(done=True)


def start_episodes(env: Environment, row: dict[str, Any], seeds: list[int]) -> tuple[list[Episode], list]:
    """One episode of ``row`` per seed, reset: the episodes and their first observation (chat messages), which
    every episode of a row shares."""
    episodes = [open_episode(env, row, s) for s in seeds]
    firsts = [e.reset() for e in episodes]
    if any(f != firsts[0] for f in firsts[1:]):
        raise ValueError(f"{type(env).__name__}: the episodes of one row start differently (reset() depends on the "
                         "seed); the row fixes the start, the seed only the episode's own randomness")
    return episodes, firsts[0]


def run_episodes(engine: RolloutEngine, codec: ChatCodec, env: Environment, rows: list[dict[str, Any]],
                 group_ids: list[int], sampling: SamplingParams, max_turns: int = 1,
                 retry: Retry | None = None, seeds: list[int] | None = None) -> list[Trajectory]:
    """``sampling.n`` episodes per row (grouped by ``group_ids``), each up to ``max_turns`` assistant turns;
    engine calls go through ``retry`` (:func:`generate`). ``seeds[i]``: row i's seed (the engine's without):
    the first turns are sampled with it, turn ``t > 0`` of the row's episode ``k`` with ``mix_seed(seeds[i], k, t)``,
    so an episode's every turn is a function of its seed. Episode ``k`` of row ``i`` is
    ``env.episode(row, mix_seed(seeds[i], k, EPISODE_STREAM))`` (``group_ids[i]`` for ``seeds[i]`` without seeds):
    the n episodes of a row start the same (its ``reset()``, the prompt) and keep their own state.

    Several processes: every rank makes as many engine calls as the rank with the most turns (:func:`generate`
    is a collective): after each turn the ranks agree whether any episode goes on
    (:func:`~lit_credit.distributed.any_rank`), and a rank whose episodes all ended calls with no prompt."""
    trajectories: list[Trajectory] = []
    worlds: list[Episode] = []
    prompts = []
    for i, (r, g) in enumerate(zip(rows, group_ids)):
        base = g if seeds is None else seeds[i]
        episode_seeds = [mix_seed(base, k, EPISODE_STREAM) for k in range(sampling.n)]
        episodes, first = start_episodes(env, r, episode_seeds)
        prompt = codec.prompt_ids(first, tool_schemas(r))
        prompts.append(prompt)
        text = "\n".join(str(m.get("content") or "") for m in first)
        for episode, seed in zip(episodes, episode_seeds):
            t = Trajectory(row=r, group=g, token_ids=list(prompt), seed=seed)
            t.observe(text, episode)
            trajectories.append(t)
        worlds += episodes
    completions = [c for per_prompt in generate(engine, prompts, sampling, retry, seeds) for c in per_prompt]
    active = list(range(len(trajectories)))
    for turn in range(max_turns):
        pairs = list(zip(active, completions))
        for i, completion in pairs:
            trajectories[i].add_reply(completion, turn)
        feedback = env_steps(env, [worlds[i] for i, _ in pairs], [c.text for _, c in pairs])
        still = []
        for (i, completion), fb in zip(pairs, feedback, strict=True):
            ep = trajectories[i]
            ep.turn_scores.append(fb.score)
            if fb.done or turn == max_turns - 1 or completion.finish_reason == "error":
                continue
            ep.tool_responses += fb.info.get("tool_responses", [])
            closed = bool(completion.token_ids) and completion.token_ids[-1] == codec.eos_id
            ep.add_feedback(codec.feedback_ids(fb.messages, reply_closed=closed))
            ep.observe(fb.observation_text(), worlds[i])
            still.append(i)
        active = still
        if turn == max_turns - 1 or not any_rank(bool(active)):  # the last turn: no rank goes on
            break
        follow_seeds = None if seeds is None else \
            [mix_seed(seeds[i // sampling.n], i % sampling.n, turn + 1) for i in active]
        follow = generate(engine, [trajectories[i].token_ids for i in active], replace(sampling, n=1), retry,
                          follow_seeds)
        completions = [per_prompt[0] for per_prompt in follow]
    return trajectories


def _stack(values: list[float | None]) -> torch.Tensor:
    """One part's floats -> [B]; a missing value (that episode's reward failed) is 0."""
    return torch.tensor([float(v or 0.0) for v in values])


def _stack_turns(values: list[list[float] | None], num_turns: int) -> torch.Tensor:
    """One per-turn part's lists -> [B, K] right-padded with 0 (K: the batch's turns, or the longest list); a
    missing list (that episode's reward failed) is empty."""
    values = [v or [] for v in values]
    width = max(num_turns, *(len(v) for v in values))
    return torch.tensor([[float(x) for x in v] + [0.0] * (width - len(v)) for v in values])


def to_batch(episodes: list[Trajectory], rewards: list[RewardResult], pad_id: int,
             temperature: float = 1.0) -> RolloutBatch:
    """Right-pad episodes into a RolloutBatch; ``rewards[i]`` is episode i's reward: its ``parts`` become
    ``reward_parts`` ([B]), its ``turns`` ``turn_parts`` ([B, K], :func:`_stack_turns`), its ``extras`` the
    metadata's ``reward_extras``; ``temperature``: what they were sampled at. Each turn's state key and observation
    text become ``state_keys`` ([B, K], -1 past a rollout's last turn) and ``observations``; a trajectory made by
    hand, without them, gives neither."""
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
    kept = any(e.state_keys for e in episodes)
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
        state_keys=torch.tensor([e.state_keys[:num_turns] + [-1] * (num_turns - len(e.state_keys[:num_turns]))
                                 for e in episodes], dtype=torch.long) if kept else None,
        observations=[e.observations[:num_turns] for e in episodes] if kept else [],
        metadata=[{"id": e.row.get("id"), "replies": e.replies, "finish": e.finish_reasons, "row": e.row,
                   "seed": e.seed, **({"reward_extras": r.extras} if r.extras else {})}
                  for e, r in zip(episodes, rewards)],
        temperature=temperature,
    )
