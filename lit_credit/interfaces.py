"""The interfaces of every layer, in one place (docs/design.md, "Extension points").

Bottom to top, each is what one layer offers the next:

- :class:`RolloutEngine` (rollout): token prompts in, sampled :class:`~lit_credit.types.Completion` s out;
- :class:`Environment` and :class:`Episode` (tasks): each rollout is an episode of the environment, made from the
  prompt row and a seed, that keeps its own state and answers each assistant turn with
  :class:`~lit_credit.types.Feedback`; :class:`TurnEnvironment`: an environment whose answer depends on the row,
  the turn and the reply alone;
- :class:`ToolPrompt` (tasks): the text that offers a prompt's tools to the policy, which the chat codec and the
  embedded chat template write;
- :class:`Demonstrations` (tasks): what the SFT warm start reads of a task (gold conversations, the tokenizer's
  corpus);
- :class:`Reward` (rewards): one finished episode in, a :class:`~lit_credit.types.RewardResult` out;
- :class:`CreditEstimator` (credit): a :class:`~lit_credit.types.RolloutBatch` in, token advantages out;
- :class:`Sampler` (rollout): the experience layer as augmenters and games see it: every generation of a
  training step goes through it, with the engine's retries, failure counts and sleep / wake;
- :class:`Augmenter` (rollout): adds experience a credit estimator needs to a scored batch (TCPO's
  counterfactual alternatives);
- :class:`Actor` and :class:`Game` (tasks): a multi-role game the module drives; the actor callback samples
  one role's replies (the module switches that role's adapter in); the game returns a
  :class:`~lit_credit.types.GameRecord`;
- :class:`MetricSet` (analysis): a method's rollout metrics of a batch.

Concrete classes need not inherit from these Protocols (but :class:`CreditEstimator`, an ABC whose
``__repr__`` every estimator shares): matching the signatures is enough.
"""
from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from lit_credit.types import (
    Completion,
    CreditOutput,
    Feedback,
    GameRecord,
    RewardResult,
    RolloutBatch,
    SamplingParams,
)

Messages = list[dict[str, str]]


@runtime_checkable
class RolloutEngine(Protocol):
    """Samples continuations of token prompts with behaviour log-probs.

    ``bind`` hands the engine the trainer's policy once; ``update_weights`` is called after every
    optimiser step (the engine must then sample from the new weights); ``sleep``/``wake`` free and
    restore engine memory between rollout phases (no-ops where meaningless). An engine whose
    ``enable_sleep_mode`` attribute is true is put to sleep once a training step's generation is done
    (:meth:`Sampler.release`) and woken before the new weights are pushed (``sync_weights``): per step
    ``generate``, ``sleep``, the policy update, ``wake``, ``update_weights``. Without that attribute
    ``sleep``/``wake`` are never called.

    ``generate(prompts, sampling, seeds)`` returns ``sampling.n`` completions per prompt; ``seeds[i]`` (an int in
    ``[0, 2**63)``) seeds prompt i's completions, so that they do not depend on the batch or process the prompt
    is sampled in (the rollouts of a prompt group are seeded from the run's seed and the group id); ``None``: the
    engine seeds them itself (from torch's global generator, HFEngine).
    """

    def bind(self, model: torch.nn.Module, tokenizer: Any) -> None: ...

    def generate(self, prompts: list[list[int]], sampling: SamplingParams,
                 seeds: list[int] | None = None) -> list[list[Completion]]: ...

    def update_weights(self, model: torch.nn.Module) -> None: ...

    def sleep(self) -> None: ...

    def wake(self) -> None: ...


