"""The embedded policy's warm start by criterion (``model.embedded.sft_target``): SFT until greedy decoding
reproduces a fraction of training demonstrations, the same behaviour on every CPU, not a step count."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lit_credit.models import EmbeddedPolicy
from lit_credit.models.embedded import CHECK_ROWS
from lit_credit.models.sft import greedy_exact
from lit_credit.tasks import ArithTask

ROOT = Path(__file__).resolve().parents[2]


class FixedLogits(torch.nn.Module):
    """Returns the same logits whatever the input (a model whose argmax the test chooses)."""

    def __init__(self, argmax: list[list[int]], vocab: int = 10) -> None:
        super().__init__()
        self.logits = torch.nn.functional.one_hot(torch.tensor(argmax), vocab).float()

    def forward(self, input_ids, attention_mask):
        return SimpleNamespace(logits=self.logits)


def test_greedy_exact_is_every_scored_token_the_argmax_before_it():
    # ids 5 1 2 3 with the last two scored (mask 0 0 1 1): the logits at positions 1, 2 must pick 2, 3; the
    # prediction at position 0 (of the unscored 1) and the one after the last token never count.
    batch = {"input_ids": torch.tensor([[5, 1, 2, 3]] * 3), "attention_mask": torch.ones(3, 4, dtype=torch.long),
             "loss_mask": torch.tensor([[0, 0, 1, 1]] * 3)}
    model = FixedLogits([[9, 2, 3, 0],    # unscored miss at 0: reproduced
                         [1, 2, 4, 0],    # the last scored token wrong: not
                         [1, 7, 3, 3]])   # the first scored token wrong: not
    assert greedy_exact(model, batch).tolist() == [True, False, False]


def test_sft_target_stops_at_the_first_check_that_reaches_it_and_saves_that_model(tmp_path):
    task = ArithTask(max_operand=9, ops="+-", num_test=40)
    # Checked every 25 steps; at step 25 the standard recipe already reproduces ~7 % (the digits' most common
    # answers), so a target of 0.03 stops there and not later.
    embedded = EmbeddedPolicy(task, cache_dir=str(tmp_path), sft_target=0.03, sft_check_every=25, sft_steps=400)
    path = embedded.build()
    record = json.loads((path / "recipe.json").read_text())
    assert record["sft_stopped_at"] == 25 and [step for step, _ in record["sft_checks"]] == [25]
    reached = record["sft_checks"][0][1]
    assert reached >= 0.03
    # The saved model is the one checked: the same rows score the same fraction (CHECK_ROWS of them).
    rerun = subprocess.run([sys.executable, "-c", CHECK, str(path), "train-demos"], capture_output=True, text=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=ROOT, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert json.loads(rerun.stdout.splitlines()[-1])["train-demos"] == pytest.approx(reached, abs=1 / CHECK_ROWS)
    # Another target is another recipe, and a fixed-step recipe keeps its directory (no sft_target keys in it).
    assert EmbeddedPolicy(task, cache_dir=str(tmp_path), sft_target=0.5).path != path
    assert "sft_target" not in EmbeddedPolicy(task, cache_dir=str(tmp_path)).recipe


def test_an_unreached_sft_target_fails_by_name_with_its_best_check(tmp_path):
    embedded = EmbeddedPolicy(ArithTask(max_operand=9, num_test=20), cache_dir=str(tmp_path), hidden_size=32,
                              num_layers=1, sft_target=1.0, sft_check_every=5, sft_steps=10)
    with pytest.raises(RuntimeError, match=r"did not reach model\.embedded\.sft_target=1\.0 .* in "
                                           r"model\.embedded\.sft_steps=10 steps \(best 0\.\d+ at step (5|10)\); "
                                           r"fix: raise model\.embedded\.sft_steps or lower"):
        embedded.build()
    assert not embedded.built and not list(Path(tmp_path).rglob("config.json"))  # nothing half-built left


@pytest.mark.parametrize("bad, match", [({"sft_target": -0.1}, r"sft_target=-0\.1 must be in \(0, 1\]"),
                                         ({"sft_target": 1.5}, r"sft_target=1\.5 must be in \(0, 1\]"),
                                         ({"sft_check_every": 0}, r"sft_check_every=0 must be >= 1")])
def test_bad_warm_start_settings_are_refused_by_name(bad, match):
    with pytest.raises(ValueError, match=match):
        EmbeddedPolicy(ArithTask(max_operand=9, num_test=20), **bad)


# Builds the make-run warm start in a fresh process and prints its greedy exact match on the training and
# held-out problems of experiment=grpo_arith (and on the CHECK_ROWS training demonstrations).
CHECK = """
import json, sys
import torch
from pathlib import Path
from transformers import AutoModelForCausalLM, AutoTokenizer
from lit_credit.models.chat import ChatCodec
from lit_credit.models.embedded import CHECK_ROWS
from lit_credit.models.sft import collate_demonstrations, encode_demonstration, greedy_exact
from lit_credit.tasks import ArithTask
path = Path(sys.argv[1])
task = ArithTask(max_operand=9, ops="+-", num_test=40, seed=0)
tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path).eval()
codec = ChatCodec(tok, tool_prompt=task.tool_prompt)
def exact(demos):
    rows = [encode_demonstration(codec, d) for d in demos]
    with torch.no_grad():
        return greedy_exact(model, collate_demonstrations(rows, codec.pad_id)).float().mean().item()
