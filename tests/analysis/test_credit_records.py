"""Credit records, the leakage metric, atomic shards and their loader (issue #7), on hand-made batches."""
from __future__ import annotations

import math
from types import SimpleNamespace

import datasets
import pandas as pd
import pytest
import torch
import yaml

from callbacks import CreditRecords
from lit_credit.analysis import credit_leakage, credit_records, write_shard
from lit_credit.analysis.load import load_records
from lit_credit.credit import grpo_advantages, slca_advantages
from lit_credit.types import CreditTrace
from tests.credit.common import make_batch


def tool_batch():
    """Two rollouts of one group: [prompt, tool turn (2 tokens), response, summary (1 token)] and a rollout
    that answered directly: [prompt, summary (3 tokens)]."""
    turn_ids = torch.tensor([[-1, 0, 0, -1, 1], [-1, 0, 0, 0, -1]])
    parts = {"process": torch.tensor([0.9, 0.5]), "summary": torch.tensor([0.25, 0.75])}
    turns = {"tool_scores": torch.tensor([[1.0, 0.0], [0.0, 0.0]]),
             "tool_turn_mask": torch.tensor([[1.0, 0.0], [0, 0]])}
    batch = make_batch((turn_ids >= 0).float(), torch.tensor([7, 7]), torch.tensor([1.15, 1.25]), turn_ids=turn_ids,
                       reward_parts=parts, turn_parts=turns)
    batch.metadata = [{"replies": ["<tool_call>{...}</tool_call>", "It is sunny."]}, {"replies": ["Paris."]}]
    return batch


def test_records_one_row_per_rollout_and_turn_by_hand():
    batch = tool_batch()
    adv = torch.tensor([[0.0, 1.0, 3.0, 0.0, -2.0], [0.0, 0.5, 0.5, 0.5, 0.0]])
    df = credit_records(CreditTrace("policy", batch, adv), step=3, method="slca", excerpt_chars=10)
    assert df[["rollout", "turn", "segment", "tokens"]].values.tolist() == [
        [0, 0, "tool", 2], [0, 1, "summary", 1], [1, 0, "summary", 3]]  # one run: the summary (SLCA's rule)
    # Rollout 0's tool turn: tokens 1.0 and 3.0 -> mean 2, min 1, max 3; its summary -2; rollout 1: 0.5.
    assert df["advantage"].tolist() == [2.0, -2.0, 0.5]
    assert df[["advantage_min", "advantage_max"]].values.tolist() == [[1.0, 3.0], [-2.0, -2.0], [0.5, 0.5]]
    # Only rollout 0's turn 0 has a tool-turn score: 1.0 after the best-so-far 0 -> improve.
    assert df["turn_type"].tolist() == ["improve", "", ""] and df["turn_score"].iloc[0] == 1.0
    assert math.isnan(df["turn_score"].iloc[1]) and df["case"].tolist() == ["", "", ""]
    assert df["excerpt"].tolist() == ["<tool_call", "It is sunn", "Paris."]
    assert (df["step"] == 3).all() and (df["method"] == "slca").all() and (df["group"] == 7).all()
    assert df["reward/summary"].tolist() == [0.25, 0.25, 0.75]
    assert not any(c.startswith("extra/") or c == "reward/tool_scores" for c in df)  # no extras nor turn lists


def test_extras_are_written_as_extras_never_as_reward_parts():
    # A DPA approver batch: the rarity weight and the REVISE bonus are batch.extras ([B]), not rewards; TCPO's
    # [B, K, M] alternatives are not one value per rollout and are not written.
    turn_ids = torch.tensor([[-1, 0], [-1, 0]])
    extras = {"weight": torch.tensor([2.0, 0.5]), "adv_bonus": torch.tensor([0.0, 0.5]),
              "alt_scores": torch.zeros(2, 1, 3)}
    batch = make_batch((turn_ids >= 0).float(), torch.tensor([0, 0]), torch.tensor([1.0, -0.25]),
                       turn_ids=turn_ids, extras=extras)
    adv = torch.tensor([[0.0, 1.0], [0.0, -1.0]])
    df = credit_records(CreditTrace("approver", batch, adv), step=1, method="dpa")
    assert df["extra/weight"].tolist() == [2.0, 0.5] and df["extra/adv_bonus"].tolist() == [0.0, 0.5]
    assert not any(c.startswith("reward/") for c in df) and "extra/alt_scores" not in df


