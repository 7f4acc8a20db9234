#!/usr/bin/env bash
# Rollout and GRPO-step throughput of a Qwen2.5-0.5B-sized policy on one GPU: the check for the lent GPU machine.
#
#   scripts/gpu_check.sh [--cpu] [--out DIR] [--steps N] [--rollouts N] [--prompt-len N] [--new-tokens N]
#                        [--micro-rows N] [--head-chunk N] [--peak-flops F] [--dtype bfloat16|float32]
#   OUT=/some/dir scripts/gpu_check.sh      # on the device machine: the JSON lands in $OUT
#
# Runs the project from source (PYTHONPATH = the repo root, no install) and needs only torch and transformers:
# no hydra, omegaconf, datasets, lightning or vllm. The policy is a randomly initialised Qwen2ForCausalLM built from
# Qwen2.5-0.5B's config (written in scripts/gpu_check.py, no download), generation lengths fixed (eos and pad
# suppressed). In bf16, on one GPU, without and with FSDP2 (fully_shard on a world of one, NCCL):
#   - rollout tokens/s of the project's HF engine (lit_credit.rollout.engine.HFEngine: model.generate, KV cache);
#   - train tokens/s, MFU (6 * params * tokens/s / --peak-flops, default 989e12 = H200 dense bf16) and peak GPU
#     memory of a GRPO step (token_logprobs, clipped-ratio PolicyLoss with random advantages, backward, AdamW)
#     with the model's own LM head and with the chunked head (--head-chunk tokens at a time);
#   - the chunked head's log-probs against the full head's on one micro-batch, the micro-batch token count and the
#     size of the [B, T, V] fp32 logits the full head materialises.
# Defaults (64 rollouts x 256 prompt + 256 new tokens, 3 timed steps after 1 warm-up, 4 training cases) take a few
# minutes on an H200 including start-up; each phase prints a timestamp. Writes gpu_check.json to --out (default
# $OUT if set, else outputs/gpu_check/<timestamp>). --cpu: the same code on CPU with a tiny config of the
# architecture, float32, FSDP2 over gloo, in seconds; exits non-zero unless every figure is finite and positive
# and the chunked head matches the full head to 1e-4 (`make gpu-check-cpu`; tests/test_gpu_check.py runs it).
#
# vLLM on GPU stays unmeasured: no vllm wheel fits the 64 MiB the device machine is sent, and none is installed
# there. PY: the Python to run (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PY:-python3}
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
exec "$PY" scripts/gpu_check.py "$@"
