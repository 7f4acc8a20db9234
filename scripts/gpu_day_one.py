"""The first call on a lent GPU machine: `lit-credit` itself on the real path, then scripts/gpu_check.sh.

Run by scripts/gpu_day_one.sh; phases, each a subprocess with its own time limit (:data:`CAPS`) inside one
budget (``--budget``, default 420 s, so that the call stays under 8 minutes), each recorded pass / fail in
``summary.json``:

0. ``install``: the carried wheels (.gpu-wheels/, from scripts/gpu_wheels.sh) with ``pip install --no-index
   --no-deps`` (the machine has no network), then lit-credit itself, ``pip install --no-deps
   --no-build-isolation -e .``, whose ``lit-credit`` console script the runs use (``python -m lit_credit.train``
   from source if that install fails);
1. ``preflight``: the GPU (``nvidia-smi``), and one import of what
   ``lit-credit`` imports at module level (``lit_credit.train``, the task, reward, engine, method, callbacks);
   the versions of every package the run uses are in the summary;
2. ``model``: a randomly initialised Qwen2.5-0.5B-shaped Qwen2ForCausalLM (scripts/gpu_check.py's ``QWEN25_05B``:
   hidden 896, 24 layers, 14 heads on 2 KV heads, intermediate 4864, vocabulary 151 936, tied embeddings; seed 0,
   saved in bf16 as Qwen's checkpoints are) written as an HF directory with the embedded policy's tokenizer (the
   project builds it offline: ``EmbeddedPolicy(task, sft_steps=0).build()``, a byte-level BPE of the arithmetic
   corpus, a few hundred ids, all under the model's vocabulary; eos / pad are its ``<|im_end|>`` /
   ``<|endoftext|>``, so generation lengths are whatever the random policy samples, in practice the cap);
3. ``lit_credit_gpu`` and ``lit_credit_fsdp``: ``lit-credit`` (:data:`RUN`: GRPO on arithmetic, ``model=hf
   model.path=<2>``, ``rollout=hf``, 8 prompts x 8 rollouts of at most 64 new tokens a step, 3 steps, validation
   before training and after step 2 (16 held-out prompts greedy, 2 samples each), a checkpoint and an HF export at
   step 3, credit records every step) on ``trainer=gpu`` and on ``trainer=fsdp trainer.devices=1``; each run is
   then read back (:func:`inspect_run`: its TensorBoard scalars, checkpoint files, records) and passes when it
   exited 0, logged ``train/reward/mean`` for 3 steps and ``val/reward/mean`` before training and after step 2,
   wrote ``last.ckpt``, the step-3 checkpoint and the HF export, and every final metric is finite. The
   checkpoint and export weights are deleted after (at 0.5B each checkpoint is about 6 GB: the policy and its AdamW
   moments in fp32; ``trainer=fsdp`` writes each as a directory of shards);
4. ``gpu_check``: scripts/gpu_check.sh with its defaults (BENCHMARKS.md §5), ``gpu_check.json`` into ``--out``.

``--cpu``, the dry run (tests/test_gpu_check.py, ``make gpu-day-one-cpu``): the same phases and the same
``lit-credit`` invocations on CPU, with exactly these changes: the model is scripts/gpu_check.py's ``TINY``
(the same architecture: hidden 64, 2 layers, 4 heads on 2 KV heads, intermediate 256, vocabulary 1024);
``trainer=cpu`` stands in for ``trainer=gpu`` and ``trainer=fsdp2_cpu trainer.devices=1`` for ``trainer=fsdp
trainer.devices=1`` (accelerator cpu; FSDP2's process group on gloo, not NCCL), both with
``trainer.precision=bf16-mixed`` as on the GPU (bf16 autocast, under FSDP2 its ``MixedPrecisionPolicy``), the
FSDP2 one writing distributed checkpoints as ``trainer=fsdp`` does;
gpu_check.sh runs with ``--cpu``. Nothing is installed into the environment: the wheels go into a scratch
directory (``pip install --target --python-version 3.12``: the set installs, one version each) and the runs use
the ``lit-credit`` beside this Python. An ``imports`` phase traces the imports of both ``lit-credit`` runs
(``PYTHONPROFILEIMPORTTIME``) and fails (:func:`check_imports`) if one they need comes from a distribution that
is neither on the GPU machine (:data:`DEVICE_PACKAGES`) nor among the wheels of scripts/gpu_wheels.sh, or if a
wheel is never imported.

This file, run as the orchestrator, uses the standard library only (it never touches the GPU); ``--write-model``
and ``--inspect-run`` are the subprocesses of phases 2 and 3. Writes to ``--out`` (default ``$OUT``, else
outputs/gpu_day_one/<timestamp>) no more than 7 files: summary.json, console.log (the driver's own lines),
lit_credit_gpu.log, lit_credit_fsdp.log, gpu_check.log, gpu_check.json, runs.tar.gz (both run directories
without their checkpoint weights). Exits 0 only when every phase passed.
"""
from __future__ import annotations

