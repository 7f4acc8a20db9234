"""The loop references of ``benchmarks.loop_reference`` compute what the vectorised estimators compute, so
``python -m benchmarks.estimators`` compares like with like; and the synthetic batch it times is well formed."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import estimators as bench
from benchmarks import loop_reference as loop
from lit_credit import credit

CASES = {case.name: case for case in bench.cases()}


def test_every_registered_estimator_is_benchmarked():
    assert {case.estimator for case in CASES.values()} == set(credit.available())
    assert set(loop.REFERENCES) <= set(credit.available())  # no loop of an estimator that is gone
    for name in credit.available():  # a shipped estimator's loop is here, a new one's comes with its registration
        entry = credit.registration(name)
        assert loop.reference_of(name) is (loop.REFERENCES.get(name) or entry.loop_reference), name
        assert loop.reference_of(name) is not None or entry.without_loop_reference, name


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", list(CASES))
def test_loop_reference_equals_estimator(name, seed):
    # 6 groups of 8 (DPA: 24 pairs), up to 4 turns, ties and singleton presences come up at this size.
    case = CASES[name]
    why = credit.registration(case.estimator).without_loop_reference
    if why is not None:
        pytest.skip(f"{case.estimator} is registered without a loop reference: {why}")
    batch = case.prepare(bench.synthetic_batch(48, 40, seed=seed))
    want = case.make()(batch).advantages
    got = case.reference(batch)
    assert want.abs().sum() > 0  # the batch exercises the formula, not only the zero guards
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_counterfactual_inputs_change_tcpo():
    base = bench.synthetic_batch(48, 40, seed=3)
    plain, with_cf = (CASES[n].reference(CASES[n].prepare(base)) for n in ("tcpo", "tcpo+cf"))
    assert not torch.allclose(plain, with_cf)


def test_synthetic_batch_layout():
    b = bench.synthetic_batch(64, 48, seed=4)
    mask, turn = b.response_mask.bool(), b.turn_ids
    assert torch.equal(turn >= 0, mask)  # turn ids exactly on the policy tokens
    starts = mask & ~torch.cat([torch.zeros(64, 1, dtype=torch.bool), mask[:, :-1]], 1)
    assert torch.equal(starts.sum(1), b.turn_mask.sum(1))  # one run of tokens per reached turn
    assert torch.equal(b.turn_mask.long().cummin(1).values, b.turn_mask.long())  # reached turns: a prefix
    assert torch.equal(b.turn_parts["tool_turn_mask"].sum(1), b.turn_mask.sum(1) - 1.0)  # all but the last
    assert not mask[:, 0].any() and torch.equal(b.group_ids.unique_consecutive(return_counts=True)[1],
                                                torch.full((8,), 8))


def test_cli_writes_table_and_json(tmp_path, capsys):
    out = tmp_path / "estimators.json"
    report = bench.main(["--sizes", "16x32", "--repeats", "1", "--threads", "1", "--estimators", "grpo,slca",
                         "--loop-rows", "8", "--out", str(out)])
    table = capsys.readouterr().out
    assert "| grpo | 16 | 32 |" in table and "(8 rows)" in table
    saved = json.loads(out.read_text())
    assert saved["machine"]["torch_threads"] == 1 and saved["machine"]["torch"] == torch.__version__
    rows = saved["results"]
    assert [r["estimator"] for r in rows] == ["grpo", "slca"] == [r["estimator"] for r in report["results"]]
    assert all(r["loop_scaled"] and r["loop_rows"] == 8 and r["loop_max_abs_diff"] < 1e-5 for r in rows)
