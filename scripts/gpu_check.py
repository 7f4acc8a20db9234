"""Rollout and GRPO-step throughput on one GPU, with and without the chunked LM head and FSDP2.

The policy is a randomly initialised Qwen2.5-0.5B (Qwen2ForCausalLM built from its config, written here: no
download); throughput needs no trained weights, so generation lengths are fixed: the engine is told eos and pad ids outside the
vocabulary, which are never sampled.
Four training cases, {full head, chunked head} x {one device, FSDP2 on a world of one}, and one rollout per
FSDP setting (the HF engine samples from the model's own logits, so the chunked head does not enter it):

- rollout: ``lit_credit.rollout.engine.HFEngine.generate`` (``model.generate`` with KV cache, behaviour
  log-probs from its raw logits), new tokens / wall seconds;
- train: one GRPO-style step: ``token_logprobs`` (``head_chunk`` None or N) of prompt + completion, the
  project's ``PolicyLoss(ClippedSurrogate(0.2), "token-mean")`` against the engine's behaviour log-probs with
  random group-normalised advantages, backward per micro-batch of ``--micro-rows`` rows (gradient
  accumulation), gradient clipping and an AdamW step; batch tokens / mean step seconds over ``--steps`` steps
  after one warm-up;
- MFU (:func:`mfu`); peak memory per phase (``torch.cuda.max_memory_allocated``, reset before each phase; on
  CPU the process's peak RSS, never reset); the chunked head's log-probs against the full head's on one batch.

Imports torch, transformers and, of lit_credit, only the log-probs with the chunked head, the HF engine and
the losses (with what they import: lit_credit.types, lit_credit.interfaces): lit_credit.models and
lit_credit.rollout are registered as bare packages first (:func:`import_project`), since their ``__init__``
pulls in lit_credit.tasks (datasets, math_verify), which the GPU machine lacks; hydra, omegaconf, lightning and vllm are never imported. ``--cpu``: the same code on
CPU with a tiny config of the architecture, float32, FSDP2 over gloo. Exits non-zero unless every figure is
finite and positive (and, in float32, the chunked head matches the full head to 1e-4). Writes
``gpu_check.json`` to ``--out`` (default ``$OUT`` if set, else ``outputs/gpu_check/<timestamp>``).
"""
from __future__ import annotations

import argparse
import gc
import importlib.machinery
import importlib.util
import json
import math
import os
import platform
import resource
import sys
import tempfile
import time
import traceback
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
START = time.perf_counter()

# Qwen/Qwen2.5-0.5B's config.json, the fields that shape the compute; eos <|im_end|>, pad <|endoftext|>.
QWEN25_05B = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
              "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
              "tie_word_embeddings": True, "rope_theta": 1e6, "max_position_embeddings": 32768,
              "rms_norm_eps": 1e-6, "hidden_act": "silu", "use_sliding_window": False,
              "bos_token_id": 151643, "eos_token_id": 151645, "pad_token_id": 151643}
# The same architecture, tiny, for --cpu: GQA (4 query heads on 2 KV heads), tied embeddings, the same rope.
TINY = {**QWEN25_05B, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 256, "vocab_size": 1024, "max_position_embeddings": 1024,
        "bos_token_id": 1022, "eos_token_id": 1023, "pad_token_id": 1022}
# Sizes per device; group: rollouts per prompt (a GRPO group).
SIZES = ("rollouts", "group", "prompt_len", "new_tokens", "steps", "micro_rows", "head_chunk")
DEFAULTS = {"gpu": {"rollouts": 64, "group": 8, "prompt_len": 256, "new_tokens": 256, "steps": 3,
                    "micro_rows": 32, "head_chunk": 4096},
            "cpu": {"rollouts": 8, "group": 4, "prompt_len": 16, "new_tokens": 16, "steps": 2,
                    "micro_rows": 4, "head_chunk": 48}}
