"""What docs/extending.md promises of a new estimator: one file in ``lit_credit/credit/``, one config
``conf/credit/<name>.yaml`` and one test, and everything else follows. A copied estimator, its config and its own
test are written, as a researcher would write them, into a temporary copy of the tree (the real tree is never
touched), and reached there through the doors users use: ``lit-credit credit=<name>``, then the whole
estimator-generic part of the suite (the registry, every config, the fuzz, the benchmarks' references and cases,
the config/registry tie, the import layers) with nothing else edited."""
from __future__ import annotations

import csv
import os
import re
import shutil
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
THIS = "tests/credit/test_extending.py::test_a_new_estimator_is_one_file_one_config_and_one_test"
# Every test file whose checks reach every registered estimator or every conf/ file, run whole in the copy.
GENERIC = ["tests/credit/test_registry.py", "tests/test_configs.py", "tests/test_fuzz.py",
           "tests/test_benchmark_references.py", "tests/benchmarks/test_credit_quality.py",
           "tests/credit/test_extending.py", "tests/test_layering.py",
           "tests/methods/test_grpo_updates.py::test_grpo_yaml_holds_the_default_every_method_inherits"]

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
# Its own test, as docs/extending.md section 3 asks: numbers derived by hand, the error of a bad input.
TEST = f'''"""{NAME}: A_i = scale * (R_i - mean_G R), by hand."""
from __future__ import annotations

import pytest
import torch

from lit_credit.credit import registry
from lit_credit.credit.{NAME} import ThrowawayCredit
from lit_credit.types import RolloutBatch


def batch(scores: list[float], groups: list[int]) -> RolloutBatch:
    b, t = len(scores), 3
    mask = torch.tensor([[0.0, 1.0, 1.0]] * b)
    return RolloutBatch(input_ids=torch.zeros(b, t, dtype=torch.long), attention_mask=torch.ones(b, t, dtype=torch.long),
                        response_mask=mask, turn_ids=torch.zeros(b, t, dtype=torch.long),
                        group_ids=torch.tensor(groups), behaviour_logprobs=torch.zeros(b, t),
                        scores=torch.tensor(scores, dtype=torch.float))


def test_centred_scores_by_hand():
    # Group 0: R = (1, 0, 0, 1), mean 1/2, so A = scale * (+1/2, -1/2, -1/2, +1/2) = (+1, -1, -1, +1) at scale 2.
    # Group 1: R = (3, 1), mean 2: A = 2 * (+1, -1) = (+2, -2). Group 2 is a single rollout: 0.
    out = ThrowawayCredit(scale=2.0)(batch([1, 0, 0, 1, 3, 1, 5], [0, 0, 0, 0, 1, 1, 2]))
    expected = torch.tensor([1.0, -1.0, -1.0, 1.0, 2.0, -2.0, 0.0])
    torch.testing.assert_close(out.parts["rollout"], expected)
    torch.testing.assert_close(out.advantages, expected[:, None] * torch.tensor([0.0, 1.0, 1.0]))
    assert out.metrics["credit/throwaway_scale"] == 2.0


def test_is_registered_and_checks_its_input():
    assert registry.get("{NAME}") is ThrowawayCredit
    with pytest.raises(ValueError, match=r"batch.scores has 1 non-finite"):
        ThrowawayCredit()(batch([1.0, float("nan")], [0, 0]))
'''


def copy_tree(dest: Path) -> None:
    """The checkout as git sees it (tracked files and untracked ones it does not ignore), without .venv,
    outputs/, caches or anything else .gitignore names."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout
    for rel in filter(None, os.fsdecode(listed).split("\0")):
        if (ROOT / rel).is_file():  # a tracked file deleted in the working tree stays deleted
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_new_estimator_is_one_file_one_config_and_one_test(tmp_path, cache_dir):
    tree = tmp_path / "tree"
    copy_tree(tree)
    written = {tree / "lit_credit" / "credit" / f"{NAME}.py": ESTIMATOR,
               tree / "conf" / "credit" / f"{NAME}.yaml": CONFIG,
               tree / "tests" / "credit" / f"test_{NAME}.py": TEST}
    for path, text in written.items():
        assert not path.exists(), f"{path.relative_to(tree)} is in the tree already"
        path.write_text(text)
    # The copy's lit_credit shadows the editable install of this checkout (PYTHONPATH and cwd both name it); the
    # test cache is shared, so the embedded warm start is built once.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(tree),
           "LIT_CREDIT_TEST_CACHE": str(cache_dir)}
    seen = run([sys.executable, "-c", "import lit_credit, lit_credit.credit as c; print(lit_credit.__file__); "
                f"print('{NAME}' in c.available())"], tree, env).stdout.split()
    assert seen == [str(tree / "lit_credit" / "__init__.py"), "True"], seen
    # 1. Trained by name through the entry point: the override reaches the estimator (its own metric logs 0.5).
    run([sys.executable, "-m", "lit_credit.train", "experiment=grpo_arith", f"credit={NAME}", "credit.scale=0.5",
         *FAST_TASK, *FAST_MODEL, "trainer.max_steps=2", "trainer.val_check_interval=2", "data.prompts_per_step=4",
         "data.sampling.n=4", "data.val_prompts=4", "callbacks=none", "logger=csv", f"paths.cache_dir={cache_dir}",
         f"hydra.run.dir={tmp_path / 'run'}"], tree, env)
    with open(tmp_path / "run" / "csv" / "metrics.csv") as f:
        logged = [row["credit/throwaway_scale"] for row in csv.DictReader(f) if row.get("credit/throwaway_scale")]
    assert logged and {float(v) for v in logged} == {0.5}
    # 2. The estimator-generic files, whole, and its own test pass in the copy (the suite's default markers: every
    # test of these files but this one, which is the only slow one).
    shown = run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "--deselect", THIS, *GENERIC,
                 f"tests/credit/test_{NAME}.py"], tree, env, timeout=1500)
    outcomes = re.findall(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)", shown.stdout, re.MULTILINE)
    assert THIS not in {test for test, _ in outcomes}
    about_it = [(test, outcome) for test, outcome in outcomes if NAME in test]
    assert all(outcome == "PASSED" for _, outcome in about_it), about_it
    own = [test for test, _ in about_it if test.startswith(f"tests/credit/test_{NAME}.py::")]
    ids = [test for test, _ in about_it if not test.startswith(f"tests/credit/test_{NAME}.py::")]
    assert len(own) == 2, shown.stdout[-3000:]
    # its registry build-and-run and Hydra = LightningCLI, the fuzz, the loop reference at 3 seeds, its config
    # composed and instantiated, the config tie
    assert len(ids) >= 8, ids


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
