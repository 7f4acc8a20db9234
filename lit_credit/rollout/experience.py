"""The experience layer: every generation of a training step goes through :class:`Experience`.

Main rollouts (:meth:`Experience.rollouts`), TCPO's counterfactual resampling and every DPA role
(:meth:`Experience.sample`, :meth:`Experience.sample_messages`) share the engine's retries
(``data.engine_retry``), the failure counts (``backend/*``) and the engine's sleep / wake around the update.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from lit_credit.backends import Retry, count
from lit_credit.interfaces import Environment, Messages, Reward, RolloutEngine, ToolPrompt
from lit_credit.models.chat import ChatCodec
from lit_credit.rollout.loop import Episode, env_step, generate, run_episodes, to_batch
from lit_credit.types import Completion, Feedback, RewardResult, RolloutBatch, SamplingParams


class Experience:
    """Samples and scores with one engine, environment and reward (the :class:`~lit_credit.interfaces.Sampler`
    of augmenters and games).

    ``bind`` gives the engine the policy (once) and makes the chat codec, which writes a prompt's tools with
    ``tool_prompt`` (the task's) where the chat template ignores them. An engine in sleep mode sleeps
    through the policy update: the module calls :meth:`release` once the step's generation is done and
    :meth:`sync_weights` (which wakes it, then pushes the weights) after the update; a generation between
    the two (validation) wakes it first. ``last_generation_s`` is the wall time of the last
    :meth:`rollouts` call.
    """

    def __init__(self, engine: RolloutEngine, env: Environment, reward: Reward, sampling: SamplingParams,
                 max_turns: int, retry: Retry | None = None, max_feedback_tokens: int | None = None,
                 tool_prompt: ToolPrompt | None = None) -> None:
        self.engine, self.env, self.reward, self.sampling = engine, env, reward, sampling
        self.max_turns, self.retry, self.max_feedback_tokens = max_turns, retry, max_feedback_tokens
        self.tool_prompt = tool_prompt
        self.codec: ChatCodec | None = None
        self.last_generation_s = 0.0
        self._bound: tuple[RolloutEngine, torch.nn.Module] | None = None  # (engine, model) of the last bind
        self._released = False  # the engine was put to sleep by release() and not woken since

    def bind(self, model: torch.nn.Module, tokenizer: Any) -> None:
        """Give the engine the policy (once; later calls with the same engine and model are no-ops, an engine
        swapped in since is bound)."""
        if self._bound is None or self._bound[0] is not self.engine or self._bound[1] is not model:
            self.engine.bind(model, tokenizer)
            self.codec = ChatCodec(tokenizer, self.max_feedback_tokens, self.tool_prompt)
            self._bound = (self.engine, model)

    # -------------------------------------------------------------------------------- engine memory, weights
    @property
    def sleep_mode(self) -> bool:
        """Whether the engine frees its memory between generation phases: its ``enable_sleep_mode`` (vLLM's
        ``rollout.enable_sleep_mode``; HFEngine's is True for an FSDP2 policy, which it gathers for generation);
        False for an engine without one."""
        return bool(getattr(self.engine, "enable_sleep_mode", False))

    def release(self) -> None:
        """The step's generation is done: put an engine in sleep mode to sleep (vLLM offloads its weights and
        drops its KV cache), so the policy update has the memory. A no-op when sleep mode is off.

        One training step's engine calls, in order: ``generate`` (rollouts, refills, counterfactuals, roles),
        ``sleep`` (here), the policy update, then :meth:`sync_weights`: ``wake``, ``update_weights``; and the
        next step's ``generate``. Only an engine this method put to sleep is woken."""
        if self.sleep_mode and not self._released:
            self.engine.sleep()
            self._released = True

    def _wake(self) -> None:
        if self._released:
            self.engine.wake()
            self._released = False

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Push ``model``'s weights to the engine, waking it first if :meth:`release` put it to sleep (vLLM reloads
        weights in place only into an awake engine; asleep it would wake, reload and sleep again)."""
        self._wake()
        self.engine.update_weights(model)

    # -------------------------------------------------------------------------------- generation
    def _require_codec(self) -> ChatCodec:
        if self.codec is None:
            raise RuntimeError("Experience used before bind(model, tokenizer): the training step binds the policy "
                               "first (RolloutDataModule.bind)")
        return self.codec

    def sample(self, prompts: list[list[int]], sampling: SamplingParams, seeds: list[int] | None = None
               ) -> list[list[Completion]]:
        """``sampling.n`` completions of each token prompt (prompt ``i`` seeded ``seeds[i]``, or by the engine)
        through the engine's retries (``data.engine_retry``;
        without one an engine error propagates), an engine :meth:`release` put to sleep woken first; when every
        attempt failed each prompt gets ``n`` empty completions with finish reason ``"error"`` (counted in
        ``backend/<retry name>/*``), as in :meth:`rollouts`. No prompt: no engine call."""
        if not prompts:
            return []
        self._wake()
        return generate(self.engine, prompts, sampling, self.retry, seeds)

    def sample_messages(self, messages: Sequence[Messages], sampling: SamplingParams
                        ) -> tuple[list[list[int]], list[list[Completion]]]:
        """:meth:`sample` of chat prompts: ``(prompt ids, completions)``."""
        codec = self._require_codec()
        prompts = [codec.prompt_ids(m) for m in messages]
        return prompts, self.sample(prompts, sampling)

    def rollouts(self, rows: list[dict[str, Any]], groups: list[int], sampling: SamplingParams,
                 seeds: list[int] | None = None) -> RolloutBatch:
        """``sampling.n`` episodes per row (group ``groups[i]``, seed ``seeds[i]``: :func:`run_episodes`), run
        against the environment and scored: a RolloutBatch on CPU with finite rewards (:func:`finite_scores`) and
        the reward's ``part_weights``."""
        codec = self._require_codec()
        start = time.perf_counter()
        self._wake()  # released and not synced since (no update in between): generation needs the engine awake
        episodes = run_episodes(self.engine, codec, self.env, rows, groups, sampling, self.max_turns, self.retry,
                                seeds)
        temperature = 1.0 if sampling.greedy else sampling.temperature
        batch = finite_scores(to_batch(episodes, [self.score(e) for e in episodes], codec.pad_id, temperature))
        batch.reward_weights = {k: float(v) for k, v in (getattr(self.reward, "part_weights", None) or {}).items()}
        self.last_generation_s = time.perf_counter() - start
        return batch

    # -------------------------------------------------------------------------------- scoring
    def score(self, episode: Episode) -> RewardResult:
        """The reward of one episode; a reward that raises scores 0 (``backend/reward/errors``). A reward that
        returns anything but a :class:`~lit_credit.types.RewardResult` is a ``TypeError`` (a wrong reward, not odd
        input)."""
        try:
            result = self.reward(episode.row, episode.replies, tool_responses=episode.tool_responses,
                                 turn_scores=episode.turn_scores)
        except Exception:  # a reward bug on odd input is a zero score, counted, never a crash
            count("backend/reward/errors")
            return RewardResult(0.0)
        if not isinstance(result, RewardResult):
            raise TypeError(f"reward {type(self.reward).__name__} returned a {type(result).__name__}: a reward "
                            "returns a lit_credit.types.RewardResult(score, parts, turns, extras); fix its __call__ "
                            "(the reward= config group)")
        return result

    def verify(self, row: dict[str, Any], turn: int, reply: str) -> Feedback:
        """The environment's answer to ``reply`` at ``turn``; one that raises ends the episode (counted in
        ``backend/environment/errors``)."""
        return env_step(self.env, row, turn, reply)

    def turn_score(self, row: dict[str, Any], turn: int, reply: str) -> float:
        """The reward's score of ``reply`` as tool turn ``turn`` (``reward.turn_score``, e.g. HierR's); a reward
        that raises scores 0 (``backend/reward/errors``)."""
        scorer = getattr(self.reward, "turn_score", None)
        if scorer is None:
            raise ValueError(f"{type(self.reward).__name__} has no turn_score: augment=counterfactual_tool scores "
                             "alternative tool turns with the reward (use reward=hierr), or use "
                             "augment=counterfactual (the environment's verifier)")
        try:
            return float(scorer(row, turn, reply))
        except Exception:  # a reward bug on odd input is a zero score, counted, never a crash
            count("backend/reward/errors")
            return 0.0


def finite_scores(batch: RolloutBatch) -> RolloutBatch:
    """Replace NaN/inf in ``scores``, ``reward_parts``, ``turn_parts`` and ``turn_scores`` by 0, counting the
    values replaced (``backend/reward/nonfinite``), so the credit estimators only ever see finite rewards."""
    def clean(x: torch.Tensor) -> torch.Tensor:
        bad = ~torch.isfinite(x)
        if not bad.any():
            return x
        count("backend/reward/nonfinite", int(bad.sum()))
        return x.masked_fill(bad, 0.0)

    batch.scores = clean(batch.scores)
    batch.reward_parts = {k: clean(v) if v.is_floating_point() else v for k, v in batch.reward_parts.items()}
    batch.turn_parts = {k: clean(v) if v.is_floating_point() else v for k, v in batch.turn_parts.items()}
    if batch.turn_scores is not None:
        batch.turn_scores = clean(batch.turn_scores)
    return batch