H200_BF16_FLOPS = 989e12  # dense bf16 tensor-core peak of an H200 (SXM), no sparsity
FP32_TOLERANCE = 1e-4  # chunked vs full head, max |log-prob difference| in float32
MODES, HEADS = ("none", "fsdp2"), ("full", "chunked")  # FSDP settings; LM heads (the model's own, chunked)
CASES = tuple(f"{mode}/{head}" for mode in MODES for head in HEADS)
POSITIVE = ("tokens_per_s", "seconds", "peak_mem_gib", "mfu")  # the figures that must be finite and > 0


def phase(message: str) -> None:
    print(f"[{time.perf_counter() - START:7.1f}s] {message}", flush=True)


def import_project():
    """``(token_logprobs, HFEngine, PolicyLoss, ClippedSurrogate, SamplingParams)``, lit_credit from source.

    lit_credit.models and lit_credit.rollout are registered as bare packages of their directories (their
    ``__init__`` not run: it imports lit_credit.tasks, hence datasets and math_verify), so importing
    ``lit_credit.models.logprobs`` runs logprobs.py and chunked_head.py only, and the engine module needs no
    more than lit_credit.interfaces and lit_credit.types."""
    import lit_credit

    for sub in ("models", "rollout"):
        name = f"lit_credit.{sub}"
        if name not in sys.modules:
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = [str(ROOT / "lit_credit" / sub)]
            sys.modules[name] = module = importlib.util.module_from_spec(spec)
            setattr(lit_credit, sub, module)
    from lit_credit.losses import ClippedSurrogate, PolicyLoss
    from lit_credit.models.logprobs import token_logprobs
    from lit_credit.rollout.engine import HFEngine
    from lit_credit.types import SamplingParams

    return token_logprobs, HFEngine, PolicyLoss, ClippedSurrogate, SamplingParams


class IdTokenizer:
    """What HFEngine needs of a tokenizer: the eos and pad ids, and ``decode`` (the text is unused here)."""

    def __init__(self, eos_token_id: int, pad_token_id: int) -> None:
        self.eos_token_id, self.pad_token_id = eos_token_id, pad_token_id

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return ""


def qwen2(config: dict):
    from transformers import Qwen2Config

    cfg = Qwen2Config(**config, attn_implementation="sdpa")
    theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", getattr(cfg, "rope_theta", None))
    if theta != config["rope_theta"]:
        raise RuntimeError(f"Qwen2Config did not take rope_theta={config['rope_theta']} (read back "
                           f"{theta!r}): this transformers names it otherwise; fix qwen2() in "
                           "scripts/gpu_check.py")
    return cfg


