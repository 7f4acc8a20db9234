"""The experience layer: every generation of a training step goes through :class:`Experience`.

The step's draw and DAPO's refills (:meth:`Experience.draw`, :meth:`Experience.refill`), validation
(:meth:`Experience.draw_validation`, :meth:`Experience.sampled_validation`), TCPO's counterfactual resampling and
every DPA role (:meth:`Experience.sample`, :meth:`Experience.sample_messages`) share the engine's retries
(``data.engine_retry``), the failure counts (``backend/*``) and the engine's sleep / wake around the update.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from lit_credit.backends import CountsSince, NotRetried, Retry, count
from lit_credit.checkpoint import capture_rng, restore_rng
from lit_credit.distributed import share, world
from lit_credit.interfaces import (
    Environment,
    Messages,
    Reward,
    RolloutEngine,
    ToolPrompt,
    open_episode,
    resume,
)
from lit_credit.models.chat import ChatCodec
from lit_credit.rollout.loop import Trajectory, episode_step, generate, run_episodes, to_batch
from lit_credit.rollout.seeds import mix_seed
from lit_credit.types import Completion, Feedback, RewardResult, RolloutBatch, SamplingParams

TRAIN_STREAM, VALIDATION_STREAM = 0, 1  # the seed streams of training groups and sampled validation groups


class PromptSource(Protocol):
    """The training prompt stream as the experience layer reads it (the DataModule's
    :class:`~data_modules.rollout.PromptStream`): ``consume()`` marks the oldest batch the dataloader handed out as
    drawn; ``draw()`` is the next batch no reader has had (a refill)."""

    def consume(self) -> None: ...

    def draw(self) -> list[dict[str, Any]]: ...


class Experience:
    """Samples and scores with one engine, environment and reward: the one object a method module draws its
    experience from (``module.experience``, the DataModule's), and the :class:`~lit_credit.interfaces.Sampler` of
    augmenters and games.

    The policy: :meth:`bind` (the module's ``setup``, once) gives it the policy and makes the chat codec, which
    writes a prompt's tools with ``tool_prompt`` (the task's) where the chat template ignores them. The engine is
    handed the policy at its first use (a generation or a weight push), so a resumed run's engine starts from the
    checkpoint's weights (restored after ``setup``) and an engine swapped in since (a test's scripted engine) is
    bound too. An engine in sleep mode sleeps through the policy update: the module calls :meth:`release` once the
    step's generation is done and :meth:`sync_weights` (which wakes it, then pushes the weights) after the update; a
    generation between the two (validation) wakes it first. ``last_generation_s`` is the wall time of the last
    :meth:`rollout_groups` call.

    Prompt groups: :meth:`draw` (the training step's prompt batch, from the dataloader), :meth:`refill` (the
    stream's next batch: DAPO's dynamic sampling) and :meth:`draw_validation` mint one group id per prompt from a
    running counter, ``next_group`` (the DataModule saves it in checkpoints). Group ``g``'s rollouts are seeded
    ``mix_seed(seed, 0, g)`` (sampled validation's ``mix_seed(seed, 1, g)``; :mod:`lit_credit.rollout.seeds`), so
    they depend on the run's seed and the group id alone, not on the process or the batch that samples them.

    Several processes (data parallel): every rank is handed the step's whole prompt batch and mints the group ids
    of all of it, identically; each rank generates only its contiguous share
    (:func:`~lit_credit.distributed.share`: whole groups); :meth:`attach` (the DataModule's ``setup``) gives the
    rank, the world size and the prompt stream. With the per-group seeds a run's rollouts are the same on 1 or N
    processes. Every rank calls the engine's ``generate`` equally often, with no prompt where it has none (the
    call is a collective for a tensor-parallel vLLM group and an FSDP2 policy; the rule is the whole world's, a
    superset of every tensor-parallel group): the episodes' turns and the retries are agreed over the ranks
    (:func:`~lit_credit.rollout.loop.run_episodes`, :func:`~lit_credit.rollout.loop.generate`).

    Validation: greedy (``val_sampling``; default: greedy, n = 1, the train sampling's ``max_new_tokens`` and
    ``stop``) and, with ``val_samples > 0``, ``val_samples`` samples per prompt at temperature 1, top-p 1
    (``val_sampled``, :meth:`sampled_validation`, isolated from the training RNG); ``val_success`` is the normalised
    score at which a sampled rollout counts as solved for ``pass@k``
    (:func:`~lit_credit.analysis.metrics.pass_at_k_metrics`).

    Failures: ``backend_counts`` holds the ``backend/*`` counts (engine retries, reward and environment errors,
    non-finite rewards) since the last training step's ``backend_counts.take()``.
    """

    def __init__(self, engine: RolloutEngine, env: Environment, reward: Reward, sampling: SamplingParams,
                 max_turns: int, retry: Retry | None = None, max_feedback_tokens: int | None = None,
                 tool_prompt: ToolPrompt | None = None, *, seed: int = 0, val_sampling: SamplingParams | None = None,
                 val_samples: int = 0, val_success: float = 1.0) -> None:
        self.engine, self.env, self.reward, self.sampling = engine, env, reward, sampling
        self.max_turns, self.retry, self.max_feedback_tokens = max_turns, retry, max_feedback_tokens
        self.tool_prompt, self.seed = tool_prompt, seed
        self.val_sampling = val_sampling or SamplingParams(n=1, greedy=True, max_new_tokens=sampling.max_new_tokens,
                                                           stop=sampling.stop)
        self.val_samples, self.val_success = val_samples, val_success
        self.val_sampled = SamplingParams(n=val_samples, temperature=1.0, top_p=1.0, stop=sampling.stop,
                                          max_new_tokens=sampling.max_new_tokens) if val_samples else None
        self.backend_counts = CountsSince()  # backend/* failures since the last training step
        self.next_group = 0
        self.rank, self.world_size = 0, 1  # this process's data-parallel rank (attach)
        self.prompts: PromptSource | None = None  # the training prompt stream (attach)
        self.codec: ChatCodec | None = None
        self.last_generation_s = 0.0
        self._policy: tuple[torch.nn.Module, Any] | None = None  # (model, tokenizer) of bind
        self._bound_engine: RolloutEngine | None = None  # the engine that was handed the policy
        self._released = False  # the engine was put to sleep by release() and not woken since

    def attach(self, prompts: PromptSource, rank: int, world_size: int) -> None:
        """The training prompt stream (:meth:`draw` consumes its batches, :meth:`refill` draws from it) and this
        process's data-parallel rank among ``world_size`` (the DataModule's ``setup``)."""
        self.prompts, self.rank, self.world_size = prompts, rank, world_size

    def bind(self, model: torch.nn.Module, tokenizer: Any) -> None:
        """The policy the engine samples from, and the chat codec of its tokenizer (the module's ``setup``; the
        same policy again, a later stage's ``setup``, is a no-op). The engine is handed the policy at its first use
        (see the class docstring)."""
        if self._policy is not None and self._policy[0] is model and self._policy[1] is tokenizer:
            return
        self._policy, self._bound_engine = (model, tokenizer), None
        self.codec = ChatCodec(tokenizer, self.max_feedback_tokens, self.tool_prompt)

    def random_sources(self) -> dict[str, Any]:
        """The parts whose private random generators a checkpoint saves: the reward and its judge (a noisy judge's
        RNG), by owner name."""
        return {"reward": self.reward, "judge": getattr(self.reward, "judge", None)}

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
        next step's ``generate``. Only an engine this method put to sleep is woken; an engine not handed the
        policy yet (nothing generated) holds nothing to free."""
        if self.sleep_mode and not self._released and self._bound_engine is self.engine:
            self.engine.sleep()
            self._released = True

    def _wake(self) -> None:
        if self._released:
            self.engine.wake()
            self._released = False

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Push ``model``'s weights to the engine, waking it first if :meth:`release` put it to sleep (vLLM reloads
        weights in place only into an awake engine; asleep it would wake, reload and sleep again)."""
        self._ready_engine()
        self._wake()
        self.engine.update_weights(model)

    def _ready_engine(self) -> RolloutEngine:
        """The engine, handed the bound policy if it has not been yet (this engine: its first use)."""
        self._require_codec()  # bound
        if self._bound_engine is not self.engine:
            self.engine.bind(*self._policy)
            self._bound_engine = self.engine
        return self.engine

    # -------------------------------------------------------------------------------- prompt groups
    @torch.no_grad()
    def draw(self, rows: list[dict[str, Any]]) -> RolloutBatch:
        """The training step's rollouts of ``rows`` (the dataloader's batch, which leaves the stream's pending
        list): the train sampling, new group ids, this rank's share, on CPU."""
        self._stream().consume()
        return self._new_groups(rows, self.sampling)

    @torch.no_grad()
    def refill(self) -> RolloutBatch:
        """The rollouts of the stream's next fresh prompt batch (train sampling, new group ids, this rank's share,
        on CPU): DAPO's dynamic-sampling refill; the step stacks its draws with
        :func:`~lit_credit.types.cat_batches`. The dataloader never serves that prompt batch."""
        return self._new_groups(self._stream().draw(), self.sampling)

    @torch.no_grad()
    def draw_validation(self, rows: list[dict[str, Any]]) -> RolloutBatch:
        """The greedy validation rollouts of ``rows`` (``val_sampling``; new group ids, this rank's share), on
        CPU."""
        return self._new_groups(rows, self.val_sampling)

    @torch.no_grad()
    def sampled_validation(self, rows: list[dict[str, Any]]) -> RolloutBatch | None:
        """``val_samples`` rollouts per validation row at T = 1 (``val_sampled``), scored, this rank's share, on
        CPU; None when ``val_samples = 0`` (off).

        Isolated from training, so a run trains bitwise the same with or without it: every random state a
        step draws from (global torch and CUDA, Python, NumPy, and the private generators of the environment,
        reward and judge: :func:`~lit_credit.checkpoint.capture_rng`) is saved, torch is seeded with ``seed``,
        and all of them are put back afterwards; the group ids are ``0..len(rows)-1``, not minted from the
        counter. Reproducible: the same seed at every validation, so unchanged weights give the same samples
        (common random numbers across the steps of a run and across the runs of a sweep that share a seed). An
        engine that keeps its own sampler state (vLLM's) is outside this: its stream moves on.
        """
        if self.val_sampled is None:
            return None
        sources = {"env": self.env, **self.random_sources()}
        state = capture_rng(sources)
        torch.manual_seed(self.seed)
        try:
            return self._share(rows, list(range(len(rows))), self.val_sampled, VALIDATION_STREAM)
        finally:
            restore_rng(state, sources)

    def _stream(self) -> PromptSource:
        if self.prompts is None:
            raise RuntimeError("Experience.draw / refill before the DataModule's setup attached the prompt stream "
                               "(RolloutDataModule.setup)")
        return self.prompts

    def _new_groups(self, rows: list[dict[str, Any]], sampling: SamplingParams) -> RolloutBatch:
        """This rank's share of the rollouts of ``rows`` (every rank's rows), group ids minted for all of them."""
        groups = list(range(self.next_group, self.next_group + len(rows)))
        self.next_group += len(rows)
        return self._share(rows, groups, sampling)

    def _share(self, rows: list[dict[str, Any]], groups: list[int], sampling: SamplingParams,
               stream: int = TRAIN_STREAM) -> RolloutBatch:
        """This rank's share of ``rows``' rollouts, group ``g`` seeded ``mix_seed(seed, stream, g)``."""
        mine = share(len(rows), self.rank, self.world_size)
        seeds = [mix_seed(self.seed, stream, g) for g in groups[mine]]
        return self.rollout_groups(rows[mine], groups[mine], sampling, seeds)

    # -------------------------------------------------------------------------------- generation
    def _require_codec(self) -> ChatCodec:
        if self.codec is None:
            raise RuntimeError("Experience used before bind(model, tokenizer): the module binds its policy in "
                               "setup (PolicyModule.setup); outside a Trainer call experience.bind first")
        return self.codec

    def sample(self, prompts: list[list[int]], sampling: SamplingParams, seeds: list[int] | None = None
               ) -> list[list[Completion]]:
        """``sampling.n`` completions of each token prompt (prompt ``i`` seeded ``seeds[i]``, or by the engine)
        through the engine's retries (``data.engine_retry``;
        without one an engine error propagates), an engine :meth:`release` put to sleep woken first; when every
        attempt failed each prompt gets ``n`` empty completions with finish reason ``"error"`` (counted in
        ``backend/<retry name>/*``), as in :meth:`rollout_groups`. No prompt: no engine call in one process;
        with several, an engine call with no prompt, for the call is a collective (a tensor-parallel group's
        engine, an FSDP2 policy's gather; :func:`~lit_credit.rollout.loop.generate`): every rank reaches each
        ``sample`` of a step (the same game, the same augmenter), whatever its share holds."""
        if not prompts and world()[1] == 1:
            return []
        engine = self._ready_engine()
        self._wake()
        return generate(engine, prompts, sampling, self.retry, seeds)

    def sample_messages(self, messages: Sequence[Messages], sampling: SamplingParams
                        ) -> tuple[list[list[int]], list[list[Completion]]]:
        """:meth:`sample` of chat prompts: ``(prompt ids, completions)``."""
        codec = self._require_codec()
        prompts = [codec.prompt_ids(m) for m in messages]
        return prompts, self.sample(prompts, sampling)

    def rollout_groups(self, rows: list[dict[str, Any]], groups: list[int], sampling: SamplingParams,
                       seeds: list[int] | None = None) -> RolloutBatch:
        """``sampling.n`` episodes per row (group ``groups[i]``, seed ``seeds[i]``: :func:`run_episodes`), run
        against the environment and scored: a RolloutBatch on CPU with finite rewards (:func:`finite_scores`) and
        the reward's ``part_weights``. The group ids and seeds are the caller's (:meth:`draw` mints them)."""
        codec = self._require_codec()
        engine = self._ready_engine()
        start = time.perf_counter()
        self._wake()  # released and not synced since (no update in between): generation needs the engine awake
        episodes = run_episodes(engine, codec, self.env, rows, groups, sampling, self.max_turns, self.retry, seeds)
        temperature = 1.0 if sampling.greedy else sampling.temperature
        batch = finite_scores(to_batch(episodes, [self.score(e) for e in episodes], codec.pad_id, temperature))
        batch.reward_weights = {k: float(v) for k, v in (getattr(self.reward, "part_weights", None) or {}).items()}
        self.last_generation_s = time.perf_counter() - start
        return batch
    # -------------------------------------------------------------------------------- scoring
    def score(self, episode: Trajectory) -> RewardResult:
        """The reward of one episode; a reward that raises scores 0 (``backend/reward/errors``). A reward that
        returns anything but a :class:`~lit_credit.types.RewardResult` is a ``TypeError`` (a wrong reward, not odd
        input)."""
        try:
            result = self.reward(episode.row, episode.replies, tool_responses=episode.tool_responses,
                                 turn_scores=episode.turn_scores)
        except NotRetried:
            raise
        except Exception:  # a reward bug on odd input is a zero score, counted, never a crash
            count("backend/reward/errors")
            return RewardResult(0.0)
        if not isinstance(result, RewardResult):
            raise TypeError(f"reward {type(self.reward).__name__} returned a {type(result).__name__}: a reward "
                            "returns a lit_credit.types.RewardResult(score, parts, turns, extras); fix its __call__ "
                            "(the reward= config group)")
        return result

    def verify(self, row: dict[str, Any], turn: int, reply: str, prefix: Sequence[str] | None = None,
               seed: int = 0) -> Feedback:
        """The environment's answer to ``reply`` at ``turn``: the episode of ``row`` and ``seed`` continued after the
        ``prefix`` replies (``turn`` of them; :func:`~lit_credit.interfaces.resume`: skipped where the episode allows,
        else replayed), then stepped with ``reply``. Without ``prefix`` the episode must skip (its answers depend on
        the turn alone, a :class:`~lit_credit.interfaces.TurnEpisode`). An environment that raises ends the episode
        (counted in ``backend/environment/errors``)."""
        if prefix is not None and len(prefix) != turn:
            raise ValueError(f"verify: turn {turn} after a prefix of {len(prefix)} replies")
        if prefix is None and turn > 0 and not callable(getattr(open_episode(self.env, row, seed), "skip", None)):
            raise ValueError(f"verify at turn {turn} without its prefix: {type(self.env).__name__}'s episodes keep "
                             "state between turns; pass the replies before the turn (prefix=)")
        try:
            episode = resume(self.env, row, seed, [""] * turn if prefix is None else prefix)
        except NotRetried:
            raise
        except Exception:  # an environment bug on odd input must not end the run
            count("backend/environment/errors")
            return Feedback(done=True)
        return episode_step(episode, reply)

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
        except NotRetried:
            raise
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