def test_dpa_cases_and_non_tool_tasks():
    turn_ids = torch.tensor([[-1, 0], [-1, 0]])
    batch = make_batch((turn_ids >= 0).float(), torch.tensor([0, 0]), torch.tensor([1.0, -1.0]), turn_ids=turn_ids)
    df = credit_records(CreditTrace("verifier", batch, torch.tensor([[0.0, 1.0], [0.0, -1.0]]),
                                    cases=torch.tensor([6, 6])), step=2, method="dpa")
    assert df["case"].tolist() == ["6a", "6a"] and df["segment"].tolist() == ["turn", "turn"]
    assert df["source"].tolist() == ["verifier", "verifier"] and df["advantage"].tolist() == [1.0, -1.0]


def test_leakage_is_high_under_grpo_and_zero_when_tool_credit_ignores_the_summary():
    # Four rollouts, each a tool turn then a summary; process [0.5, 0.5, 1, 1], summary [0, 1, 0, 1].
    turn_ids = torch.tensor([[-1, 0, -1, 1]] * 4)
    mask = (turn_ids >= 0).float()
    process, summary = torch.tensor([0.5, 0.5, 1.0, 1.0]), torch.tensor([0.0, 1.0, 0.0, 1.0])
    group = torch.zeros(4, dtype=torch.long)
    batch = make_batch(mask, group, process + summary, turn_ids=turn_ids,
                       reward_parts={"process": process, "summary": summary})
    # GRPO: tool advantage = Norm(process + summary), an increasing affine map of [0.5, 1.5, 1, 2], so the
    # correlation is that of the raw values: centred y = [-.75, .25, -.25, .75], x = [-.5, .5, -.5, .5];
    # sum xy = 1.0, sum x^2 = 1, sum y^2 = 1.25 -> 1 / sqrt(1.25) = 0.8944.
    grpo = grpo_advantages(process + summary, mask, group).advantages
    assert credit_leakage(batch, grpo) == pytest.approx(1 / math.sqrt(1.25))
    # SLCA: tool advantage = Norm(process), uncorrelated with the summary score -> 0.
    slca = slca_advantages(process, summary, mask, group).advantages
    assert credit_leakage(batch, slca) == pytest.approx(0.0, abs=1e-9)
    assert math.isnan(credit_leakage(make_batch(mask, group, process, turn_ids=turn_ids), slca))  # no summary


def test_shards_are_atomic_and_readable_by_pandas_datasets_and_the_loader(tmp_path):
    batch = tool_batch()
    frame = credit_records(CreditTrace("policy", batch, torch.ones(2, 5) * (batch.response_mask > 0)), step=1,
                           method="grpo")
    runs = tmp_path / "sweep"
    for i, credit in enumerate(["grpo", "slca"]):
        run = runs / str(i)
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"credit={credit}", "seed=0"]))
        path = write_shard(frame, run / "records", "step-0000001")
        assert path.name == "step-0000001.parquet" and [p.name for p in path.parent.iterdir()] == [path.name]
    assert pd.read_parquet(path).equals(frame)
    ds = datasets.load_dataset("parquet", data_files=str(runs / "*" / "records" / "*.parquet"), split="train")
    assert len(ds) == 2 * len(frame) and "advantage" in ds.column_names
    df = load_records(runs)
    assert sorted(df["run"].unique()) == ["0", "1"] and sorted(df["credit"].unique()) == ["grpo", "slca"]
    assert len(load_records(runs / "0")) == len(frame) and (load_records(runs / "0")["run"] == ".").all()
    with pytest.raises(FileNotFoundError, match="no credit records"):
        load_records(tmp_path / "empty")


def test_callback_writes_every_n_batches_and_stops_at_max_rows(tmp_path):
    # tool_batch has 3 (rollout, turn) rows; every 2 batches, at most 4 rows in the run: batch 0 writes 3,
    # batch 2 writes the 1 row left, batch 4 nothing.
    callback = CreditRecords(str(tmp_path / "records"), every_n_steps=2, max_rows=4, histograms=False)
    module = SimpleNamespace(credit_trace=[CreditTrace("policy", tool_batch(), torch.ones(2, 5))],
                             credit=SimpleNamespace())
    for batch_idx in range(6):
        trainer = SimpleNamespace(global_step=batch_idx + 1, is_global_zero=True, loggers=[],
                                  fit_loop=SimpleNamespace(total_batch_idx=batch_idx))
        callback.on_train_batch_end(trainer, module, None, None, batch_idx)
    shards = sorted(p.name for p in (tmp_path / "records").iterdir())
    assert shards == ["step-0000001.parquet", "step-0000003.parquet"]
    assert [len(pd.read_parquet(tmp_path / "records" / s)) for s in shards] == [3, 1]
    assert callback.state_dict() == {"rows_written": 4}
    with pytest.raises(ValueError, match="every_n_steps"):
        CreditRecords(str(tmp_path), every_n_steps=0)