def build_model(config: dict, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """A Qwen2ForCausalLM of ``config``, randomly initialised from seed 0 (every case starts from the same
    weights), in eval mode (dropout off, as PolicyModule.on_train_start)."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(qwen2(config))
    model.to(dtype).eval()
    if model.lm_head.weight is not model.model.embed_tokens.weight:
        raise RuntimeError("tie_word_embeddings=True but lm_head and embed_tokens do not share their weight")
    return model


def shard(model: torch.nn.Module, device: torch.device) -> None:
    """FSDP2 as PolicyModule.configure_model: ``fully_shard`` each decoder layer, then the root, on a mesh of
    one device. The chunked head runs inside the root's forward, so its (tied) weight is unsharded there."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    mesh = init_device_mesh(device.type, (1,))
    blocks = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if not all(isinstance(p, DTensor) for p in model.parameters()):
        raise RuntimeError("fully_shard left some parameters unsharded (not DTensors)")


def mfu(params: int, tokens_per_s: float, peak_flops: float) -> float:
    """Model FLOPs utilisation ``6 N tokens_per_s / peak_flops``: ``2 N`` forward and ``4 N`` backward FLOPs
    per token for ``N`` parameters (the tied embedding counted once, as the LM-head matmul; its lookup is
    free). Attention scores (``~12 L H T`` per token) are left out, so it understates the work slightly."""
    return 6 * params * tokens_per_s / peak_flops


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def reset_peak(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_mem_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def rollout(engine, sampling, prompts: torch.Tensor, device: torch.device, amp) -> tuple[dict, dict]:
    """One timed ``engine.generate`` of ``sampling.n`` rollouts per prompt after a short warm-up: (its
    figures, the batch to train on: input ids, behaviour log-probs and response mask [B, P + L], random
    group-normalised advantages)."""
    with amp:
        engine.generate(prompts[:2].tolist(), replace(sampling, n=2, max_new_tokens=4))  # warm-up
    reset_peak(device)
    sync(device)
    start = time.perf_counter()
    with amp:
        groups = engine.generate(prompts.tolist(), sampling)
    sync(device)
    seconds = time.perf_counter() - start
    engine.sleep()  # the rollout phase is over: an FSDP2 policy gathered for generation is resharded
    flat = [c for group in groups for c in group]
    new = torch.tensor([c.token_ids for c in flat])
    want = (len(flat), sampling.max_new_tokens)
    if tuple(new.shape) != want:
        raise RuntimeError(f"rollout: {tuple(new.shape)} new tokens, not {want}: generation stopped early "
                           "although the engine's eos and pad ids are outside the vocabulary")
    prompt_len = prompts.shape[1]
    ids = torch.cat([prompts.repeat_interleave(sampling.n, 0), new], 1)
    behaviour = torch.nn.functional.pad(torch.tensor([c.logprobs for c in flat]), (prompt_len, 0))
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[:, prompt_len:] = True
    scores = torch.randn(len(groups), sampling.n, generator=torch.Generator().manual_seed(1))
    advantages = (scores - scores.mean(1, keepdim=True)) / (scores.std(1, keepdim=True) + 1e-6)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "behaviour": behaviour, "mask": mask,
             "advantages": advantages.reshape(-1, 1).expand_as(behaviour).contiguous()}
    figures = {"tokens": new.numel(), "seconds": seconds, "tokens_per_s": new.numel() / seconds,
               "peak_mem_gib": peak_mem_gib(device)}
    return figures, {k: v.to(device) for k, v in batch.items()}


@torch.no_grad()
def head_agreement(token_logprobs, model, batch: dict, rows: int, head_chunk: int, amp) -> dict:
    """On the first micro-batch: max |log-prob| and |entropy| differences, chunked head vs the model's own
    logits, and the mean |trainer - engine| log-prob over the response tokens (the engine / trainer gap)."""
    ids, attn, mask = batch["input_ids"][:rows], batch["attention_mask"][:rows], batch["mask"][:rows]
    with amp:
        full, full_entropy = token_logprobs(model, ids, attn, entropy=True, head_chunk=None)
        chunk, chunk_entropy = token_logprobs(model, ids, attn, entropy=True, head_chunk=head_chunk)
    return {"max_abs_logp_diff": (full - chunk).abs().max().item(),
            "max_abs_entropy_diff": (full_entropy - chunk_entropy).abs().max().item(),
            "engine_vs_trainer_mean_abs_logp": (full - batch["behaviour"][:rows])[mask].abs().mean().item()}


def train_step(token_logprobs, loss_fn, model, opt, batch: dict, rows: int, head_chunk: int | None,
               amp) -> None:
    """One GRPO update: per micro-batch of ``rows`` rows the token-mean clipped loss, weighted by its share
    of the batch's response tokens (so the accumulated gradient is the full batch's token mean), backward;
    then gradient clipping at 1 and the optimiser step."""
    ids, attn, mask = batch["input_ids"], batch["attention_mask"], batch["mask"]
    total = mask.sum()
    for idx in torch.arange(len(ids), device=ids.device).split(rows):
        with amp:
            logp, _ = token_logprobs(model, ids[idx], attn[idx], entropy=True, head_chunk=head_chunk)
            loss, _ = loss_fn(logp, batch["behaviour"][idx], batch["advantages"][idx], mask[idx])
        (loss * mask[idx].sum() / total).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="store_true", help="dry run on CPU: tiny config, float32, FSDP2 over gloo")
    p.add_argument("--out", help="output directory (default: $OUT, else outputs/gpu_check/<timestamp>)")
    p.add_argument("--steps", type=int, help="timed steps per case, after one warm-up (GPU 3, CPU 2)")
    p.add_argument("--rollouts", type=int, help="rollouts (GPU 64, CPU 8), in groups of --group per prompt")
    p.add_argument("--group", type=int, help="rollouts per prompt, a GRPO group (GPU 8, CPU 4)")
    p.add_argument("--prompt-len", type=int, help="prompt tokens per rollout (GPU 256, CPU 16)")
    p.add_argument("--new-tokens", type=int, help="generated tokens per rollout, fixed (GPU 256, CPU 16)")
    p.add_argument("--micro-rows", type=int, help="rows per backward pass (micro-batch) (GPU 32, CPU 4)")
    p.add_argument("--head-chunk", type=int, help="tokens per chunk of the chunked head (GPU 4096, CPU 48)")
    p.add_argument("--peak-flops", type=float, default=H200_BF16_FLOPS,
                   help=f"peak FLOP/s for MFU (default {H200_BF16_FLOPS:.3g}: H200 dense bf16)")
    p.add_argument("--dtype", choices=["bfloat16", "float32"],
                   help="weights, and autocast when bfloat16 (GPU bfloat16, CPU float32)")
    args = p.parse_args(argv)
    for key, value in DEFAULTS["cpu" if args.cpu else "gpu"].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.dtype = args.dtype or ("float32" if args.cpu else "bfloat16")
    for key in SIZES:
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} {getattr(args, key)} must be >= 1")
    if args.peak_flops <= 0:
        p.error(f"--peak-flops {args.peak_flops} must be > 0 (FLOP/s, e.g. 989e12 for an H200 in bf16)")
    if args.rollouts % args.group:
        p.error(f"--rollouts {args.rollouts} must be a multiple of --group {args.group} (rollouts per prompt)")
    if args.rollouts % args.micro_rows:
        p.error(f"--micro-rows {args.micro_rows} must divide --rollouts {args.rollouts} (equal "
                "micro-batches; fix: change either)")
    if not args.cpu and not torch.cuda.is_available():
        p.error("no CUDA device: run it on the GPU machine, or pass --cpu for the dry run on CPU")
    return args