@runtime_checkable
class Episode(Protocol):
    """One rollout's own world: made by :meth:`Environment.episode` from the prompt row and a seed, it keeps its
    state between turns (a history, a board, a file system).

    ``reset()``: the first observation as chat messages (the prompt the policy answers first); every episode of
    one row starts the same, whatever its seed. ``step(reply)``: the policy's reply in, :class:`~lit_credit.types.Feedback`
    out (the next observation as ``messages``, its text as :meth:`Feedback.observation_text
    <lit_credit.types.Feedback.observation_text>`, a turn ``score``, ``done``; ``info["tool_responses"]`` for the
    reward). ``state_key()``: the current state as a hashable value with a deterministic ``repr`` (str, int,
    bytes, tuples of them): the environment's canonical state (a board), or its last observation text when it
    has no other; equal keys mean the same state, so an estimator can group turns by state
    (``RolloutBatch.state_keys``).

    The state after replies ``r_0..r_k`` is a function of the row, the seed and the replies: a fresh episode of the
    same row and seed, reset and stepped with the same replies, reaches it (:func:`resume`). Optional:
    ``clone()`` (an independent copy of the episode in its current state) and ``skip(replies)`` (reach the state
    after ``replies`` without stepping them, for an episode whose answers depend on the turn index alone).
    """

    def reset(self) -> list[dict[str, str]]: ...

    def step(self, reply: str) -> Feedback: ...

    def state_key(self) -> Hashable: ...


@runtime_checkable
class Environment(Protocol):
    """Makes the episodes of a task (:meth:`lit_credit.tasks.Task.environment`), each up to ``max_turns``
    assistant turns. ``episode(row, seed)``: a new :class:`Episode` of the prompt ``row`` (shared, never mutated:
    the n rollouts of a prompt are n episodes of one row); the row fixes the start, the ``seed`` the episode's own
    randomness (the rollout loop gives each rollout its own). Optional: ``step_many(episodes, replies)``, one call
    that steps many episodes (an environment served remotely); without it the loop steps them one by one
    (:func:`step_many`)."""

    max_turns: int

    def episode(self, row: dict[str, Any], seed: int) -> Episode: ...


class TurnEpisode:
    """The episode of a :class:`TurnEnvironment`: its state is the turn index and its last observation text
    (the state key); ``step`` answers with ``env.step(row, turn, reply)``. ``skip(replies)`` moves to turn
    ``len(replies)`` without asking the environment (its answers depend on the turn alone); the state key is then
    unknown (``None``) until the next step."""

    def __init__(self, env: TurnEnvironment, row: dict[str, Any], seed: int) -> None:
        self.env, self.row, self.seed = env, row, seed
        self.turn, self.observation = 0, None

    def reset(self) -> list[dict[str, str]]:
        messages = list(self.row["prompt"])
        self.turn, self.observation = 0, "\n".join(str(m.get("content") or "") for m in messages)
        return messages

    def step(self, reply: str) -> Feedback:
        feedback = self.env.step(self.row, self.turn, reply)
        self.turn += 1
        self.observation = feedback.observation_text()
        return feedback

    def state_key(self) -> Hashable:
        return self.observation

    def skip(self, replies: Sequence[str]) -> None:
        self.turn, self.observation = len(replies), None

    def clone(self) -> TurnEpisode:
        return copy.copy(self)


class TurnEnvironment(ABC):
    """An environment whose answer to a reply depends on the row, the turn index and the reply alone
    (``step(row, turn, reply) -> Feedback``, what a subclass writes): each episode is a :class:`TurnEpisode` over
    it. The shipped tasks' environments (single turn, tools, revision against a verifier) are ones."""

    max_turns: int = 1

    def episode(self, row: dict[str, Any], seed: int) -> Episode:
        return TurnEpisode(self, row, seed)

    @abstractmethod
    def step(self, row: dict[str, Any], turn: int, reply: str) -> Feedback: ...


def open_episode(env: Environment | TurnEnvironment, row: dict[str, Any], seed: int) -> Episode:
    """``env.episode(row, seed)``; an environment with only ``step(row, turn, reply)`` (the contract before
    episodes) is played as a :class:`TurnEnvironment`."""
    make = getattr(env, "episode", None)
    return make(row, seed) if make is not None else TurnEpisode(env, row, seed)


def step_many(env: Environment, episodes: Sequence[Episode], replies: Sequence[str]) -> list[Feedback]:
    """Each episode stepped with its reply: ``env.step_many`` where the environment has it (one call), else one
    ``step`` each, in order."""
    batched = getattr(env, "step_many", None)
    if batched is not None:
        return list(batched(episodes, replies))
    return [e.step(r) for e, r in zip(episodes, replies, strict=True)]


