"""Credit quality with ground truth: how well every registered credit estimator's credit tracks the known true
quality of tool turns, summaries, revision turns and DPA actions, by noise level (no model, no training).

    .venv/bin/python -m benchmarks.credit_quality [--size small|full] [--seed 0]
        [--out benchmarks/results/credit_quality.json] [--plot docs/experiments/credit_quality.png]

The batches, the scores (within-group Spearman, sign agreement, judge-noise leakage) and the table are
:mod:`lit_credit.analysis.credit_quality`'s. Output: the markdown table on stdout, the JSON report (with the
machine) at ``--out``, the plot at ``--plot``. ``small`` runs in seconds (the test suite runs it), ``full`` in
about a minute on 2 CPU cores.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from benchmarks.machine import machine, write_results
from lit_credit.analysis import credit_quality


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.credit_quality", description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(credit_quality.SIZES), default="full",
                        help="how many groups each family draws (small: seconds, full: the documented run)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every draw (rows, kinds, noise, actions)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/credit_quality.json"))
    parser.add_argument("--plot", type=Path, default=Path("docs/experiments/credit_quality.png"),
                        help="where the figure goes ('' for none)")
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 0)) or torch.get_num_threads())

    start = time.perf_counter()
    report = credit_quality.run(args.size, args.seed)
    report["elapsed_s"] = time.perf_counter() - start
    info = machine()
    print(f"# credit quality ({args.size}, seed {args.seed}): {info['cpu_model']}, {info['cores']} cores, "
          f"torch {info['torch']}; {report['elapsed_s']:.1f} s\n")
    print(credit_quality.markdown(report))
    write_results(args.out, report)
    print(f"wrote {args.out}")
    if str(args.plot):
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        credit_quality.plot(report).savefig(args.plot)
        print(f"wrote {args.plot}")
    return report


if __name__ == "__main__":
    main()