def failures(report: dict, strict: bool) -> list[str]:
    """Every figure that is not finite and positive (a difference: not finite) and, with ``strict``, a
    chunked head off the full head's log-probs by more than :data:`FP32_TOLERANCE`."""
    bad = [f"errors[{case}]: {message}" for case, message in report.get("errors", {}).items()]
    bad += [f"{section}[{case}] missing" for section, cases in (("rollout", MODES), ("train", CASES))
            for case in cases if case not in report[section]]
    for section in ("rollout", "train"):
        for case, figures in report[section].items():
            bad += [f"{section}[{case}].{k} = {v}" for k, v in figures.items()
                    if k in POSITIVE and not (math.isfinite(v) and v > 0)]
    for mode, diffs in report["agreement"].items():
        bad += [f"agreement[{mode}].{k} = {v}" for k, v in diffs.items() if not math.isfinite(v)]
        if strict and diffs["max_abs_logp_diff"] > FP32_TOLERANCE:
            bad.append(f"agreement[{mode}].max_abs_logp_diff = {diffs['max_abs_logp_diff']:.3g} "
                       f"> {FP32_TOLERANCE}")
    return bad


def header(args: argparse.Namespace, config: dict, device: torch.device) -> dict:
    """The report's description of the run: device, versions, model, sizes, what each figure is."""
    import transformers
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        params = sum(p.numel() for p in Qwen2ForCausalLM(qwen2(config)).parameters())
    seq = args.prompt_len + args.new_tokens
    cpu = f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)"
    return {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else cpu,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "dtype": args.dtype,
        "precision": ("bf16 weights under torch.autocast(bfloat16), as model.dtype=bfloat16 with trainer "
                      "precision bf16-mixed" if args.dtype == "bfloat16"
                      else f"{args.dtype} weights, no autocast"),
        "model": {"architecture": "Qwen2ForCausalLM", "init": "random (seed 0)", "params": params,
                  "config": config},
        "settings": {**{k: getattr(args, k) for k in SIZES}, "peak_flops": args.peak_flops,
                     "warmup_steps": 1},
        "rollout_engine": "lit_credit.rollout.engine.HFEngine (model.generate, KV cache, eos/pad ids outside the vocabulary)",
        "train_step": "token_logprobs + PolicyLoss(ClippedSurrogate(0.2), token-mean) vs the engine's "
                      "log-probs, random group-normalised advantages, backward per micro-batch, "
                      "clip_grad_norm_(1.0), AdamW(lr=1e-6)",
        "peak_mem_kind": ("torch.cuda.max_memory_allocated, reset before each phase" if device.type == "cuda"
                          else "process peak RSS (ru_maxrss), never reset"),
        "micro_batch_tokens": args.micro_rows * seq,
        # the fp32 [B, T, V] logits of one micro-batch (the model's bf16 logits are half as many bytes again)
        "full_head_logits_gib": args.micro_rows * (seq - 1) * config["vocab_size"] * 4 / 2**30,
        "rollout": {}, "train": {}, "agreement": {},
    }


