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

import sys

from benchmarks.machine import ground_truth_main
from lit_credit.analysis import credit_learning


def main(argv: list[str] | None = None) -> dict:
    return ground_truth_main("credit_learning", credit_learning, __doc__, argv,
                             "tiny: the CI setting (seconds); full: the documented run (200 seeds per cell)",
                             "seed of every draw (contexts, sampling, noise)",
                             log=lambda m: print(m, file=sys.stderr, flush=True))


if __name__ == "__main__":
    main()
