#!/usr/bin/env bash
# The wheels `lit-credit` needs on the lent GPU machine and does not find there, downloaded into .gpu-wheels/
# (ignored; the device call carries it) for scripts/gpu_day_one.sh, which installs them there with
# `pip install --no-index --no-deps`: that machine has no network.
#
#   scripts/gpu_wheels.sh [DIR]        # default .gpu-wheels; PY: the Python whose pip downloads (default python3)
#
# The list: the distributions a `lit-credit` run (GRPO on arithmetic, model=hf, rollout=hf, trainer=gpu or fsdp)
# imports that are not among the machine's packages (/work/.library/device/KINDS.md, "Python packages already
# there", read 2026-11-17): Hydra and its parser, and `datasets` (lit_credit/tasks/base.py imports it at module
# level; ArithTask's splits are datasets.Dataset) with the two it imports that the machine lacks, and math-verify
# (lit_credit/rewards/__init__.py imports every reward, lit_credit/rewards/math_answer.py math_verify at module
# level) with its LaTeX parser. pyarrow, pandas, tensorboard, sympy, xxhash, fsspec, huggingface-hub, lightning,
# peft, transformers and torch are there. `scripts/gpu_day_one.sh --cpu` traces the imports of its lit-credit runs
# and fails if one comes from a distribution in neither the machine's list nor this one.
# Versions: the project's venv's (the ones its tests pass with); one version of each, pure Python (any platform),
# multiprocess the CPython 3.12 build. antlr4-python3-runtime 4.9.3 (Hydra and omegaconf pin 4.9.*) is published as
# a source archive only: it is built here into its pure-Python wheel (`pip wheel`, with this Python's setuptools).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.gpu-wheels}
PY=${PY:-python3}
# name==version, one a line (scripts/gpu_day_one.py reads this block too: keep its form)
WHEELS="
hydra-core==1.3.8
omegaconf==2.3.1
antlr4-python3-runtime==4.9.3
datasets==5.2.0
dill==0.4.1
multiprocess==0.70.19
math-verify==0.9.0
latex2sympy2_extended==1.11.0
"
SDIST_ONLY="antlr4-python3-runtime==4.9.3"
mkdir -p "$DIR"
# shellcheck disable=SC2086  # one argument per line of $WHEELS
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d "$DIR" $(printf '%s\n' $WHEELS | grep -vxF "$SDIST_ONLY")
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DIR" "$SDIST_ONLY"
ls -l "$DIR"
du -ch "$DIR"/*.whl | tail -1
