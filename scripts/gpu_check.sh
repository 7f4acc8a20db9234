#!/usr/bin/env bash
# One short GRPO run on one GPU with vLLM rollouts and FSDP training; prints rollout and train tokens/s.
#
#   scripts/gpu_check.sh [MODEL_DIR] [STEPS]
#
# MODEL_DIR: a local HF causal-LM directory (e.g. a Qwen2.5-0.5B-Instruct checkout); default: the embedded
# tiny policy (built on first use). Needs the CUDA `vllm` wheel in the active Python (`pip install -e ".[vllm]"`)
# and a GPU. Writes the run to outputs/gpu_check/ and prints the mean of the per-step figures after warm-up.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
MODEL=${1:-}
STEPS=${2:-20}
OUT=outputs/gpu_check/$(date +%Y%m%d-%H%M%S)
args=(experiment=grpo_arith rollout=vllm trainer=fsdp trainer.devices=1 "trainer.max_steps=$STEPS"
      trainer.val_check_interval=1000 validate_first=false callbacks=none method.max_logprob_gap=0.05
      rollout.enable_sleep_mode=true rollout.dtype=bfloat16 "hydra.run.dir=$OUT")
if [ -n "$MODEL" ]; then
  args+=(model=hf "model.path=$MODEL" model.dtype=bfloat16 data.sampling.max_new_tokens=256 data.prompts_per_step=32)
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
"$PY" -m lit_credit.train "${args[@]}"
"$PY" - "$OUT" <<'PY'
import sys
from scripts.tb_scalars import scalars
series = scalars(sys.argv[1])
for tag in ["perf/rollout_tokens_per_s", "perf/train_tokens_per_s", "perf/step_s", "train/engine_logprob_gap",
            "train/reward/mean"]:
    values = [v for _, v in series.get(tag, [])][3:] or [v for _, v in series.get(tag, [])]
    if values:
        print(f"{tag}: mean {sum(values) / len(values):.4g} over {len(values)} steps (first 3 skipped as warm-up)")
PY
