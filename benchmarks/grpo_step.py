"""One GRPO training step, lit-credit against TRL's ``GRPOTrainer``, side by side: on the embedded tiny policy
(``--model embedded``, vocabulary 272) or on SmolLM2-135M-Instruct (``--model smollm2``, vocabulary 49 152).

Run (TRL lives in its own venv, not a project dependency)::

    benchmarks/setup_trl_env.sh                       # once: benchmarks/.venv-trl
    benchmarks/.venv-trl/bin/python -m benchmarks.grpo_step
    benchmarks/.venv-trl/bin/python -m benchmarks.grpo_step --settings eos8 --repeats 1   # quicker
    benchmarks/.venv-trl/bin/python -m benchmarks.grpo_step --threads 1   # steadier on a shared machine
    benchmarks/.venv-trl/bin/python -m benchmarks.grpo_step --profile lit --settings eos8  # cProfile steps
    benchmarks/.venv-trl/bin/python -m benchmarks.grpo_step --model smollm2   # the real vocabulary (fixed64)

Both frameworks are driven from the same Hydra config (``conf/train.yaml`` + ``experiment=grpo_arith``): the
model (the embedded policy of the default job, built once under ``.cache/lit-credit/embedded/``, or
``model=smollm2``, converted once under ``.cache/lit-credit/smollm2/``; full fine-tuning, no LoRA), the
``ArithTask`` train prompts, the exact-match reward, ``--prompts`` x ``--group`` completions per step (16 x 8
on the embedded policy, 4 x 4 on SmolLM2), temperature 1, top_p 1, top_k off, AdamW lr 1e-4 (constant), PPO
clip 0.2, k3 KL to a frozen reference with coefficient 0.001, token-mean loss, one optimiser update per step
(``method.num_minibatches=1``), grad-norm clip 1.0, fp32 on CPU. lit-credit's log-probs come from its chunked
LM head where the model config turns it on (``model.head_chunk_tokens``: 4096 for SmolLM2, off for the
embedded policy); TRL's from its own fused chunked head. lit-credit runs its real path
(``lit_credit.train.build(cfg)`` -> Lightning ``Trainer.fit`` of ``GRPOModule`` + ``RolloutDataModule``); TRL
runs ``GRPOTrainer.train()`` with the equivalent ``GRPOConfig`` (``loss_type="dapo"``, its token-mean).

Settings: ``eos8`` is the default job (``max_new_tokens=8``, completions stop at EOS, so both sides generate
about the same number of tokens, not exactly the same); ``fixedN`` forces exactly N tokens per completion on
both sides (``min_new_tokens = max_new_tokens = N`` and the pad token suppressed, through a copy of the model
directory whose ``generation_config.json`` says so, and TRL's ``generation_kwargs``), since the SFT-warmed
policy answers in 2-3 tokens and a bare ``max_new_tokens=64`` would change nothing.

Each (setting, framework, repeat) runs in its own subprocess (its own peak RSS), interleaved lit, trl, then
trl, lit, ...; each run does ``--warmup`` + ``--steps`` optimiser steps and the first ``--warmup`` are
dropped. A step's time is the wall time between consecutive step ends (Lightning ``on_train_batch_end``, HF
``on_step_end``): everything the framework does per step, loader and logging included; the process CPU time
over the same interval is recorded beside it. Output: a markdown
table on stdout and ``benchmarks/results/grpo_step.json`` (per-step raw figures, machine, versions, and the
remaining differences between the two set-ups).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.machine import write_results

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
FRAMEWORKS = ("lit", "trl")
# --model: its config overrides, default prompts x group per step and default settings.
MODELS = {"embedded": {"overrides": [], "prompts": 16, "group": 8, "settings": "eos8,fixed64"},
          "smollm2": {"overrides": ["model=smollm2"], "prompts": 4, "group": 4, "settings": "fixed64"}}
NAMES = {"lit": "lit-credit", "trl": "TRL"}

# What stays different between the two set-ups (measured or not); printed and stored with the figures.
DIFFERENCES = [
    "Generation: both call HF `model.generate` (KV cache, sampling, temperature 1, top_p 1, top_k 0) on all "
    "rows of the step in one batch; lit-credit also asks for `output_logits=True, return_dict_in_generate=True` and "
    "turns them into behaviour log-probs in place (its engine/trainer log-prob-gap check); TRL does not.",
    "Log-probs: lit-credit's `token_logprobs` (lit_credit/models/logprobs.py) runs micro-batches of rows "
    "sorted by length, at most method.logprob_token_budget = 16384 tokens (one micro-batch here unless "
    "--micro-rows), and the update backpropagates each micro-batch before the next (gradients accumulated); on the "
    "embedded policy it works on their full-vocabulary [B, T, V] float32 logits, on SmolLM2 through the "
    "chunked LM head (lit_credit/models/chunked_head.py: 4096 tokens at a time, log-probs and entropy with "
    "its own backward, [B, T, V] never materialised); TRL patches the model with its chunked fused LM head (`add_fused_lm_head`: log-probs and "
    "entropy chunk by chunk, logits recomputed in backward; on CPU it scores every position, then keeps the "
    "completion ones). TRL computes the per-token entropy in the reference pass too; lit-credit only in the "
    "policy pass, and takes reference log-probs in place (no [B, T, V] temporary beyond the logits).",

    "Padding: lit-credit right-pads prompt + completion as one sequence; TRL left-pads prompts and right-pads"
    " completions (same token content; arithmetic prompts all have the same length here).",
    "Reference model: lit-credit deep-copies the loaded policy; TRL loads a second copy from the same "
    "directory (same weights, both frozen, fp32).",
    "Advantages: both (r - group mean) / (group std + eps) with the unbiased std; eps 1e-6 (lit-credit) vs "
    "1e-4 (TRL).",
    "Loss: same per-token clipped surrogate + 0.001 * k3 KL, token-mean over the step's completions (TRL "
    "loss_type='dapo' = sum / number of completion tokens of the generation batch, over its micro-batches); TRL adds"
    " the KL before masking, lit-credit masks then adds (same value on completion tokens).",
    "Optimiser: both torch.optim.AdamW (TRL optim='adamw_torch', not fused), lr 1e-4, betas (0.9, 0.999), eps"
    " 1e-8, weight decay 0, grad-norm clip 1.0; LR schedule constant on both (the default job's 10-step "
    "LinearLR warm-up is switched off, method.lr_scheduler=null, TRL lr_scheduler_type='constant').",
    "Per-step extras: lit-credit logs ~30 scalars via `self.log_dict` (logger off, progress bar off), "
    "computes credit leakage, zero-variance groups, clip fractions and the log-prob gap; TRL logs its ~25 "
    "metrics every step (logging_steps=1, report_to none, tqdm off) through Trainer.log.",
    "Data: both draw --prompts distinct train prompts per step from the same 160-prompt ArithTask train split, in "
    "different orders (lit-credit: PromptStream with its seed; TRL: RepeatSampler), so the prompts differ per"
    " step (all prompts have the same token length).",
    "Sampling RNG: both seeded with 0 but the draws differ, so completions (and with EOS stops, their "
    "lengths) differ; in eos8 compare the generated-token columns, in fixedN every completion has exactly N "
    "tokens.",
    "Frameworks' own loop costs are included on purpose: Lightning's fit loop (manual optimisation, hooks) vs"
    " HF Trainer + accelerate (CPU, no DDP); no checkpointing, no validation/eval, gradient checkpointing on "
    "both sides with --activation-checkpointing and off on both otherwise (TRL's default is on), fp32 (TRL's "
    "bf16 default switched off), no vLLM.",
    "Imports differ (Lightning + Hydra vs HF Trainer + TRL + accelerate), which shows in the RSS at the start"
    " of training; the 'train peak' column is the peak RSS reached during fit after that start.",
    "Threads: both children run with the same torch intra-op thread count (torch's default, or --threads). "
    "With 2 threads on a shared 2-core machine a busy neighbour stalls every parallel region (steps 5-10x "
    "slower, CPU time inflated as well): compare per-run medians, or use --threads 1 there.",
]


# ------------------------------------------------------------------------------------------- shared helpers

def _status() -> dict[str, int]:
    """VmRSS and VmHWM of this process, KiB."""
    text = Path("/proc/self/status").read_text()
    return {k: int(re.search(rf"{k}:\s+(\d+)", text).group(1)) for k in ("VmRSS", "VmHWM")}


def _reset_peak_rss() -> bool:
    """Reset the peak-RSS counters (VmHWM and, on Linux, ru_maxrss) to the current RSS; False if refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def library_digest() -> str:
    """A short hash of lit-credit's sources as this process sees them (they may change between runs)."""
    import hashlib

    h = hashlib.sha256()
    paths = [*ROOT.glob("lit_credit/**/*.py"), *ROOT.glob("data_modules/*.py"), *ROOT.glob("conf/**/*.yaml")]
    for path in sorted(paths):
        h.update(path.relative_to(ROOT).as_posix().encode() + path.read_bytes())
    return h.hexdigest()[:12]


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def compose(setting: dict[str, Any], steps: int, model_dir: str | None, output_dir: str, shape: dict[str, Any]):
    """The lit-credit config of the default job (``experiment=grpo_arith``) for ``steps`` training steps, with
    ``shape``'s model (``model``: a key of MODELS) and ``prompts`` x ``group`` completions per step."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from lit_credit.train import CONF_DIR

    overrides = [
        "experiment=grpo_arith", "callbacks=none", "~logger", "validate_first=false",
        "method.lr_scheduler=null",  # constant LR on both sides (TRL: lr_scheduler_type="constant")
        "method.num_minibatches=1",  # one optimiser update per rollout batch (TRL: steps_per_generation=1)
        *MODELS[shape["model"]]["overrides"],
        *(["model.activation_checkpointing=true"] if shape["activation_checkpointing"] else []),
        f"data.prompts_per_step={shape['prompts']}", f"data.sampling.n={shape['group']}",
        f"trainer.max_steps={steps}", "+trainer.enable_progress_bar=false",
        "+trainer.enable_checkpointing=false", "+trainer.limit_val_batches=0",
        f"data.sampling.max_new_tokens={setting['max_new_tokens']}",
    ]
    if model_dir is not None:
        overrides.append(f"model.path={model_dir}")
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        cfg = hydra_compose("train", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.output_dir = output_dir
        cfg.paths.cache_dir = os.environ.get("LIT_CREDIT_CACHE", str(ROOT / ".cache" / "lit-credit"))
        del cfg.hydra
    return cfg


def parse_setting(name: str) -> dict[str, Any]:
    m = re.fullmatch(r"(eos|fixed)(\d+)", name)
    if not m:
        raise SystemExit(f"--settings: {name!r} is not eosN or fixedN (e.g. eos8, fixed64)")
    return {"name": name, "max_new_tokens": int(m.group(2)), "fixed": m.group(1) == "fixed"}


class GenerateTimer:
    """Wraps ``model.generate`` (instance attribute): wall time, decode steps and generated tokens per call.

    Tokens of a row: up to and including its first EOS, or every new position when it has none (TRL's
    completion mask; the same count on both sides)."""

    def __init__(self, model, eos_id: int) -> None:
        self.inner, self.eos_id, self.calls = model.generate, eos_id, []
        model.generate = self

    def __call__(self, *args, **kwargs):
        import torch

        width = kwargs["input_ids"].shape[1]
        start, cpu = time.perf_counter(), time.process_time()
        out = self.inner(*args, **kwargs)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        new = (out if isinstance(out, torch.Tensor) else out.sequences)[:, width:]
        is_eos = new == self.eos_id
        lengths = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, new.shape[1])
        self.calls.append({"seconds": seconds, "cpu_s": cpu, "rows": new.shape[0],
                           "decode_steps": new.shape[1], "tokens": int(lengths.sum())})
        return out


class StepWindow:
    """Turns ``profiler`` (a ``cProfile.Profile`` or None) on at the start of step ``first`` and off at the
    end of step ``last`` (0-based), so a profile holds the measured steps only, not imports and set-up."""

    def __init__(self, profiler, first: int, last: int) -> None:
        self.profiler, self.first, self.last = profiler, first, last

    def step_start(self, index: int) -> None:
        if self.profiler is not None and index == self.first:
            self.profiler.enable()

    def step_end(self, index: int) -> None:
        if self.profiler is not None and index == self.last:
            self.profiler.disable()


# ----------------------------------------------------------------------------------------- the two children

def child_lit(setting: dict[str, Any], steps: int, model_dir: str | None, workdir: str,
              window: StepWindow, shape: dict[str, Any]) -> dict[str, Any]:
    import lightning as L
    import torch

    from lit_credit.train import build

    cfg = compose(setting, steps, model_dir, workdir, shape)
    module, datamodule, trainer = build(cfg)  # the path of `lit-credit` (train.train minus the run-dir claim)
    gen = GenerateTimer(module.policy, module.tokenizer.eos_token_id)
    update_forwards: list[int] = []  # forward passes with a graph (one per update micro-batch), per step
    module.policy.register_forward_pre_hook(lambda *_: update_forwards.append(1) if torch.is_grad_enabled() else None)
    if shape["micro_rows"]:
        # --micro-rows K: a token budget of K rows at the step's width (fixed-length rows: exactly K per micro-batch)
        anchor = module.anchor_logprobs

        def budgeted_anchor(batch):
            module.logprob_token_budget = shape["micro_rows"] * batch.input_ids.shape[1]
            return anchor(batch)

        module.anchor_logprobs = budgeted_anchor
    ends: list[tuple[float, float]] = []  # (wall, process CPU) at the start and at every step end
    per_step: list[dict[str, float]] = []

    class StepTimer(L.Callback):
        def on_train_start(self, trainer, pl_module):
            ends.append((time.perf_counter(), time.process_time()))

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            window.step_start(batch_idx)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            ends.append((time.perf_counter(), time.process_time()))
            window.step_end(batch_idx)
            m = trainer.callback_metrics
            keys = ("perf/step_s", "perf/generation_s", "train/response_length", "train/reward/mean",
                    "loss/kl")
            per_step.append({k: float(m[k]) for k in keys if k in m} | {"update_forwards": len(update_forwards)})
            update_forwards.clear()

    trainer.callbacks.append(StepTimer())
    rss_start = _status()["VmRSS"] / 1024
    setup_peak = _maxrss_mib()
    reset = _reset_peak_rss()
    trainer.fit(module, datamodule=datamodule)
    return {"ends": ends, "per_step": per_step, "generate": gen.calls, "rss_start_mib": rss_start,
            "setup_peak_mib": setup_peak, "peak_reset": reset, "train_peak_mib": _maxrss_mib(),
            "threads": torch.get_num_threads(), "own_length_key": "train/response_length",
            "config": {"lr": cfg.method.optimizer.lr, "scheduler": None, "kl_coef": cfg.loss.kl_coef,
                       "clip": cfg.loss.surrogate.clip_low,
                       "aggregation": cfg.loss.aggregation}}


def child_trl(setting: dict[str, Any], steps: int, model_dir: str | None, workdir: str,
              window: StepWindow, shape: dict[str, Any]) -> dict[str, Any]:
    import torch
    from hydra.utils import instantiate
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    cfg = compose(setting, steps, model_dir, workdir, shape)
    method, data = cfg.method, cfg.data
    loss = cfg.loss
    # What TRL's GRPO can express: say so loudly if the lit-credit config moved away from it.
    assert loss.aggregation == "token-mean" and loss.kl_estimator == "k3" and loss.surrogate.clip_high is None
    assert method.ppo_epochs == 1 and method.num_minibatches == 1 and not method.dynamic_sampling
    assert cfg.credit.norm_by_std and cfg.method.optimizer._target_ == "torch.optim.AdamW"

    task, reward = instantiate(cfg.task), instantiate(cfg.reward)
    source = instantiate(cfg.model)
    source.prepare()  # a cache hit: prepare_models built it
    model, tokenizer = source.load()  # PolicySource.load: the loader lit-credit uses
    sampling = data.sampling
    generation_kwargs = None
    if setting["fixed"]:
        generation_kwargs = {"min_new_tokens": setting["max_new_tokens"],
                             "suppress_tokens": [tokenizer.pad_token_id]}

    def exact_match(prompts, completions, answer, **kwargs) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(reward({"answer": a}, [t]).score) for t, a in zip(texts, answer)]

    rows = shape["micro_rows"] or data.prompts_per_step * sampling.n  # rows per forward + backward
    args = GRPOConfig(
        output_dir=workdir, max_steps=steps, seed=cfg.seed, use_cpu=True, bf16=False, fp16=False,
        gradient_checkpointing=shape["activation_checkpointing"], report_to="none", logging_steps=1, save_strategy="no",
        eval_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        per_device_train_batch_size=rows, gradient_accumulation_steps=data.prompts_per_step * sampling.n // rows,
        num_generations=sampling.n, num_iterations=1, max_completion_length=sampling.max_new_tokens,
        temperature=sampling.temperature, top_p=sampling.top_p, top_k=0, generation_kwargs=generation_kwargs,
        use_vllm=False, learning_rate=method.optimizer.lr, weight_decay=method.optimizer.weight_decay,
        optim="adamw_torch", lr_scheduler_type="constant", max_grad_norm=method.max_grad_norm,
        beta=loss.kl_coef, epsilon=loss.surrogate.clip_low, loss_type="dapo", scale_rewards="group",
    )
    trainer = GRPOTrainer(model=model, reward_funcs=[exact_match], args=args,
                          train_dataset=task.dataset("train"), processing_class=tokenizer)
    gen = GenerateTimer(trainer.model, tokenizer.eos_token_id)
    ends: list[tuple[float, float]] = []  # (wall, process CPU) at the start and at every step end
    per_step: list[dict[str, float]] = []

    class StepTimer(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            ends.append((time.perf_counter(), time.process_time()))

        def on_step_begin(self, args, state, control, **kwargs):
            window.step_start(state.global_step)  # steps done so far: the index of this step

        def on_step_end(self, args, state, control, **kwargs):
            ends.append((time.perf_counter(), time.process_time()))
            window.step_end(state.global_step - 1)

        def on_log(self, args, state, control, logs=None, **kwargs):
            keys = ("step_time", "completions/mean_length", "reward", "kl")
            if logs and "step_time" in logs:
                per_step.append({k: float(logs[k]) for k in keys if k in logs})

    trainer.add_callback(StepTimer())
    rss_start = _status()["VmRSS"] / 1024
    setup_peak = _maxrss_mib()
    reset = _reset_peak_rss()
    trainer.train()
    return {"ends": ends, "per_step": per_step, "generate": gen.calls, "rss_start_mib": rss_start,
            "setup_peak_mib": setup_peak, "peak_reset": reset, "train_peak_mib": _maxrss_mib(),
            "threads": torch.get_num_threads(), "own_length_key": "completions/mean_length",
            "config": {"lr": args.learning_rate, "scheduler": args.lr_scheduler_type, "kl_coef": args.beta,
                       "clip": args.epsilon, "loss_type": args.loss_type, "optim": str(args.optim)}}


def run_child(framework: str, setting: dict[str, Any], steps: int, warmup: int, model_dir: str | None,
              out: Path, profile: Path | None, threads: int | None, shape: dict[str, Any]) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    if threads:
        import torch

        torch.set_num_threads(threads)
    fn = {"lit": child_lit, "trl": child_trl}[framework]
    digest = library_digest()
    profiler = None
    if profile is not None:
        import cProfile

        profiler = cProfile.Profile()
    with tempfile.TemporaryDirectory(prefix=f"grpo-step-{framework}-") as workdir:
        result = fn(setting, steps, model_dir, workdir, StepWindow(profiler, warmup, steps - 1), shape)
    if profiler is not None:
        profiler.dump_stats(profile)
    out.write_text(json.dumps({**result, "library_digest": digest}))


# ------------------------------------------------------------------------------------------------- the parent

def prepare_models(settings: list[dict[str, Any]], tmp: Path, shape: dict[str, Any]) -> dict[str, str | None]:
    """Build (once) the model (the embedded policy of the default job, or SmolLM2's conversion); for each fixedN
    setting, a copy of its directory whose generation config forces exactly N new tokens and never samples the
    pad token."""
    from hydra.utils import instantiate

    cfg = compose(settings[0], 1, None, str(tmp / "compose"), shape)
    path = Path(instantiate(cfg.model).prepare())  # the embedded policy: tokenizer + SFT warm start on first use
    dirs: dict[str, str | None] = {}
    for s in settings:
        if not s["fixed"]:
            dirs[s["name"]] = None  # model.path=null: the model config's own policy, as the job loads it
            continue
        target = tmp / f"model-{s['name']}"
        shutil.copytree(path, target)
        gen_cfg = json.loads((target / "generation_config.json").read_text())
        pad = json.loads((target / "config.json").read_text())["pad_token_id"]
        gen_cfg.update(min_new_tokens=s["max_new_tokens"], suppress_tokens=[pad])
        (target / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2))
        dirs[s["name"]] = str(target)
    dirs["_model"] = str(path)
    return dirs


def _intervals(ends: list[list[float]], column: int) -> list[float]:
    return [b[column] - a[column] for a, b in itertools.pairwise(ends)]


def summarise(runs: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Pool the measured steps of every repeat of one (setting, framework)."""
    steps, cpu, tokens, gen_s, gen_cpu, decode, own_len, rows = [], [], [], [], [], [], [], []
    for r in runs:
        intervals = _intervals(r["ends"], 0)
        calls = r["generate"]
        if len(calls) != len(intervals):
            raise RuntimeError(f"{len(calls)} generate calls in {len(intervals)} steps: expected one each")
        steps += intervals[warmup:]
        cpu += _intervals(r["ends"], 1)[warmup:]
        tokens += [c["tokens"] for c in calls[warmup:]]
        gen_s += [c["seconds"] for c in calls[warmup:]]
        gen_cpu += [c["cpu_s"] for c in calls[warmup:]]
        decode += [c["decode_steps"] for c in calls[warmup:]]
        rows += [c["rows"] for c in calls[warmup:]]
        own_len += [p[r["own_length_key"]] for p in r["per_step"][warmup:] if r["own_length_key"] in p]
    total_s, total_tok, total_rows = sum(steps), sum(tokens), sum(rows)
    return {
        "steps_measured": len(steps),
        "s_per_step_median": statistics.median(steps), "s_per_step_mean": statistics.fmean(steps),
        "s_per_step_stdev": statistics.stdev(steps) if len(steps) > 1 else 0.0,
        "s_per_step_min": min(steps),
        "per_repeat_median_s": [statistics.median(_intervals(r["ends"], 0)[warmup:]) for r in runs],
        "cpu_s_per_step_median": statistics.median(cpu), "cpu_s_per_step_mean": statistics.fmean(cpu),
        "generate_s_median": statistics.median(gen_s), "generate_cpu_s_median": statistics.median(gen_cpu),
        "non_generate_s_median": statistics.median(a - b for a, b in zip(steps, gen_s)),
        "gen_tokens_per_step": total_tok / len(steps), "completion_len_mean": total_tok / total_rows,
        "completion_len_own_metric": statistics.fmean(own_len) if own_len else None,
        "decode_steps_mean": statistics.fmean(decode),
        "tokens_per_s": total_tok / total_s, "ms_per_token": 1000 * total_s / total_tok,
        "gen_tokens_per_s_generate_only": total_tok / sum(gen_s),
        "peak_rss_mib": max(max(r["setup_peak_mib"], r["train_peak_mib"]) for r in runs),
        "rss_at_fit_start_mib": statistics.median(r["rss_start_mib"] for r in runs),
        "train_peak_rss_mib": statistics.median(r["train_peak_mib"] for r in runs)
        if all(r["peak_reset"] for r in runs) else None,
        "torch_threads": runs[0]["threads"], "config": runs[0]["config"],
        "update_forwards_per_step": statistics.median(
            p["update_forwards"] for r in runs for p in r["per_step"][warmup:]) if "update_forwards" in
        runs[0]["per_step"][0] else None,
    }


def table(results: dict[str, Any], settings: list[dict[str, Any]]) -> str:
    head = ("| setting | framework | s/step median | per-run medians | s/step min | ratio TRL/lit "
            "| CPU s/step | CPU ratio | gen tokens/step | completion len | tokens/s | ms/token | generate s "
            "| rest s | peak RSS MiB | RSS ratio | RSS at fit start | train peak RSS |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for s in settings:
        res = results[s["name"]]
        for fw in FRAMEWORKS:
            r = res[fw]

            def ratio(key: str, fw: str = fw, res: dict = res) -> str:
                return "1 (ref)" if fw == "lit" else f"{res['trl'][key] / res['lit'][key]:.2f}"

            runs = " / ".join(f"{x:.2f}" for x in r["per_repeat_median_s"])
            train_peak = "n/a" if r["train_peak_rss_mib"] is None else f"{r['train_peak_rss_mib']:.0f}"
            lines.append(
                f"| {s['name']} | {NAMES[fw]} | {r['s_per_step_median']:.3f} | {runs} "
                f"| {r['s_per_step_min']:.3f} "
                f"| {ratio('s_per_step_median')} | {r['cpu_s_per_step_median']:.3f} "
                f"| {ratio('cpu_s_per_step_median')} | {r['gen_tokens_per_step']:.0f} "
                f"| {r['completion_len_mean']:.2f} | {r['tokens_per_s']:.0f} | {r['ms_per_token']:.2f} "
                f"| {r['generate_s_median']:.3f} | {r['non_generate_s_median']:.3f} "
                f"| {r['peak_rss_mib']:.0f} "
                f"| {ratio('peak_rss_mib')} | {r['rss_at_fit_start_mib']:.0f} | {train_peak} |")
    return "\n".join(lines)


def parent(ns: argparse.Namespace) -> None:
    shape = resolve_shape(ns)
    settings = [parse_setting(n) for n in (ns.settings or MODELS[ns.model]["settings"]).split(",")]
    frameworks = list(FRAMEWORKS) if ns.profile is None else [ns.profile]
    RESULTS.mkdir(parents=True, exist_ok=True)
    total = ns.warmup + ns.steps
    raw: dict[str, dict[str, list]] = {s["name"]: {fw: [] for fw in frameworks} for s in settings}
    load = [os.getloadavg()]
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="grpo-step-") as tmp_str:
        tmp = Path(tmp_str)
        dirs = prepare_models(settings, tmp, shape)
        for s in settings:
            for rep in range(ns.repeats if ns.profile is None else 1):
                order = frameworks if rep % 2 == 0 else frameworks[::-1]  # A B, B A: neither always first
                for fw in order:
                    out = tmp / f"{s['name']}-{fw}-{rep}.json"
                    cmd = [sys.executable, "-m", "benchmarks.grpo_step", "--child", fw,
                           "--setting", s["name"], "--total-steps", str(total), "--warmup", str(ns.warmup),
                           "--out", str(out), "--model", shape["model"], "--prompts", str(shape["prompts"]),
                           "--group", str(shape["group"])]
                    if shape["micro_rows"]:
                        cmd += ["--micro-rows", str(shape["micro_rows"])]
                    if shape["activation_checkpointing"]:
                        cmd += ["--activation-checkpointing"]
                    if ns.threads:
                        cmd += ["--threads", str(ns.threads)]
                    if dirs[s["name"]] is not None:
                        cmd += ["--model-dir", dirs[s["name"]]]
                    if ns.profile is not None:
                        cmd += ["--profile-out", str(RESULTS / f"grpo_step_{fw}_{s['name']}.prof")]
                    print(f"[{time.time() - t0:6.0f}s] {s['name']} {NAMES[fw]} repeat {rep + 1}", flush=True)
                    log = tmp / f"{s['name']}-{fw}-{rep}.log"
                    with log.open("w") as fh:
                        proc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
                    if proc.returncode != 0:
                        sys.stdout.write(log.read_text()[-6000:])
                        raise SystemExit(f"{NAMES[fw]} child failed ({proc.returncode}): {' '.join(cmd)}")
                    raw[s["name"]][fw].append(json.loads(out.read_text()))
                    load.append(os.getloadavg())
    if ns.profile is not None:
        import pstats

        for s in settings:
            path = RESULTS / f"grpo_step_{ns.profile}_{s['name']}.prof"
            print(f"\n## cProfile, {NAMES[ns.profile]}, {s['name']}: the {ns.steps} steps after "
                  f"{ns.warmup} warm-up ({path})")
            pstats.Stats(str(path)).sort_stats("tottime").print_stats(ns.profile_top)
            pstats.Stats(str(path)).sort_stats("cumulative").print_stats(ns.profile_top)
        return

    results = {s["name"]: {fw: summarise(raw[s["name"]][fw], ns.warmup) for fw in frameworks}
               for s in settings}
    digests = sorted({r["library_digest"] for per in raw.values() for runs in per.values() for r in runs})
    report = {
        "benchmark": f"one GRPO step, lit-credit vs TRL GRPOTrainer, model {shape['model']}, arith task",
        "command": "benchmarks/.venv-trl/bin/python -m benchmarks.grpo_step " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "wall_s": round(time.time() - t0, 1),
        "protocol": {"warmup_steps": ns.warmup, "measured_steps_per_run": ns.steps, "repeats": ns.repeats,
                     "order": "interleaved per setting: lit, trl, then trl, lit, ...; each run its own "
                              "process",
                     "model": shape["model"], "prompts_per_step": shape["prompts"], "group_size": shape["group"],
                     "completions_per_step": shape["prompts"] * shape["group"],
                     "update_micro_batch_rows": shape["micro_rows"] or shape["prompts"] * shape["group"],
                     "activation_checkpointing": shape["activation_checkpointing"],
                     "step_time": "wall time between consecutive step ends (Lightning on_train_batch_end / "
                                  "HF on_step_end); CPU s/step: process CPU time (all threads) over the same "
                                  "interval",
                     "torch_threads": ns.threads or "torch default",
                     "peak_rss": "ru_maxrss of the child (whole process); train peak: after resetting the "
                                 "peak (/proc/self/clear_refs) just before fit/train"},
        "settings": settings, "load_average_1_5_15": load,
        "model_dir": dirs["_model"].replace(str(ROOT) + "/", ""),
        "library_digests": digests,  # more than one: lit-credit's sources changed during the run
        "results": results, "differences": DIFFERENCES,
        "raw": raw,
    }
    out = write_results(ns.json or RESULTS / ("grpo_step.json" if ns.model == "embedded"
                                              else f"grpo_step_{ns.model}.json"), report)
    m = json.loads(out.read_text())["machine"]
    threads = results[settings[0]["name"]]["lit"]["torch_threads"]
    print(f"\n## One GRPO step: lit-credit vs TRL {m['versions']['trl']} ({m['cpu_model']}, {m['cores']} "
          f"CPUs, torch {m['versions']['torch']}, {threads} threads)\n")
    print(f"{ns.model}: {shape['prompts']} prompts x {shape['group']} completions per step, {ns.warmup} warm-up + {ns.steps} measured steps per run, "
          f"{ns.repeats} runs per framework interleaved; load average {load[0][0]:.2f} -> "
          f"{load[-1][0]:.2f}\n")
    print(table(results, settings))
    if len(digests) > 1:
        print(f"\nWARNING: lit-credit's sources changed during the run ({len(digests)} versions): rerun.")
    print("\n### Remaining differences between the two set-ups\n")
    print("\n".join(f"- {d}" for d in DIFFERENCES))
    print(f"\nwritten: {out}")


def resolve_shape(ns: argparse.Namespace) -> dict[str, Any]:
    """The model and the prompts x group of a step: the flags, else the model's defaults."""
    defaults = MODELS[ns.model]
    completions = (ns.prompts or defaults["prompts"]) * (ns.group or defaults["group"])
    if ns.micro_rows is not None and not (0 < ns.micro_rows <= completions and completions % ns.micro_rows == 0):
        raise SystemExit(f"--micro-rows {ns.micro_rows}: must divide the {completions} completions of a step")
    return {"model": ns.model, "prompts": ns.prompts or defaults["prompts"], "group": ns.group or defaults["group"],
            "micro_rows": ns.micro_rows, "activation_checkpointing": ns.activation_checkpointing}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="embedded",
                   help="embedded: the default job's tiny policy; smollm2: SmolLM2-135M-Instruct (make smollm2)")
    p.add_argument("--settings", help="comma list of eosN / fixedN (default: eos8,fixed64; smollm2: fixed64)")
    p.add_argument("--prompts", type=int, help="prompts per step (default: 16; smollm2: 4)")
    p.add_argument("--group", type=int, help="completions per prompt (default: 8; smollm2: 4)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10, help="measured steps per run")
    p.add_argument("--repeats", type=int, default=2, help="runs per framework and setting, interleaved")
    p.add_argument("--profile", choices=FRAMEWORKS, help="one run of this framework instead, cProfiled over "
                   "the measured steps (.prof in benchmarks/results/, git-ignored); prints the top functions")
    p.add_argument("--profile-top", type=int, default=30)
    p.add_argument("--json", type=Path, help="where to write the results (default: benchmarks/results/"
                   "grpo_step.json; with --model smollm2, grpo_step_smollm2.json)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads in both children (default: torch's)")
    p.add_argument("--activation-checkpointing", action="store_true", help="both sides recompute each decoder "
                   "layer in backward (lit-credit: model.activation_checkpointing=true; TRL: gradient_checkpointing)")
    p.add_argument("--micro-rows", type=int, help="rows per forward + backward of the update, gradients accumulated "
                   "over the step's micro-batches (lit-credit: method.logprob_token_budget = K x the step's width; "
                   "TRL: per_device_train_batch_size = K, gradient_accumulation_steps = completions / K); "
                   "default: every completion in one")
    # internal: one child run
    p.add_argument("--child", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    p.add_argument("--setting", help=argparse.SUPPRESS)
    p.add_argument("--total-steps", type=int, help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--profile-out", type=Path, help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    if ns.child:
        run_child(ns.child, parse_setting(ns.setting), ns.total_steps, ns.warmup, ns.model_dir, ns.out,
                  ns.profile_out, ns.threads, resolve_shape(ns))
    else:
        parent(ns)


if __name__ == "__main__":
    main()
