"""Peak memory of one HF-engine rollout: behaviour log-probs from a stack of every step's logits against the
sampled token's log-prob taken step by step (HFEngine).

N = 64 sampled completions of L = 512 tokens from a 2-layer Llama (hidden 64) with a V = 49 152 vocabulary
(SmolLM2's) and random weights: EOS (1 token in 49 152) is rare, so completions run to
L; float32 on CPU. ``stacked`` is the engine before this change: ``generate(output_logits=True)`` keeps every
step's [N, V] logits and ``torch.stack`` makes the [N, L, V] tensor the log-probs are gathered from;
``streamed`` is :class:`~lit_credit.rollout.HFEngine` (a logits processor takes ``log_softmax(z / T)[token]``
at each step). Each mode in its own subprocess; peak resident memory (``ru_maxrss``) after the model is built
minus before the rollout, and the rollout's wall time.

    .venv/bin/python -m benchmarks.rollout_memory [--n 64] [--length 512] [--vocab 49152]
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time

from benchmarks.machine import in_subprocess, write_results


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(mode: str, args: argparse.Namespace) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from lit_credit.models.logprobs import picked_logprobs_
    from lit_credit.rollout import HFEngine
    from lit_credit.types import SamplingParams

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024,
                         pad_token_id=0, eos_token_id=1)
    model = LlamaForCausalLM(config).eval()
    prompts = torch.randint(2, args.vocab, (args.n, 16))
    sampling = SamplingParams(n=1, max_new_tokens=args.length)
    before = _rss_mib()
    start = time.perf_counter()
    if mode == "stacked":
        with torch.no_grad():
            gen = model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), do_sample=True,
                                 temperature=1.0, top_k=0, max_new_tokens=args.length, min_new_tokens=args.length,
                                 eos_token_id=1, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
            new = gen.sequences[:, prompts.shape[1]:]
            logprobs = picked_logprobs_(torch.stack(gen.logits, 1).float(), new)
        tokens = new.numel()
    else:
        class Tokenizer:  # the two ids HFEngine reads, and a decode for the completions' text
            pad_token_id, eos_token_id = 0, 1

            @staticmethod
            def decode(ids, skip_special_tokens=True):
                return ""

        engine = HFEngine(batch_size=args.n)
        engine.bind(model, Tokenizer())
        out = engine.generate(prompts.tolist(), sampling, seeds=list(range(args.n)))
        tokens = sum(len(c[0].token_ids) for c in out)
        logprobs = torch.tensor([c[0].logprobs[0] for c in out])
    seconds = time.perf_counter() - start
    assert torch.isfinite(logprobs).all()
    return {"mode": mode, "peak_rss_mib": _rss_mib() - before, "seconds": seconds, "tokens": tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--mode", choices=["stacked", "streamed"], help=argparse.SUPPRESS)
    parser.add_argument("--out", default="benchmarks/results/rollout_memory.json")
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(child(args.mode, args)))
        return
    gib = args.n * args.length * args.vocab * 4 / 2 ** 30
    print(f"N={args.n}, L={args.length}, V={args.vocab}: one [N, L, V] float32 tensor is {gib:.2f} GiB\n")
    print("| behaviour log-probs | peak memory of the rollout, MiB | generated tokens | seconds |\n|---|---|---|---|")
    results = {}
    for mode in ("stacked", "streamed"):
        r = results[mode] = in_subprocess("benchmarks.rollout_memory", *sys.argv[1:], "--mode", mode)
        print(f"| {mode} | {r['peak_rss_mib']:.0f} | {r['tokens']} | {r['seconds']:.1f} |")
    write_results(args.out, {"args": vars(args) | {"mode": None}, "nlv_gib": gib, **results})


if __name__ == "__main__":
    main()
