"""What docs/extending.md promises of a new estimator: one file in ``lit_credit/credit/``, one config
``conf/credit/<name>.yaml`` and one test, and everything else follows. A throwaway estimator is written into the
tree as a researcher would write it, then reached through the doors users use: ``lit-credit credit=<name>``,
``credit.get``, the estimator benchmark's cases and the loop-reference check, the config/registry tie."""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.utils import instantiate

from lit_credit import credit
from lit_credit.train import CONF_DIR
from tests.conftest import FAST_MODEL, FAST_TASK

ROOT = Path(__file__).resolve().parents[2]
NAME = "throwaway_mean_baseline"

# A_i = scale * (R_i - mean_G R) on rollout i's learnable tokens (0 for |G| < 2), and its loop reference: for
# rewards [1, 0, 0, 1] in one group, mean 0.5, A = scale * [+0.5, -0.5, -0.5, +0.5].
ESTIMATOR = f'''"""Throwaway test estimator: A_i = scale * (R_i - mean_G R) (0 for |G| < 2)."""
from __future__ import annotations

import torch

from lit_credit.credit.groups import group_stats
from lit_credit.credit.registry import CreditEstimator, check_batch, register
from lit_credit.credit.tokens import rollout_credit


def loop(batch, *, scale: float = 1.0):
    """The same formula as a per-rollout loop over Python floats."""
    ids, scores = batch.group_ids.tolist(), batch.scores.tolist()
    members = {{}}
    for g, r in zip(ids, scores):
        members.setdefault(g, []).append(r)
    out = torch.zeros_like(batch.response_mask, dtype=torch.float32)
    for i, (g, r) in enumerate(zip(ids, scores)):
        rs = members[g]
        a = scale * (r - sum(rs) / len(rs)) if len(rs) >= 2 else 0.0
        out[i] = torch.where(batch.response_mask[i].bool(), a, 0.0)
    return out


@register("{NAME}", loop_reference=loop)
class ThrowawayCredit(CreditEstimator):
    """A_i = scale * (R_i - mean_G R)."""

    def __init__(self, *, scale: float = 1.0) -> None:
        self.scale = scale

    def __call__(self, batch):
        check_batch(batch, {{"batch.scores": batch.scores}})
        centred, _, count = group_stats(batch.scores, batch.group_ids)
        out = rollout_credit(torch.where(count >= 2, self.scale * centred, 0), batch.response_mask, batch.group_ids)
        out.metrics["credit/throwaway_scale"] = float(self.scale)
        return out
'''
CONFIG = f"_target_: lit_credit.credit.{NAME}.ThrowawayCredit\nscale: 1.0\n"


@pytest.fixture
def throwaway():
    """The estimator file and its config in the tree for the test's duration (removed after, whatever happens)."""
    files = {ROOT / "lit_credit" / "credit" / f"{NAME}.py": ESTIMATOR, CONF_DIR / "credit" / f"{NAME}.yaml": CONFIG}
    assert not any(path.exists() for path in files), "a throwaway file of an earlier run is left in the tree"
    try:
        for path, text in files.items():
            path.write_text(text)
        yield files
    finally:
        for path in files:
            path.unlink(missing_ok=True)


def run(cmd: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_a_new_estimator_is_one_file_one_config_and_one_test(throwaway, tmp_path, cache_dir):
    # 1. Trained by name through the entry point: the override reaches the estimator (its own metric logs 0.5).
    bin_dir = Path(sys.executable).parent
    run([str(bin_dir / "lit-credit"), "experiment=grpo_arith", f"credit={NAME}", "credit.scale=0.5", *FAST_TASK,
         *FAST_MODEL, "trainer.max_steps=2", "trainer.val_check_interval=2", "data.prompts_per_step=4",
         "data.sampling.n=4", "data.val_prompts=4", "callbacks=none", "logger=csv",
         f"paths.cache_dir={cache_dir}", f"hydra.run.dir={tmp_path / 'run'}"])
    with open(tmp_path / "run" / "csv" / "metrics.csv") as f:
        logged = [row["credit/throwaway_scale"] for row in csv.DictReader(f) if row.get("credit/throwaway_scale")]
    assert logged and {float(v) for v in logged} == {0.5}
    # 2. The project's own checks pick it up without an edit elsewhere: registered by name, a benchmark case with
    # its defaults, its loop reference equal to it on the synthetic batches, its config tied to its name; and every
    # test of those files passes with it in the tree (those over the whole registry too, not only its own).
    checks = ["tests/test_benchmark_references.py", "tests/credit/test_registry.py", "tests/test_fuzz.py",
              "tests/credit/test_extending.py::test_every_credit_config_is_its_registered_estimator"]
    shown = run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", *checks])
    passed = [line for line in shown.stdout.splitlines() if NAME in line and "PASSED" in line]
    # the loop reference at 3 seeds, the registry's build-and-run and Hydra = LightningCLI, the fuzz, the config tie
    assert len(passed) >= 7, shown.stdout[-3000:]
    assert "SKIPPED" not in shown.stdout and "FAILED" not in shown.stdout


@pytest.mark.parametrize("path", sorted((CONF_DIR / "credit").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_credit_config_is_its_registered_estimator(path, make_cfg):
    # conf/credit/<name>.yaml builds exactly the class registered as <name>: one name for both.
    built = instantiate(make_cfg(f"credit={path.stem}").credit)
    assert type(built) is credit.get(path.stem)
    assert credit.name_of(type(built)) == path.stem


def test_every_registered_estimator_has_its_config():
    assert sorted(p.stem for p in (CONF_DIR / "credit").glob("*.yaml")) == credit.available()


def test_a_registration_without_a_loop_reference_says_why(monkeypatch):
    from benchmarks import loop_reference
    from lit_credit.credit import registry
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))

    @credit.register("no_loop", without_loop_reference="sampling-based, no closed form to loop over")
    class NoLoop(credit.CreditEstimator):
        def __call__(self, batch):
            raise NotImplementedError

    @credit.register("silent")
    class Silent(credit.CreditEstimator):
        def __call__(self, batch):
            raise NotImplementedError

    assert loop_reference.reference_of("no_loop") is None
    with pytest.raises(KeyError, match=r"'silent' has no loop reference; fix: register it with "
                                       r"@register\('silent', loop_reference=fn\)"):
        loop_reference.reference_of("silent")
    with pytest.raises(ValueError, match="not both"):
        credit.register("both", loop_reference=len, without_loop_reference="x")
    with pytest.raises(ValueError, match="must be a Python identifier"):
        credit.register("my-credit")
