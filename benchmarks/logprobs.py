"""Padded vs padding-free (token-budget micro-batch) log-probs on long multi-turn rollouts, and the chunked
LM head at real vocabularies.

One forward + backward of ``token_logprobs`` (the trainer's hot path) on a batch whose rows mix many short
rollouts with a few long multi-turn ones, right-padded to the longest: ``token_budget=None`` (one padded
pass, what lit-credit did before), ``token_budget=B`` (rows sorted by length, micro-batches cut to their
longest row) and ``token_budget=B`` with the chunked LM head (``head_chunk=C``: no [B, T, V] logits). Each
setting runs in its own subprocess so its peak RSS is its own.

    .venv/bin/python -m benchmarks.logprobs [--rows 32] [--max-len 1024] [--budget 8192] [--head-chunk 1024]
    .venv/bin/python -m benchmarks.logprobs --vocab 49152 --hidden 576 --layers 2 --out \
        benchmarks/results/logprobs_v49152.json     # SmolLM2's vocabulary and width
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from benchmarks.machine import in_subprocess, write_results
from lit_credit.models.logprobs import token_logprobs


def lengths(rows: int, max_len: int, seed: int = 0) -> torch.Tensor:
    """Three in four rollouts are short single-turn ones (max_len / 16 .. / 8 tokens); one in four is a
    multi-turn one (max_len / 4 .. max_len): the shape of TCPO and tool-calling batches."""
    g = torch.Generator().manual_seed(seed)
    short = torch.randint(max_len // 16, max_len // 8 + 1, (rows,), generator=g)
    long = torch.randint(max_len // 4, max_len + 1, (rows,), generator=g)
    out = torch.where(torch.rand(rows, generator=g) < 0.25, long, short)
    out[0] = max_len
    return out


def child(args: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=args.hidden // 32,
                         num_key_value_heads=args.hidden // 32, max_position_embeddings=args.max_len)
    model = LlamaForCausalLM(config)
    n = lengths(args.rows, args.max_len)
    mask = (torch.arange(args.max_len) < n[:, None]).long()
    ids = torch.randint(1, args.vocab, mask.shape) * mask
    budget = None if args.variant == "padded" else args.budget
    head_chunk = args.head_chunk if args.variant == "chunked" else None
    times = []
    for _ in range(args.warmup + args.repeats):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        logp, _ = token_logprobs(model, ids, mask, token_budget=budget, head_chunk=head_chunk)
        (logp * mask).sum().backward()
        times.append(time.perf_counter() - start)
    times = times[args.warmup:]
    return {"variant": args.variant, "budget": budget, "head_chunk": head_chunk, "median_s": statistics.median(times), "times_s": times,
            "real_tokens": int(mask.sum()), "padded_tokens": mask.numel(),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--max-len", type=int, default=1024)
    parser.add_argument("--budget", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--head-chunk", type=int, default=1024, help="tokens per LM-head chunk (chunked variant)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variant", choices=["padded", "budget", "chunked"], help=argparse.SUPPRESS)
    parser.add_argument("--out", default="benchmarks/results/logprobs.json")
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(child(args)))
        return
    forwarded = sys.argv[1:]
    results = {}
    for variant in ("padded", "budget", "chunked"):
        results[variant] = in_subprocess("benchmarks.logprobs", *forwarded, "--variant", variant)
    before, after, chunked = results["padded"], results["budget"], results["chunked"]
    real, padded = before["real_tokens"], before["padded_tokens"]
    print(f"{args.rows} rows, lengths up to {args.max_len}: {real} real tokens in a {padded}-token padded batch "
          f"({real / padded:.0%} real); Llama hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}; "
          f"forward + backward of token_logprobs, {torch.get_num_threads()} threads\n")
    print("| variant | median s | peak RSS MiB |\n|---|---|---|")
    for r in (before, after, chunked):
        name = "padded (one pass)" if r["budget"] is None else f"token budget {r['budget']}"
        name += f", chunked LM head {r['head_chunk']}" if r["head_chunk"] else ""
        print(f"| {name} | {r['median_s']:.2f} | {r['peak_rss_mib']:.0f} |")
    print(f"\nspeed-up {before['median_s'] / after['median_s']:.2f}x, peak memory "
          f"{after['peak_rss_mib'] / before['peak_rss_mib']:.2f}x of the padded pass; the chunked head "
          f"{after['median_s'] / chunked['median_s']:.2f}x the speed and {chunked['peak_rss_mib'] / after['peak_rss_mib']:.2f}x "
          "the peak memory of the token-budget pass")
    write_results(args.out, {"args": vars(args) | {"variant": None}, **results})


if __name__ == "__main__":
    main()
