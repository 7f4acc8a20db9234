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

from benchmarks.machine import ground_truth_main
from lit_credit.analysis import credit_quality


def main(argv: list[str] | None = None) -> dict:
    return ground_truth_main("credit_quality", credit_quality, __doc__, argv,
                             "how many groups each family draws (small: seconds, full: the documented run)",
                             "seed of every draw (rows, kinds, noise, actions)")


if __name__ == "__main__":
    main()
