"""Checks of a composed run config that no single constructor can make: one-line errors naming key and fix.

Unknown group options (``method=``, ``credit=``, ``loss=``, ``augment=``, ``metrics=``, ``task=``, ``rollout=``, ...) are Hydra's to refuse; it lists
the valid ones. What is checked here: the group size, the split of a step's prompts over the processes, the split of a step's rollouts into minibatches, the
dynamic-sampling draw cap, sampling limits, limits that cannot hold together (a completion longer than the
engine's context, validation without validation prompts, a length-normalised loss that does not sum over tokens),
the loss's ranges (PPO clip, dual-clip, KL coefficient), and a vLLM ``rollout.tensor_parallel_size`` that does
not tile the trainer's processes (:func:`tensor_parallel_problem`).
"""
from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, ListConfig


class ConfigError(ValueError):
    """A run config that cannot work: ``<key>=<value>: <problem>; fix: <what to set>``."""


def _require(ok: bool, key: str, value: Any, problem: str, fix: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value}: {problem}; fix: {fix}")


def tensor_parallel_problem(tp: int, processes: int) -> str | None:
    """Why vLLM's ``rollout.tensor_parallel_size=tp`` cannot run over ``processes`` trainer processes (``problem;
    fix: ...``), or None.

    Every rank hosts one shard of its group's engine in process (vLLM's ``external_launcher`` on the trainer's
    process group; groups of ``tp`` consecutive ranks), so ``tp`` must divide the processes. One process with
    ``tp > 1`` is refused: vLLM would run the shards in worker processes, and the weight push streams a generator
    of the trainer's (gathered) tensors, which cannot be pickled to them; a list would hold a second full copy of
    the weights, and vLLM's layerwise reload cannot take chunks that split a layer."""
    if tp < 1:
        return "must be >= 1; fix: set rollout.tensor_parallel_size=1"
    if processes == 1 and tp > 1:
        return (f"with one trainer process vLLM would run the {tp} shards in worker processes, and the in-memory "
                "weight push (a generator of the trainer's tensors) cannot be handed to them; fix: run "
                f"trainer.devices={tp} (or a multiple of it), so that each rank hosts one shard in process "
                "(external_launcher), or set rollout.tensor_parallel_size=1")
    if processes % tp:
        return (f"does not divide the {processes} trainer processes (tensor-parallel groups are {tp} consecutive "
                f"ranks, one shard each); fix: trainer.devices x trainer.num_nodes a multiple of {tp}, or a "
                f"tensor_parallel_size that divides {processes}")
    return None


def _processes(trainer: DictConfig) -> int | None:
    """``trainer.devices`` (a count, or a list of device indices) x ``trainer.num_nodes``; None where Lightning
    decides (``auto``, -1)."""
    devices, nodes = trainer.get("devices", 1), trainer.get("num_nodes") or 1
    if isinstance(devices, (list, ListConfig)):
        devices = len(devices)
    if isinstance(devices, int) and devices >= 1 and isinstance(nodes, int):
        return devices * nodes
    return None