def resume(env: Environment, row: dict[str, Any], seed: int, replies: Sequence[str]) -> Episode:
    """The episode of ``row`` and ``seed`` in its state after ``replies``: a fresh episode reset and then skipped
    (where it offers ``skip``) or stepped with each reply (a replay, always available)."""
    episode = open_episode(env, row, seed)
    episode.reset()
    skip = getattr(episode, "skip", None)
    if skip is not None:
        skip(list(replies))
    else:
        for reply in replies:
            episode.step(reply)
    return episode


def fork(episode: Episode, env: Environment | None = None, row: dict[str, Any] | None = None, seed: int = 0,
         replies: Sequence[str] = ()) -> Episode:
    """An independent copy of ``episode`` in its current state: its ``clone()`` where it has one, else
    :func:`resume` of ``env``, ``row``, ``seed`` and the ``replies`` that led there."""
    clone = getattr(episode, "clone", None)
    if clone is not None:
        return clone()
    if env is None or row is None:
        raise ValueError(f"{type(episode).__name__} has no clone(): fork it by replay, with env, row, seed and replies")
    return resume(env, row, seed, replies)


@runtime_checkable
class ToolPrompt(Protocol):
    """How a task's prompts offer their tools (:attr:`lit_credit.tasks.Task.tool_prompt`).

    ``text(tools)`` is the system message that lists ``tools`` (JSON schemas) and tells the policy how to call
    them; ``instruction`` is its last part, the how. The chat codec writes ``text(tools)`` itself for a chat
    template that ignores ``tools`` (:class:`~lit_credit.models.ChatCodec`); the embedded chat template
    (:func:`~lit_credit.models.tokenizer.chat_template`) lists the tools itself, ``<tools>``, one
    ``name(arg: type, ...) - description`` line per tool, ``</tools>``, then ``instruction``: a task whose prompts
    the embedded policy reads writes that same text.
    """

    instruction: str

    def text(self, tools: Sequence[dict[str, Any]]) -> str: ...


@runtime_checkable
class Demonstrations(Protocol):
    """What the SFT warm start of the embedded policy reads of a task (:class:`~lit_credit.models.EmbeddedPolicy`):
    its ``name`` (of the cache directory), gold conversations (dicts with ``messages`` and optional ``tools``) to
    train on, the text the tokenizer is trained on, and the :class:`ToolPrompt` the chat template ends its tool
    list with. Every :class:`~lit_credit.tasks.Task` is one."""

    name: str
    tool_prompt: ToolPrompt

    def demonstrations(self, num: int, seed: int) -> Iterable[dict[str, Any]]: ...

    def corpus(self, num: int = 2000) -> Iterable[str]: ...


@runtime_checkable
class Reward(Protocol):
    """Scores one episode. ``replies`` are the assistant turns' texts, in order; ``tool_responses`` are
    the environment's answers the policy saw (tool outputs, in order), for rewards that judge their use;
    ``turn_scores`` are the environment's per-turn verifier scores (None where a turn was not scored).

    Returns a :class:`~lit_credit.types.RewardResult`: the total ``score``, named float ``parts``, per-turn
    lists ``turns`` and non-numeric ``extras``. Bad model output is never an exception: it scores 0 and the
    reason is a part (e.g. ``format``). A reward whose score is a weighted sum of named parts says so in an
    optional ``part_weights`` attribute (``{part: weight}``; HierR's ``process`` and ``summary``), which every
    batch carries as ``reward_weights`` (SLCA's segment weights, the success normaliser).
    """

    def __call__(self, row: dict[str, Any], replies: list[str],
                 tool_responses: Sequence[str] | None = None,
                 turn_scores: Sequence[float | None] | None = None) -> RewardResult: ...


