"""The shipped tasks behave as before issue 51's episode contract: the standard short jobs of
tests/test_gpu_emulation.py (2 steps on CPU, seed 0; ``scripts/behaviour_snapshot.py``'s ``STANDARD``) log the same
metrics and end with the same policy weights with this tree's code as with the code of commit 6bcc2f3 (the last
before the contract), both run here: floats computed on CPU are compared exactly, and they differ between CPUs, so
the reference is made on the machine that checks it (the commit's files from ``git archive``)."""
from __future__ import annotations

import subprocess
import tarfile
from concurrent.futures import ThreadPoolExecutor
from io import BytesIO
from pathlib import Path

import pytest

from scripts.behaviour_snapshot import STANDARD, differences, snapshot

ROOT = Path(__file__).resolve().parents[1]
BEFORE_THE_CONTRACT = "6bcc2f3"


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_standard_jobs_behave_as_before_the_episode_contract(tmp_path):
    archive = subprocess.run(["git", "archive", "--format=tar", BEFORE_THE_CONTRACT], cwd=ROOT, capture_output=True)
    if archive.returncode != 0:
        pytest.skip(f"commit {BEFORE_THE_CONTRACT} is not in this clone (a shallow clone?): {archive.stderr[:200]!r}")
    before = tmp_path / "before"
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(before, filter="data")
    names = list(STANDARD)
    with ThreadPoolExecutor(2) as pool:  # the two trees side by side, one thread each (the jobs set OMP_NUM_THREADS=1)
        before_run = pool.submit(snapshot, STANDARD, names, root=before, cache_dir=tmp_path / "cache-before")
        now_run = pool.submit(snapshot, STANDARD, names, cache_dir=tmp_path / "cache-now")
        expected, got = before_run.result(), now_run.result()
    assert sorted(expected) == sorted(got) == sorted(names)
    assert differences(expected, got) == []