def timed_steps(token_logprobs, loss_fn, model, batch: dict, head_chunk: int | None, args, device, amp,
                params: int) -> dict:
    """One warm-up and ``args.steps`` timed :func:`train_step` s with a fresh AdamW(lr=1e-6): batch tokens,
    mean seconds per step, tokens/s, MFU and the peak memory since the warm-up."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    step = (token_logprobs, loss_fn, model, opt, batch, args.micro_rows, head_chunk, amp)
    reset_peak(device)
    train_step(*step)
    phase(f"  {args.steps} timed steps")
    sync(device)
    start = time.perf_counter()
    for _ in range(args.steps):
        train_step(*step)
    sync(device)
    seconds = (time.perf_counter() - start) / args.steps
    tokens = int(batch["attention_mask"].sum())
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "mfu": mfu(params, tokens / seconds, args.peak_flops), "peak_mem_gib": peak_mem_gib(device)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out or os.environ.get("OUT") or ROOT / "outputs" / "gpu_check" / stamp)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cpu" if args.cpu else "cuda")
    dtype = getattr(torch, args.dtype)
    amp = torch.autocast(device.type, dtype=dtype) if dtype != torch.float32 else nullcontext()
    config = TINY if args.cpu else QWEN25_05B
    phase(f"torch {torch.__version__}, {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}")
    token_logprobs, HFEngine, PolicyLoss, ClippedSurrogate, SamplingParams = import_project()
    report = header(args, config, device)
    params = report["model"]["params"]
    phase(f"Qwen2ForCausalLM {params / 1e6:.1f}M params ({'tiny' if args.cpu else 'Qwen2.5-0.5B'} config), "
          f"{args.rollouts} rollouts x ({args.prompt_len} prompt + {args.new_tokens} new) tokens, "
          f"micro-batch {report['micro_batch_tokens']} tokens (full-head fp32 logits "
          f"{report['full_head_logits_gib']:.2f} GiB), {args.dtype}")
    loss_fn = PolicyLoss(ClippedSurrogate(0.2), "token-mean")
    sampling = SamplingParams(n=args.group, temperature=1.0, max_new_tokens=args.new_tokens)
    vocab = torch.arange(config["vocab_size"])
    allowed = vocab[(vocab != config["eos_token_id"]) & (vocab != config["pad_token_id"])]
    prompts = allowed[torch.randint(len(allowed), (args.rollouts // args.group, args.prompt_len),
                                    generator=torch.Generator().manual_seed(0))]
    store = tempfile.mkdtemp(prefix="gpu_check_")

    def save() -> None:  # after every case: a crash or a time-out later still leaves the figures so far
        report["wall_s"] = time.perf_counter() - START
        # written whole, then renamed (lit_credit.checkpoint.atomic_write does this too, but imports lightning)
        tmp = out / "gpu_check.json.tmp"
        tmp.write_text(json.dumps(report, indent=2))
        os.replace(tmp, out / "gpu_check.json")

    for mode in MODES:
        if mode == "fsdp2":
            import torch.distributed as dist

            dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1,
                                    store=dist.FileStore(os.path.join(store, "store"), 1))
        batch = None
        for head in HEADS:
            case = f"{mode}/{head}"
            model = engine = None
            try:
                model = build_model(config, device, dtype)
                if mode == "fsdp2":
                    shard(model, device)
                if batch is None:  # the setting's rollout, on the fresh model
                    phase(f"{mode}: rollout")
                    engine = HFEngine(batch_size=args.rollouts)
                    engine.bind(model, IdTokenizer(config["vocab_size"], config["vocab_size"]))  # never sampled: fixed lengths
                    report["rollout"][mode], batch = rollout(engine, sampling, prompts, device, amp)
                    report["agreement"][mode] = head_agreement(token_logprobs, model, batch, args.micro_rows,
                                                               args.head_chunk, amp)
                phase(f"{case}: warm-up step")
                report["train"][case] = timed_steps(token_logprobs, loss_fn, model, batch,
                                                    args.head_chunk if head == "chunked" else None, args,
                                                    device, amp, params)
            except Exception as error:  # recorded; the other cases still run
                traceback.print_exc()
                report.setdefault("errors", {})[case] = f"{type(error).__name__}: {error}"[:2000]
                if batch is None:
                    break  # no rollout, so nothing to train on in this setting
            finally:
                model = engine = None  # free the case's memory before the next one
                reset_peak(device)
                save()
        if mode == "fsdp2":
            dist.destroy_process_group()
    save()
    print_report(report)
    print(f"wrote {out / 'gpu_check.json'}")
    bad = failures(report, strict=args.dtype == "float32")
    for line in bad:
        print(f"FAILED: {line}", file=sys.stderr)
    return 1 if bad else 0


def print_report(report: dict) -> None:
    mem = "peak GiB" if report["peak_mem_kind"].startswith("torch.cuda") else "peak RSS GiB"
    print(f"\n{report['device']}, {report['dtype']}, {report['model']['params'] / 1e6:.1f}M params")
    for mode, r in report["rollout"].items():
        print(f"rollout {mode:5s}  {r['tokens_per_s']:10.0f} tokens/s  {r['seconds']:7.2f} s  {mem} "
              f"{r['peak_mem_gib']:6.2f}")
    for mode, a in report["agreement"].items():
        print(f"{mode}: chunked vs full head: max |dlogp| {a['max_abs_logp_diff']:.3g}, max |dH| "
              f"{a['max_abs_entropy_diff']:.3g}; engine vs trainer: mean |dlogp| "
              f"{a['engine_vs_trainer_mean_abs_logp']:.3g}")
    for case, t in report["train"].items():
        print(f"train {case:13s}  {t['tokens_per_s']:10.0f} tokens/s  {t['seconds']:7.3f} s/step  MFU "
              f"{100 * t['mfu']:#6.3g} %  {mem} {t['peak_mem_gib']:6.2f}")
    print(f"micro-batch {report['micro_batch_tokens']} tokens; the full head's fp32 [B, T, V] logits of one: "
          f"{report['full_head_logits_gib']:.2f} GiB; wall {report['wall_s']:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