class CreditEstimator(ABC):
    """``RolloutBatch -> CreditOutput``: per-token advantages, zero wherever ``response_mask == 0``.

    A small plain class with keyword-only, type-hinted ``__init__`` arguments stored as attributes, or a
    keyword-only dataclass of its settings (TCPO's and SLCA's: one settings object per family), so Hydra
    (``_target_``) and LightningCLI (``class_path``) build the same object. Every estimator first runs
    :func:`~lit_credit.credit.registry.check_batch` on the fields it reads, so an empty batch, a field with the
    wrong number of rows or a NaN / inf input is a ``ValueError`` naming the field, never NaN credit.
    ``needs`` names the ``batch.extras`` an :class:`Augmenter` must add first (TCPO's counterfactual preset:
    ``{"alt_scores", "cf_mask"}``); the module refuses a configuration where no augmenter provides them.
    """

    @property
    def needs(self) -> frozenset[str]:
        return frozenset()

    @abstractmethod
    def __call__(self, batch: RolloutBatch) -> CreditOutput: ...

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class Sampler(Protocol):
    """The experience layer (:class:`~lit_credit.rollout.Experience`) as augmenters and games use it.

    ``sample``: completions of token prompts (``sampling.n`` each; prompt ``i`` seeded ``seeds[i]``, or by the
    engine) through the engine's retries (a prompt whose every attempt failed gets ``n`` empty completions,
    finish reason ``"error"``, counted);
    ``sample_messages``: the same from chat messages, with their prompt ids; ``verify(row, turn, reply, prefix,
    seed)``: the environment's answer to an alternative reply at ``turn``, from the episode of ``row`` and
    ``seed`` continued after the ``prefix`` replies (:func:`resume`; an environment that raises ends the episode,
    counted); ``turn_score``:
    the reward's score of an alternative tool turn (a reward that raises scores 0, counted).
    """

    sampling: SamplingParams

    def sample(self, prompts: list[list[int]], sampling: SamplingParams, seeds: list[int] | None = None
               ) -> list[list[Completion]]: ...

    def sample_messages(self, messages: Sequence[Messages], sampling: SamplingParams
                        ) -> tuple[list[list[int]], list[list[Completion]]]: ...

    def verify(self, row: dict[str, Any], turn: int, reply: str, prefix: Sequence[str] | None = None,
               seed: int = 0) -> Feedback: ...

    def turn_score(self, row: dict[str, Any], turn: int, reply: str) -> float: ...


@runtime_checkable
class Augmenter(Protocol):
    """Adds experience a credit estimator needs to a scored batch, in place, before credit: the
    ``batch.extras`` named in ``provides`` (the module runs it only when its estimator ``needs`` them).
    Every generation goes through ``sampler``. Returns metrics to log."""

    provides: frozenset[str]

    def __call__(self, batch: RolloutBatch, sampler: Sampler) -> dict[str, float]: ...


@runtime_checkable
class Actor(Protocol):
    """Samples one role's replies to a list of chat prompts for a :class:`Game`: ``(prompt ids, completions)``
    per prompt, ``sampling.n`` completions each. The module's actor activates the role's adapter (and pushes
    it to an engine with its own weights) before it samples."""

    def __call__(self, role: str, messages: Sequence[Messages], sampling: SamplingParams
                 ) -> tuple[list[list[int]], list[list[Completion]]]: ...


@runtime_checkable
class Game(Protocol):
    """A multi-role game a task offers (DPA-GRPO's verifier / reviser / approver game on a form line).

    ``play`` takes the step's scored proposals and an :class:`Actor`, and returns the game's record (a
    :class:`~lit_credit.types.GameRecord`): each role's action sequences with their rewards, each decision's case,
    and the round's metrics. ``training=False`` plays the validation game (no exploration, no choice among
    revisions). A game holds no model: testable with a scripted actor and no Trainer."""

    roles: tuple[str, ...]

    def play(self, proposals: RolloutBatch, actor: Actor, sampling: SamplingParams, training: bool
             ) -> GameRecord: ...


@runtime_checkable
class MetricSet(Protocol):
    """A method's rollout metrics of one batch, under ``<stage>/`` (``train``, ``val``), chosen in config
    (``metrics=tool``, ``metrics=turn``). ``context`` holds what the batch does not: ``max_turns`` (the
    environment's)."""

    def __call__(self, batch: RolloutBatch, stage: str, context: Mapping[str, Any]) -> dict[str, float]: ...


__all__ = ["Actor", "Augmenter", "CreditEstimator", "Demonstrations", "Environment", "Episode", "Game", "Messages",
           "MetricSet", "Reward", "RolloutEngine", "Sampler", "ToolPrompt", "TurnEnvironment", "TurnEpisode", "fork",
           "open_episode", "resume", "step_many"]
