"""Row-blocked token passes and the moment metrics they feed (lit_credit.credit.tokens).

The turn and segment estimators write their [B, T] output block by block (``row_blocks``); the result may
not depend on where the blocks fall, and the metrics built from moments must equal the token statistics.
"""

import pytest
import torch

from benchmarks.estimators import cases, synthetic_batch
from lit_credit.credit import tokens as token_passes
from lit_credit.credit import turns_to_tokens
from lit_credit.credit.slca import segments
from lit_credit.credit.tokens import (
    label_moments,
    merge_moments,
    moment_metrics,
    row_blocks,
    segment_moments,
    token_moments,
)

from .common import t


def test_row_blocks_cover_the_rows_once(monkeypatch):
    monkeypatch.setattr(token_passes, "BLOCK_TOKENS", 10)
    # T = 4: 10 // 4 = 2 rows per block -> [0:2], [2:4], [4:6] for B = 5 (the last slice is clipped)
    assert row_blocks(torch.Size([5, 4])) == [slice(0, 2), slice(2, 4), slice(4, 6)]
    # T longer than the budget: one row per block; T = 0: the budget in rows; B = 0: no block
    assert row_blocks(torch.Size([3, 50])) == [slice(0, 1), slice(1, 2), slice(2, 3)]
    assert row_blocks(torch.Size([12, 0])) == [slice(0, 10), slice(10, 20)]
    assert row_blocks(torch.Size([0, 4])) == []


def test_turns_to_tokens_on_mask_and_repeat_last():
    values = t([[0.5, -1.0]])
    turn_ids = torch.tensor([[-1, 0, 0, -1, 1, 1, 2, 3]])  # prompt, turn 0, feedback, turn 1, ids past K = 2
    on = torch.tensor([[1.0, 1, 0, 1, 1, 1, 1, 1]])
    # id -1 -> 0; off `on` (t = 2) -> 0; ids >= K -> 0, or the last turn's value with repeat_last
    assert turns_to_tokens(values, turn_ids, on).tolist() == [[0, 0.5, 0, 0, -1, -1, 0, 0]]
    assert turns_to_tokens(values, turn_ids, on.bool(), repeat_last=True).tolist() == [
        [0, 0.5, 0, 0, -1, -1, -1, -1]
    ]


def test_moments_by_hand():
    # segments: row 0 = 2 tokens of 1.0 and 1 token of -2.0, row 1 = 0 tokens of 9.0 (not counted)
    m = segment_moments(t([[1.0, -2.0], [9.0, 9.0]]), t([[2, 1], [0, 0]]))
    # N = 3, S1 = 2 - 2 = 0, S2 = 2 + 4 = 6, max |v| over counted = 2
    assert m.tolist() == [3, 0, 6, 2]
    # same tokens as a [B, T] tensor, 0 off the counted ones
    tokens = torch.tensor([[1.0, 1.0, -2.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert token_moments(tokens, 3).tolist() == [3, 0, 6, 2]
    metrics = moment_metrics(m)
    # mean 0, population std sqrt(6 / 3 - 0) = sqrt(2)
    assert metrics == {"credit/adv_mean": 0.0, "credit/adv_std": pytest.approx(2**0.5), "credit/adv_abs_max": 2.0}
    # union with one more token of 3: N 4, S1 3, S2 15, max 3 -> mean 0.75, std sqrt(15/4 - 0.5625)
    merged = moment_metrics(merge_moments(m, segment_moments(t([3.0]), t([1]))), "x/")
    assert merged == {"x/adv_mean": 0.75, "x/adv_std": pytest.approx((3.75 - 0.5625) ** 0.5), "x/adv_abs_max": 3}
    assert moment_metrics(token_moments(torch.zeros(2, 0), 0))["credit/adv_std"] == 0.0


def test_label_moments_by_hand():
    values = t([[0.5, -1.0], [2.0, 0.5]])
    labels = torch.tensor([[1, 2], [1, 0]])
    # label 0: [0.5]; label 1: [0.5, 2.0] -> S1 2.5, S2 4.25, max 2; label 2: [-1]; label 3: none
    assert label_moments(values, labels, 4).tolist() == [
        [1, 0.5, 0.25, 0.5],
        [2, 2.5, 4.25, 2.0],
        [1, -1.0, 1.0, 1.0],
        [0, 0, 0, 0],
    ]


def test_segments_counts_by_hand():
    mask = torch.tensor([[0, 1, 1, 0, 1, 1, 1, 0], [1, 0, 0, 0, 0, 0, 0, 0], [0] * 8, [1] * 8]).float()
    tool, summary, n_tool, n_sum = segments(mask)
    # row 0: runs [1, 3) tool and [4, 7) summary; row 1: one run = summary; row 2: none; row 3: one run
    assert n_tool.tolist() == [2, 0, 0, 0] and n_sum.tolist() == [3, 1, 0, 8]
    assert summary[0].nonzero().flatten().tolist() == [4, 5, 6] and tool[0].nonzero().flatten().tolist() == [1, 2]
    assert not summary[2].any() and not tool[1].any()


@pytest.mark.parametrize("block_tokens", [1, 37, 1 << 12])
def test_estimators_do_not_depend_on_the_blocks(monkeypatch, block_tokens):
    # one row per block, blocks of a few rows, and one block: the advantages are bitwise the same
    batch = synthetic_batch(24, 96, seed=3)
    whole = {case.name: case.make()(case.prepare(batch)) for case in cases()}
    monkeypatch.setattr(token_passes, "BLOCK_TOKENS", block_tokens)
    for case in cases():
        out = case.make()(case.prepare(batch))
        assert torch.equal(out.advantages, whole[case.name].advantages), case.name
        assert out.metrics == pytest.approx(whole[case.name].metrics, rel=1e-6, abs=1e-9), case.name


def test_token_metrics_equal_the_token_statistics():
    # credit/adv_* is the mean, population std and max |a| over the learnable tokens
    batch = synthetic_batch(32, 64, seed=4)
    for case in cases():
        out = case.make()(case.prepare(batch))
        a = out.advantages[batch.response_mask.bool()].double()
        want = {"credit/adv_mean": a.mean().item(), "credit/adv_std": a.std(correction=0).item(),
                "credit/adv_abs_max": a.abs().max().item()}
        got = {k: out.metrics[k] for k in want}
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6), case.name