def check_config(cfg: DictConfig) -> None:
    """Raise :class:`ConfigError` on the first setting that cannot work (see the module docstring)."""
    data, method, trainer = cfg.data, cfg.method, cfg.trainer
    sampling = data.sampling
    n, prompts = sampling.n, data.prompts_per_step
    _require(n >= 2, "data.sampling.n", n, "GRPO normalises within a group of rollouts per prompt, so it needs "
             "at least 2", "set data.sampling.n=2 or more (8 is usual)")
    _require(prompts >= 1, "data.prompts_per_step", prompts, "a step needs at least one prompt",
             "set data.prompts_per_step=1 or more")
    devices, nodes = trainer.get("devices", 1), trainer.get("num_nodes") or 1
    if isinstance(devices, int) and isinstance(nodes, int) and devices * nodes > 1:
        ranks = devices * nodes
        _require(prompts % ranks == 0, "data.prompts_per_step", prompts, f"does not divide over the {ranks} "
                 f"processes (trainer.devices={devices} x trainer.num_nodes={nodes}; each rank samples an equal "
                 "share of whole prompt groups)", f"use a multiple of {ranks}, e.g. "
                 f"data.prompts_per_step={max(ranks, prompts // ranks * ranks)}")
    epochs, minibatches = method.get("ppo_epochs", 1), method.get("num_minibatches", 1)
    _require(epochs >= 1, "method.ppo_epochs", epochs, "must be >= 1", "set method.ppo_epochs=1")
    rollouts = prompts * n
    divisors = [d for d in range(1, rollouts + 1) if rollouts % d == 0]
    _require(minibatches >= 1 and rollouts % minibatches == 0, "method.num_minibatches", minibatches,
             f"does not split the {rollouts} rollouts of a step (data.prompts_per_step={prompts} x "
             f"data.sampling.n={n}) into equal minibatches",
             f"use a divisor of {rollouts}, e.g. {max(d for d in divisors if d <= max(minibatches, 1))}")
    draws = method.get("max_sampling_draws", 1)
    _require(draws >= 1, "method.max_sampling_draws", draws, "dynamic sampling draws at least the step's own "
             "prompt batch", "set method.max_sampling_draws=1 (no refill) or more (10 is DAPO's)")
    tokens = sampling.max_new_tokens
    _require(tokens >= 1, "data.sampling.max_new_tokens", tokens, "must be >= 1", "set it to the longest reply")
    if not sampling.get("greedy", False):
        _require(sampling.temperature > 0, "data.sampling.temperature", sampling.temperature,
                 "must be > 0 when sampling", "set a positive temperature, or data.sampling.greedy=true")
    _require(0 < sampling.top_p <= 1, "data.sampling.top_p", sampling.top_p, "must be in (0, 1]",
             "set data.sampling.top_p=1.0 (no nucleus cut)")
    turns = data.get("max_turns")
    _require(turns is None or turns >= 1, "data.max_turns", turns, "must be >= 1 or null",
             "set null for the environment's own limit")
    context = cfg.rollout.get("max_model_len")
    _require(context is None or tokens * (turns or 1) < context, "data.sampling.max_new_tokens", tokens,
             f"x {turns or 1} turn(s) does not fit the engine's context rollout.max_model_len={context} (the prompt "
             "needs room too)", "lower data.sampling.max_new_tokens or data.max_turns, or raise rollout.max_model_len")
    tp = cfg.rollout.get("tensor_parallel_size")
    processes = _processes(trainer)
    if tp is not None and (processes is not None or tp < 1):  # unknown processes ("auto"): the engine checks
        problem = tensor_parallel_problem(tp, processes or 1)
        if problem is not None:
            raise ConfigError(f"rollout.tensor_parallel_size={tp}: {problem}")
    steps = trainer.get("max_steps", -1)
    _require(steps is None or steps >= 1, "trainer.max_steps", steps, "lit-credit counts training steps (GRPO "
             "family: one per rollout batch, whatever its number of minibatch updates; DPA-GRPO: 2 per game round); "
             "it must be >= 1", "set trainer.max_steps to the number of steps")
    validates = cfg.get("validate_first") or trainer.get("val_check_interval") is not None
    _require(not validates or data.val_prompts >= 1, "data.val_prompts", data.val_prompts,
             "validation is on but has no prompts", "set data.val_prompts=1 or more, or validate_first=false "
             "and trainer.limit_val_batches=0")
    loss = cfg.get("loss") or {}
    clip_low = loss.get("surrogate", {}).get("clip_low")
    _require(clip_low is None or 0 < clip_low < 1, "loss.surrogate.clip_low", clip_low,
             "the PPO ratio clip must be in (0, 1)", "set 0.2 (GRPO's default)")
    dual = loss.get("surrogate", {}).get("clip_ratio_c")
    _require(dual is None or dual > 1, "loss.surrogate.clip_ratio_c", dual, "dual-clip bounds a negative-advantage "
             "token's loss at c |A|, which needs c > 1 (verl asserts it)", "set 3.0 (verl's) or null (no dual-clip, "
             "the default)")
    aggregation = loss.get("aggregation")
    _require(not loss.get("length_normalize", False) or aggregation == "seq-mean-token-sum",
             "loss.length_normalize", True, "takes each row's mean over its tokens, which needs the per-row sums of "
             f"loss.aggregation=seq-mean-token-sum, not {aggregation}",
             "set loss.aggregation=seq-mean-token-sum, or loss.length_normalize=false")
    kl = loss.get("kl_coef", 0.0)
    _require(kl >= 0, "loss.kl_coef", kl, "a KL penalty cannot be negative", "set 0 (no KL) or more")