import argparse
import ast
import importlib.metadata
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START = time.monotonic()
STEPS = 3
# The lit-credit invocation both runs share (the trainer's arguments come after it). GRPO on arithmetic
# (conf/train.yaml's defaults: task=arith, reward=exact_match, credit=grpo, loss=grpo, method=grpo) with the
# small arithmetic split of the tests (operands 0..9, 20 held out) and a local HF model.
RUN = ("task.max_operand=9", "task.num_test=20", "model=hf", "rollout=hf",
       "data.prompts_per_step=8", "data.sampling.n=8", "data.sampling.max_new_tokens=64",
       "data.val_prompts=16", "data.val_samples=2", f"trainer.max_steps={STEPS}", "trainer.val_check_interval=2",
       "validate_first=true", f"callbacks.checkpoint.every_n_train_steps={STEPS}",
       f"callbacks.hf_export.every_n_steps={STEPS}", "callbacks.credit_records.every_n_steps=1",
       "+trainer.enable_progress_bar=false", "seed=0")
# The logger's step index of each train/reward/mean and val/reward/mean value: Lightning logs step k's metrics at
# index k - 1 (tests/test_resume.py), validate_first's at 0; validation after step 2 (trainer.val_check_interval=2)
# is then at index 1.
TRAIN_INDICES, VAL_INDICES = list(range(STEPS)), [0, 1]
# The embedded tokenizer's task: the runs' (RUN's task.*; conf/task/arith.yaml's ops, seed=${seed}=0).
TASK = {"max_operand": 9, "num_test": 20, "ops": "+-", "seed": 0}
TRAINERS = {  # phase -> (GPU arguments, CPU stand-in)
    "lit_credit_gpu": (("trainer=gpu",), ("trainer=cpu", "trainer.precision=bf16-mixed")),
    "lit_credit_fsdp": (("trainer=fsdp", "trainer.devices=1"),
                        ("trainer=fsdp2_cpu", "trainer.devices=1", "trainer.precision=bf16-mixed",
                         "trainer.strategy.save_distributed_checkpoint=true")),  # as trainer=fsdp writes them
}
# Seconds each phase may take at most (GPU; the whole call is held to --budget as well).
CAPS = {"preflight": 60, "model": 120, "lit_credit_gpu": 150, "lit_credit_fsdp": 150, "gpu_check": 240}
# Seconds of the budget each phase leaves to the phases after it (GPU): gpu_check keeps at least 120 s.
RESERVE = {"preflight": 120, "model": 120, "lit_credit_gpu": 120, "lit_credit_fsdp": 120}
# The distributions on the GPU machine's image (/work/.library/device/KINDS.md, read there on 2026-11-17).
_DEVICE_PACKAGES = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy
peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel
wrapt xarray xxhash yarl zipp
"""
DEVICE_PACKAGES = frozenset(_DEVICE_PACKAGES.split())
LOCAL = frozenset({"lit_credit", "callbacks", "data_modules"})  # the project, from this checkout
# What preflight imports: every module `lit-credit` builds from on this path, so a missing package fails here.
PREFLIGHT = ("lit_credit.train", "lit_credit.tasks", "lit_credit.rewards", "lit_credit.rollout",
             "lit_credit.methods", "lit_credit.models", "callbacks", "data_modules")
VERSIONS = ("torch", "transformers", "tokenizers", "lightning", "pytorch-lightning", "peft", "hydra-core",
            "omegaconf", "antlr4-python3-runtime", "datasets", "dill", "multiprocess", "math-verify",
            "latex2sympy2_extended", "pyarrow", "pandas", "numpy", "huggingface-hub", "fsspec", "safetensors",
            "tensorboard", "sympy", "xxhash", "setuptools", "lit-credit")


def now() -> float:
    return time.monotonic() - START


def say(message: str, log: Path | None = None) -> None:
    line = f"[{now():6.1f}s] {message}"
    print(line, flush=True)
    if log is not None:
        with log.open("a") as f:
            f.write(line + "\n")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_list() -> list[str]:
    """``name==version`` of every wheel scripts/gpu_wheels.sh downloads (its ``WHEELS`` block)."""
    text = (ROOT / "scripts" / "gpu_wheels.sh").read_text()
    block = re.search(r'^WHEELS="\n(.*?)\n"', text, re.M | re.S)
    if block is None:
        raise RuntimeError("scripts/gpu_wheels.sh holds no WHEELS=\"...\" block")
    return block.group(1).split()


def versions() -> dict[str, str | None]:
    out = {"python": sys.version.split()[0]}
    for name in VERSIONS:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


# ---------------------------------------------------------------------------------------------- subprocesses
def run(cmd: list[str], log: Path, timeout: float, env: dict | None = None) -> tuple[int | None, float]:
    """``cmd`` with stdout and stderr into ``log``, in its own process group; past ``timeout`` s the group is
    killed and the return code is None. Returns (code, seconds)."""
    start = time.monotonic()
    with log.open("ab") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
    return code, time.monotonic() - start


def tail(path: Path, chars: int = 3000) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return text[-chars:]


def write_model(out: Path, cpu: bool, cache: Path) -> dict:
    """Phase 2, in its own process: the Qwen2.5-0.5B-shaped (``cpu``: TINY) model directory at ``out``."""
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    from lit_credit.models import EmbeddedPolicy
    from lit_credit.tasks import ArithTask

    # The embedded recipe of conf/model/embedded.yaml, without its SFT: only its tokenizer is used.
    embedded = EmbeddedPolicy(ArithTask(**TASK), cache_dir=str(cache), sft_steps=0).build()
    tokenizer = AutoTokenizer.from_pretrained(embedded, local_files_only=True)
    config = dict(gpu_check.TINY if cpu else gpu_check.QWEN25_05B)
    if len(tokenizer) > config["vocab_size"]:
        raise RuntimeError(f"the embedded tokenizer's {len(tokenizer)} ids do not fit the model's vocabulary "
                           f"{config['vocab_size']}")
    # Qwen2.5's bos and pad are its <|endoftext|>, eos its <|im_end|>: the embedded tokenizer's same tokens.
    config.update(bos_token_id=tokenizer.pad_token_id, pad_token_id=tokenizer.pad_token_id,
                  eos_token_id=tokenizer.eos_token_id)
    device = "cpu" if cpu or not torch.cuda.is_available() else "cuda"
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(gpu_check.qwen2(config))
    model.to(torch.bfloat16)  # as Qwen2.5's own checkpoint; PolicySource.load trains it in fp32
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    info = {"path": str(out), "architecture": "Qwen2ForCausalLM", "init": "random (seed 0)",
            "config": "TINY" if cpu else "QWEN25_05B", "params": sum(p.numel() for p in model.parameters()),
            "vocab_size": config["vocab_size"], "tokenizer": str(embedded), "tokenizer_ids": len(tokenizer),
            "saved_dtype": "bfloat16", "written_on": device,
            "bytes": sum(p.stat().st_size for p in out.iterdir() if p.is_file())}
    (out / "day_one_model.json").write_text(json.dumps(info, indent=2))
    return info


def size_of(path: Path) -> int:
    """Bytes of a checkpoint: a file, or a distributed checkpoint's directory of shards."""
    return path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def inspect_run(run_dir: Path) -> dict:
    """Phase 3's read-back, in its own process: the run's TensorBoard scalars (the steps each train and val
    series was logged at, their last values), its checkpoint and HF export files, its credit records."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: dict[str, list[tuple[int, float]]] = {}
    for events in sorted(run_dir.rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend((e.step, float(e.value)) for e in acc.Scalars(tag))
    ckpt = run_dir / "checkpoints"
    return {
        "train_reward_mean": scalars.get("train/reward/mean", []),  # (logger step index, value) per value logged
        "val_reward_mean": scalars.get("val/reward/mean", []),
        "last": {tag: series[-1][1] for tag, series in sorted(scalars.items())},
        "checkpoints": {p.name: size_of(p) for p in sorted(ckpt.glob("*.ckpt"))} if ckpt.is_dir() else {},
        "hf_export": sorted(str(p.parent.relative_to(ckpt)) for p in ckpt.glob("hf/*/config.json")),
        "records": len(list((run_dir / "records").glob("*.parquet"))),
    }


# ---------------------------------------------------------------------------------------------- phases
class Day:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.cpu = args, args.cpu
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.out = Path(args.out or os.environ.get("OUT") or ROOT / "outputs" / "gpu_day_one" / stamp).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.work or tempfile.mkdtemp(prefix="gpu_day_one_")).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.console = self.out / "console.log"
        self.traced: dict = {}  # --cpu: the lit-credit runs' imports (strip_import_times)
        self.deadline = args.budget
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                    "HF_DATASETS_OFFLINE": "1", "LIT_CREDIT_CACHE": str(self.work / "cache"),
                    "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        self.env.pop("OUT", None)  # gpu_check.py gets --out; nothing else writes to $OUT
        for key in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "LIT_CREDIT_RUN_ID"):
            self.env.pop(key, None)
        self.summary: dict = {
            "mode": "cpu dry run" if self.cpu else "gpu", "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "budget_s": args.budget, "run_overrides": list(RUN),
            "trainers": {k: list(v[1] if self.cpu else v[0]) for k, v in TRAINERS.items()},
            "wheels": wheel_list(), "versions": versions(), "phases": {},
        }

    def left(self, phase: str) -> float:
        """Seconds ``phase`` may take: its cap, within what is left of the budget less what the later
        phases are promised (:data:`RESERVE`: a hung run cannot take gpu_check's time)."""
        cap = CAPS[phase] * (4 if self.cpu else 1)  # a shared 2-core CPU is slower than the GPU machine
        return min(cap, self.deadline - now() - (0 if self.cpu else RESERVE.get(phase, 0)))

    def save(self) -> None:
        self.summary["wall_s"] = round(now(), 1)
        tmp = self.out / "summary.json.tmp"
        tmp.write_text(json.dumps(self.summary, indent=2, default=str))
        os.replace(tmp, self.out / "summary.json")

    def record(self, phase: str, passed: bool, seconds: float, **details) -> bool:
        self.summary["phases"][phase] = {"passed": passed, "seconds": round(seconds, 1), **details}
        say(f"{phase}: {'PASS' if passed else 'FAIL'} ({seconds:.0f} s)"
            + (f": {details['reason']}" if not passed and details.get("reason") else ""), self.console)
        self.save()
        return passed

    def skip(self, phase: str, reason: str) -> bool:
        return self.record(phase, False, 0.0, reason=f"skipped: {reason}")

    def python(self, phase: str, code: list[str], log: Path) -> tuple[int | None, float]:
        limit = self.left(phase)
        if limit < 5:
            return -1, 0.0
        return run([sys.executable, *code], log, limit, self.env)

    def install(self) -> bool:
        """Phase 0: the carried wheels (.gpu-wheels/, scripts/gpu_wheels.sh) with ``pip install --no-index
        --no-deps``, then lit-credit itself, editable and without dependencies, whose ``lit-credit`` console script
        the runs use (``python -m lit_credit.train`` from source if that install fails). ``--cpu``: nothing goes
        into the environment; the wheels (made by scripts/gpu_wheels.sh first when .gpu-wheels/ lacks them: a fresh
        checkout) are installed into a scratch directory for CPython 3.12 instead (they install, one version each),
        and the runs use the ``lit-credit`` beside this Python."""
        start = time.monotonic()
        bin_dir = Path(sys.executable).parent
        want = sorted(norm(w.split("==")[0]) for w in wheel_list())
        if self.cpu and sorted(norm(p.name.split("-")[0]) for p in (ROOT / ".gpu-wheels").glob("*.whl")) != want:
            # a fresh checkout (CI): make them as `make gpu-wheels` does (here the package index is reachable)
            run(["bash", str(ROOT / "scripts" / "gpu_wheels.sh")], self.work / "wheels.log",
                min(300, self.deadline - now()), {**self.env, "PY": sys.executable})
        found = sorted((ROOT / ".gpu-wheels").glob("*.whl"))
        names = sorted(norm(p.name.split("-")[0]) for p in found)
        details: dict = {"files": [p.name for p in found], "bytes": sum(p.stat().st_size for p in found)}
        problems = []
        if names != want:
            problems.append(f".gpu-wheels holds {names or 'nothing'}, scripts/gpu_wheels.sh lists {want} (run "
                            "scripts/gpu_wheels.sh here and carry .gpu-wheels)")
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--no-cache-dir"]
        if self.cpu:
            pip += ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--target",
                    str(self.work / "site")]
        log = self.work / "install.log"
        if found:
            rc, _ = run([*pip, *map(str, found)], log, min(300, self.deadline - now()))
            if rc != 0:
                problems.append(f"pip install of the wheels: exit {rc}: {tail(log, 1500)}")
        command = self.args.lit_credit
        if command is None and not self.cpu:
            rc, _ = run([*pip, "--no-build-isolation", "-e", str(ROOT)], log, min(300, self.deadline - now()))
            details["editable_install_exit"] = rc
        if command is None:
            script = bin_dir / "lit-credit"
            script = str(script) if script.exists() else shutil.which("lit-credit")
            command = script or f"{sys.executable} -m lit_credit.train"
        self.lit_credit_cmd = command.split()
        self.summary["lit_credit"] = command
        details["lit_credit"] = command
        if problems:
            details["reason"] = "; ".join(problems)
        importlib.invalidate_caches()
        self.summary["versions"] = versions()  # after the install
        if not self.cpu:
            say("versions: " + ", ".join(f"{k} {v}" for k, v in self.summary["versions"].items()), self.console)
        return self.record("install", not problems, time.monotonic() - start, **details)

    def preflight(self) -> bool:
        log = self.work / "preflight.log"
        smi = shutil.which("nvidia-smi")
        if smi:
            query = subprocess.run([smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                                   capture_output=True, text=True, timeout=30)
            full = subprocess.run([smi], capture_output=True, text=True, timeout=30)
            self.summary["nvidia_smi"] = {"gpu": query.stdout.strip(), "full": full.stdout}
            say(f"nvidia-smi: {query.stdout.strip()}", self.console)
        code = ("import importlib, json, torch\n"
                f"for name in {PREFLIGHT!r}: importlib.import_module(name)\n"
                "cuda = torch.cuda.is_available()\n"
                "print('PREFLIGHT ' + json.dumps({'cuda': cuda, 'torch_cuda': torch.version.cuda, "
                "'device': torch.cuda.get_device_name() if cuda else 'cpu', "
                "'bf16': cuda and torch.cuda.is_bf16_supported(), 'nccl': torch.distributed.is_nccl_available()}))\n")
        rc, seconds = self.python("preflight", ["-c", code], log)
        text = log.read_text(errors="replace") if log.exists() else ""
        found = re.findall(r"^PREFLIGHT (.*)$", text, re.M)
        info = json.loads(found[-1]) if found else {}
        self.summary["torch"] = info
        reason = None
        if rc != 0:
            reason = f"exit {rc}: {tail(log, 2000)}"
        elif not self.cpu and not info.get("cuda"):
            reason = "torch sees no CUDA device"
        return self.record("preflight", reason is None, seconds, **info, **({"reason": reason} if reason else {}))

    def model(self) -> Path | None:
        target = self.work / "qwen2.5-0.5b-random"
        shutil.rmtree(target, ignore_errors=True)
        log = self.work / "model.log"
        rc, seconds = self.python("model", [__file__, "--write-model", str(target), *(["--cpu"] if self.cpu else []),
                                            "--work", str(self.work)], log)
        info = json.loads((target / "day_one_model.json").read_text()) if rc == 0 else {}
        reason = None if rc == 0 else f"exit {rc}: {tail(log, 2000)}"
        passed = self.record("model", reason is None, seconds, **info, **({"reason": reason} if reason else {}))
        return target if passed else None

    def lit_credit(self, phase: str, model_dir: Path) -> bool:
        trainer = TRAINERS[phase][1 if self.cpu else 0]
        run_dir = self.work / phase
        shutil.rmtree(run_dir, ignore_errors=True)
        log = self.out / f"{phase}.log"
        log.unlink(missing_ok=True)
        cmd = [*self.lit_credit_cmd, *RUN, f"model.path={model_dir}", *trainer,
               f"hydra.run.dir={run_dir}", f"paths.cache_dir={self.work / 'cache'}"]
        env = dict(self.env)
        if self.cpu:
            env["PYTHONPROFILEIMPORTTIME"] = "1"  # the imports phase reads them back out of the log
        limit = self.left(phase)
        if limit < 10:
            return self.skip(phase, "the call's time budget is spent")
        say(f"{phase}: {' '.join(cmd)}", self.console)
        with log.open("w") as f:
            f.write(f"$ {' '.join(cmd)}\n")
        rc, seconds = run(cmd, log, limit, env)
        if self.cpu:
            importer, modules = strip_import_times(log)
            self.traced.setdefault("importer", {}).update({k: v for k, v in importer.items()
                                                          if k not in self.traced.get("importer", {})})
            self.traced.setdefault("modules", set()).update(modules)
        text = log.read_text(errors="replace")
        final = re.findall(r"final metrics: (\{.*\})", text)
        metrics = ast.literal_eval(final[-1]) if final else {}
        details: dict = {"command": cmd, "exit": rc, "final_metrics": metrics}
        inspect_log = self.work / f"{phase}.inspect.log"
        run([sys.executable, __file__, "--inspect-run", str(run_dir)], inspect_log, 120, self.env)
        found = re.findall(r"^INSPECT (.*)$", inspect_log.read_text(errors="replace"), re.M)
        seen = json.loads(found[-1]) if found else {}
        details["run"] = seen
        problems = []
        if rc != 0:
            problems.append("timed out" if rc is None else f"exit {rc}")
        if not found:
            problems.append(f"the run could not be read back: {tail(inspect_log, 1500)}")
        else:
            steps = {k: [i for i, _ in seen[f"{k}_reward_mean"]] for k in ("train", "val")}
            if steps["train"] != TRAIN_INDICES:
                problems.append(f"train/reward/mean logged at step indices {steps['train']}, not {TRAIN_INDICES} "
                                f"({STEPS} steps)")
            if steps["val"] != VAL_INDICES:
                problems.append(f"val/reward/mean logged at step indices {steps['val']}, not {VAL_INDICES} (before "
                                "training and after step 2)")
            if not seen["checkpoints"].get("last.ckpt") or not any(
                    name.endswith(f"step={STEPS}.ckpt") and size for name, size in seen["checkpoints"].items()):
                problems.append(f"no checkpoints/last.ckpt and step-{STEPS} checkpoint: {seen['checkpoints']}")
            if not seen["hf_export"]:
                problems.append("no HF export (checkpoints/hf/*/config.json)")
            if not seen["records"]:
                problems.append("no credit records (records/*.parquet)")
        bad = [k for k, v in metrics.items() if not math.isfinite(v)]
        if rc == 0 and not metrics:
            problems.append("no 'final metrics' line in the log")
        if bad:
            problems.append(f"final metrics not finite: {bad}")
        if problems:
            details["reason"] = "; ".join(problems)
            details["log_tail"] = tail(log, 4000)
        for ckpt in (run_dir / "checkpoints").glob("*.ckpt"):  # GBs at 0.5B; their sizes are in details
            ckpt.unlink() if ckpt.is_file() or ckpt.is_symlink() else shutil.rmtree(ckpt, ignore_errors=True)
        for weights in (run_dir / "checkpoints" / "hf").glob("*/*.safetensors"):
            weights.unlink()
        return self.record(phase, not problems, seconds, **details)

    def imports(self) -> bool:
        """--cpu: :func:`check_imports` of both lit-credit runs' traces and the wheels of scripts/gpu_wheels.sh.
        The trace goes into the summary (``imports.traced``) so that the check can be re-run on it."""
        importer, modules = self.traced.get("importer", {}), self.traced.get("modules", set())
        if not importer:
            return self.skip("imports", "no lit-credit run traced its imports")
        project = sorted(m for m in modules if m.split(".")[0] in LOCAL)
        carried = {norm(w.split("==")[0]) for w in wheel_list()}
        details = check_imports(importer, project, carried)
        details["traced"] = {"importer": importer, "project_modules": project}
        return self.record("imports", "reason" not in details, 0.0, **details)

    def gpu_check(self) -> bool:
        log = self.out / "gpu_check.log"
        log.unlink(missing_ok=True)
        limit = self.left("gpu_check")
        if limit < 30:
            return self.skip("gpu_check", "the call's time budget is spent")
        env = {**self.env, "PY": sys.executable}
        if self.cpu:
            env.setdefault("OMP_NUM_THREADS", "1")
        say("gpu_check: scripts/gpu_check.sh" + (" --cpu" if self.cpu else ""), self.console)
        rc, seconds = run([str(ROOT / "scripts" / "gpu_check.sh"), *(["--cpu"] if self.cpu else []),
                           "--out", str(self.out)], log, limit, env)
        report = self.out / "gpu_check.json"
        details: dict = {"exit": rc, "json": report.name if report.exists() else None}
        if report.exists():
            data = json.loads(report.read_text())
            details.update({k: data.get(k) for k in ("device", "rollout", "train", "agreement", "errors")})
        if rc != 0:
            details["reason"] = "timed out" if rc is None else f"exit {rc}: {tail(log, 2000)}"
        return self.record("gpu_check", rc == 0, seconds, **details)

    def report(self) -> None:
        """The figures worth reading in the call's output: each run's perf/* and reward metrics, gpu_check's
        table (the end of its log)."""
        for phase in TRAINERS:
            metrics = self.summary["phases"].get(phase, {}).get("final_metrics") or {}
            shown = {k: v for k, v in metrics.items() if k.startswith("perf/") or k.endswith("reward/mean")}
            if shown:
                say(f"{phase} final: " + ", ".join(f"{k} {v:g}" for k, v in sorted(shown.items())), self.console)
        log = self.out / "gpu_check.log"
        if log.exists():
            table = log.read_text(errors="replace").split("\n\n")[-1].strip()
            for line in table.splitlines()[-16:]:
                say(f"gpu_check | {line}", self.console)

    def bundle(self) -> None:
        """runs.tar.gz: both run directories (configs, TensorBoard events, records, the HF export's config and
        tokenizer), their weights already deleted; the preflight, model and read-back logs."""
        with tarfile.open(self.out / "runs.tar.gz", "w:gz") as tar:
            for path in sorted(self.work.iterdir()):
                if path.name in TRAINERS or path.suffix == ".log":
                    tar.add(path, arcname=path.name)

    def main(self) -> int:
        say(f"gpu_day_one ({self.summary['mode']}): out {self.out}, work {self.work}, budget {self.deadline:.0f} s",
            self.console)
        say("versions: " + ", ".join(f"{k} {v}" for k, v in self.summary["versions"].items()), self.console)
        self.save()
        self.install()
        model_dir = self.model() if self.preflight() else None
        for phase in TRAINERS:
            self.lit_credit(phase, model_dir) if model_dir else self.skip(phase, "no model directory")
        if self.cpu:
            self.imports()
        self.gpu_check()
        self.bundle()
        self.report()
        if not self.args.work:  # a temporary directory of this run's own: the model, the cache, the runs
            shutil.rmtree(self.work, ignore_errors=True)
        failed = [name for name, p in self.summary["phases"].items() if not p["passed"]]
        self.summary["passed"] = not failed
        self.save()
        say(("ALL PASSED" if not failed else f"FAILED: {', '.join(failed)}") + f"; wrote {self.out}", self.console)
        return 1 if failed else 0


def check_imports(importer: dict[str, str], project_modules: list[str], carried: set[str]) -> dict:
    """Whether every distribution a traced lit-credit run needs is on the GPU machine (:data:`DEVICE_PACKAGES`)
    or ``carried`` (normalised names); a ``reason`` key when not, or when a carried one was never imported.

    ``importer``: :func:`strip_import_times`'s map; ``project_modules``: the project's modules imported. Needed:
    what those import at module level (:func:`project_imports`), what the program imported itself (Hydra's
    ``_target_`` look-ups among them), and what a carried package imported first. What a package already on the
    machine imported first is that package's own business (its version there was installed with what it needs;
    an optional import, such as lightning.pytorch.cli's jsonargparse or this transformers' httpx2, is skipped
    there when absent): listed under ``not_on_machine_imported_by_machine_packages``, not required. A module that
    maps to no distribution here (an optional import that failed, as tensorflow) is listed and not required."""
    dists = importlib.metadata.packages_distributions()
    carried_modules = {m for m, names in dists.items() if carried & {norm(n) for n in names}}
    needed = {m for m, by in importer.items() if by in ("", *LOCAL, *carried_modules)}
    needed |= project_imports(set(project_modules))
    used: dict[str, list[str]] = {}  # distribution -> its top-level modules imported
    missing, unknown, optional = {}, [], {}
    for module in sorted(importer):
        if module in sys.stdlib_module_names or module in LOCAL or module in ("__main__", "sitecustomize"):
            continue
        names = {norm(n) for n in dists.get(module, ())}
        if not names:
            unknown.append(module)
            continue
        for name in names:
            used.setdefault(name, []).append(module)
        there = names & (DEVICE_PACKAGES | carried | {"lit-credit"})
        if module in needed and not there:
            missing[module] = sorted(names)
        elif not there:
            optional[module] = f"{sorted(names)}, imported by {importer[module]}"
    unused = sorted(carried - set(used))
    details: dict = {"needed": sorted(m for m in needed if dists.get(m) and m not in LOCAL),
                     "distributions": sorted(used), "carried": sorted(carried), "missing": missing,
                     "not_on_machine_imported_by_machine_packages": optional, "modules_without_distribution": unknown}
    if missing:
        details["reason"] = (f"needed, and from distributions neither on the GPU machine nor carried: {missing} "
                             "(add them to scripts/gpu_wheels.sh)")
    elif unused:
        details["reason"] = f"carried but never imported: {unused} (drop them from scripts/gpu_wheels.sh)"
    return details


def strip_import_times(log: Path) -> tuple[dict[str, str], set[str]]:
    """What ``-X importtime`` reported in ``log`` (those lines are removed from it): (for each top-level name
    imported, the top-level name of the module that imported it first: its nearest ancestor in the import tree
    of another top-level name, the standard library's skipped, "" when the program itself did, not an import;
    the full names of every module imported)."""
    lines = log.read_text(errors="replace").splitlines(keepends=True)
    entries, kept = [], []
    for line in lines:
        if line.startswith("import time:"):
            field = line.rstrip("\n").rsplit("|", 1)[-1]
            name = field.strip()
            if name and name != "imported package":
                entries.append(((len(field) - len(field.lstrip()) - 1) // 2, name))
        else:
            kept.append(line)
    log.write_text("".join(kept))
    importer: dict[str, str] = {}
    stack: list[tuple[int, str]] = []  # the tree is printed children first: read backwards, parents come first
    for level, name in reversed(entries):
        while stack and stack[-1][0] >= level:
            stack.pop()
        top = name.split(".")[0]
        if top not in importer:
            ancestors = [n.split(".")[0] for _, n in reversed(stack)]
            importer[top] = next((a for a in ancestors if a != top and a not in sys.stdlib_module_names), "")
        stack.append((level, name))
    return importer, {name for _, name in entries}


def project_imports(modules: set[str]) -> set[str]:
    """The top-level names the project's own modules among ``modules`` (full names the trace saw) import at
    module level: needed whichever package happened to import them first."""
    names = set()
    for module in modules:
        if module.split(".")[0] not in LOCAL:
            continue
        base = ROOT.joinpath(*module.split("."))
        path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if not path.is_file():
            continue
        body = list(ast.parse(path.read_text()).body)
        while body:
            node = body.pop()
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
            elif isinstance(node, (ast.If, ast.Try)):
                body += [*node.body, *node.orelse, *getattr(node, "finalbody", []),
                         *(n for h in getattr(node, "handlers", []) for n in h.body)]
    return names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="store_true", help="the dry run on CPU: tiny model, trainer=cpu / fsdp2_cpu")
    p.add_argument("--out", help="output directory (default: $OUT, else outputs/gpu_day_one/<timestamp>)")
    p.add_argument("--work", help="scratch directory: model, runs, cache (default: a new temporary directory, "
                                  "removed at the end)")
    p.add_argument("--budget", type=float,
                   help="seconds for every phase together (default 420 on the GPU: the call stays under 8 minutes; "
                        "--cpu 1800)")
    p.add_argument("--lit-credit", help="the command that runs lit-credit (default: the lit-credit console script "
                                        "beside this Python, after the editable install on the GPU machine)")
    p.add_argument("--write-model", metavar="DIR", help=argparse.SUPPRESS)
    p.add_argument("--inspect-run", metavar="DIR", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.budget = args.budget or (1800.0 if args.cpu else 420.0)
    if args.write_model:
        sys.path.insert(0, str(ROOT))
        info = write_model(Path(args.write_model), args.cpu, Path(args.work) / "cache")
        print(f"model: {info['params'] / 1e6:.1f}M params, {info['bytes'] / 2**20:.0f} MiB at {info['path']}")
        return 0
    if args.inspect_run:
        print("INSPECT " + json.dumps(inspect_run(Path(args.inspect_run))))
        return 0
    return Day(args).main()


if __name__ == "__main__":
    sys.exit(main())
