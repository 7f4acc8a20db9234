"""Closed-loop credit learning: tabular policies trained with every method's credit estimator and PolicyLoss
unchanged (AdamW), on three families with a latent ground truth (tool calls then a summary, multi-turn revision,
DPA decisions); steps to a true-quality threshold and final true quality, seed-paired against GRPO.

    .venv/bin/python -m benchmarks.credit_learning [--size tiny|full] [--seed 0]
        [--out benchmarks/results/credit_learning.json] [--plot docs/experiments/credit_learning.png]

The families, the loop and the statistics are :mod:`lit_credit.analysis.credit_learning`'s. Output: the markdown
tables on stdout, the JSON report (with the machine) at ``--out``, the dose-response plot at ``--plot``. ``tiny``
runs in seconds (the test suite runs it), ``full`` in about half an hour on one CPU thread.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from benchmarks.machine import machine, write_results
from lit_credit.analysis import credit_learning


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.credit_learning", description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(credit_learning.SIZES), default="full",
                        help="tiny: the CI setting (seconds); full: the documented run (200 seeds per cell)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every draw (contexts, sampling, noise)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/credit_learning.json"))
    parser.add_argument("--plot", type=Path, default=Path("docs/experiments/credit_learning.png"),
                        help="where the figure goes ('' for none)")
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 0)) or torch.get_num_threads())

    start = time.perf_counter()
    report = credit_learning.run(args.size, args.seed, log=lambda m: print(m, file=sys.stderr, flush=True))
    report["elapsed_s"] = time.perf_counter() - start
    info = machine()
    print(f"# credit learning ({args.size}, seed {args.seed}): {info['cpu_model']}, {info['cores']} cores, "
          f"torch {info['torch']}, {torch.get_num_threads()} thread(s); {report['elapsed_s']:.1f} s\n")
    print(credit_learning.markdown(report))
    write_results(args.out, report)
    print(f"wrote {args.out}")
    if str(args.plot):
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        credit_learning.plot(report).savefig(args.plot)
        print(f"wrote {args.plot}")
    return report


if __name__ == "__main__":
    main()