split = lambda name: [{"messages": [*r["prompt"], {"role": "assistant", "content": r["answer"]}]}
                      for r in task.dataset(name)]
seed = json.loads((path / "recipe.json").read_text())["seed"]
print(json.dumps({"train": exact(split("train")), "test": exact(split("test")),
                  "train-demos": exact(task.demonstrations(CHECK_ROWS, seed=seed + 2))}))
"""

BUILD = """
import sys
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from lit_credit.train import CONF_DIR
with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
    cfg = compose("train", overrides=["experiment=grpo_arith", f"paths.cache_dir={sys.argv[1]}"])
print(instantiate(cfg.model.embedded).build())
"""


@pytest.mark.slow  # two builds of the make-run warm start, 1-4 minutes each
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("env", [{"OMP_NUM_THREADS": "1"}, {"OMP_NUM_THREADS": "2", "ATEN_CPU_CAPABILITY": "avx2"}],
                         ids=["1-thread", "2-threads-avx2-kernels"])
def test_the_make_run_warm_start_lands_in_the_pages_band_whatever_the_threads_and_kernels(env, tmp_path):
    """experiment=grpo_arith's warm start, built as `make run` builds it, with 1 thread, and with 2 threads on
    another CPU's vector kernels (ATEN_CPU_CAPABILITY=avx2: other rounding, as on a CPU without AVX-512, where the
    former 600-step recipe answered 7.5 % held-out): the criterion is met and the held-out start is in the band
    docs/experiments/grpo_arith.md describes (greedy 0.15-0.40 of the 40 held-out problems, training 0.50-0.80)."""
    run_env = {**os.environ, **env, "HF_HUB_OFFLINE": "1"}
    built = subprocess.run([sys.executable, "-c", BUILD, str(tmp_path)], capture_output=True, text=True, env=run_env,
                           cwd=ROOT, timeout=900)
    assert built.returncode == 0, built.stderr[-3000:]
    path = Path(built.stdout.splitlines()[-1])
    record = json.loads((path / "recipe.json").read_text())
    assert record["sft_checks"][-1] == [record["sft_stopped_at"], pytest.approx(record["sft_checks"][-1][1])]
    assert record["sft_checks"][-1][1] >= record["sft_target"]
    done = subprocess.run([sys.executable, "-c", CHECK, str(path)], capture_output=True, text=True, env=run_env,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert 0.50 <= got["train"] <= 0.80 and 0.15 <= got["test"] <= 0.40, got
