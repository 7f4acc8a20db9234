#!/usr/bin/env bash
# The prepared first call on a lent GPU machine (issue #49): `lit-credit` itself for 3 steps with validation and
# checkpointing on `trainer=gpu` and on `trainer=fsdp trainer.devices=1` (rollout=hf, model=hf on a randomly
# initialised Qwen2.5-0.5B-shaped model), then scripts/gpu_check.sh's measurements; everything under $OUT.
#
#   scripts/gpu_day_one.sh [--cpu] [--out DIR] [--work DIR] [--budget SECONDS]
#
# The device call (BENCHMARKS.md §5): first, here, `scripts/gpu_wheels.sh` (fills the ignored .gpu-wheels/ with the
# 8 wheels lit-credit needs and that machine lacks: Hydra, datasets, math-verify and theirs; 1.5 MiB), then
#   run(command="scripts/gpu_day_one.sh", carry=[".gpu-wheels"], timeout_s=480)
# There scripts/gpu_day_one.py installs the wheels (`pip install --no-index --no-deps`: no network there) and
# lit-credit itself (`pip install --no-deps --no-build-isolation -e .`), then runs the phases, each with its own
# time limit, all inside --budget (default 420 s). Results: $OUT/summary.json (pass / fail, figures and final
# metrics per phase, versions, nvidia-smi), console.log, each run's log, gpu_check.json and its log, runs.tar.gz
# (the run directories without weights). Exit 0 only when every phase passed.
#
# --cpu: the dry run on CPU (`make gpu-day-one-cpu`; tests/test_gpu_check.py): the same phases and lit-credit
# invocations on a tiny model of the same architecture, trainer=cpu and trainer=fsdp2_cpu trainer.devices=1 in
# place of trainer=gpu and trainer=fsdp trainer.devices=1 (scripts/gpu_day_one.py's docstring lists every change);
# nothing is installed into the environment. PY: the Python (default: .venv/bin/python with --cpu when there, else
# python3, the one that holds torch on the device machine).
set -euo pipefail
cd "$(dirname "$0")/.."
CPU=0
for arg in "$@"; do [[ $arg == --cpu ]] && CPU=1; done
if [[ -z ${PY:-} ]]; then
  if [[ $CPU == 1 && -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONUNBUFFERED=1
exec "$PY" scripts/gpu_day_one.py "$@"
