"""Loop reference implementations and hypothesis strategies shared by the credit tests.

The references are deliberately naive (Python loops over groups, rollouts and tokens, double precision)
so the vectorised library code is checked against a second, independent reading of docs/methods.md.
"""

import statistics

import torch
from hypothesis import settings
from hypothesis import strategies as st

from lit_credit.types import RolloutBatch

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-10, atol=1e-10)}
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
PROPS = settings(max_examples=40, deadline=None)


def t(values, dtype=torch.float64):
    return torch.tensor(values, dtype=dtype)


def ids(values):
    return torch.tensor(values, dtype=torch.long)


def make_batch(response_mask, group_ids, scores, **fields) -> RolloutBatch:
    """A RolloutBatch around the fields credit reads; token ids, attention and log-probs are filler."""
    b, n_tok = response_mask.shape
    fields.setdefault("turn_ids", torch.full((b, n_tok), -1))
    fields.setdefault("behaviour_logprobs", torch.zeros(b, n_tok))
    return RolloutBatch(
        input_ids=torch.zeros(b, n_tok, dtype=torch.long),
        attention_mask=torch.ones(b, n_tok, dtype=torch.long),
        response_mask=response_mask,
        group_ids=group_ids,
        scores=scores,
        **fields,
    )


def ref_group_normalize(scores, group_ids, present=None, *, eps=1e-6, norm_by_std=True):
    """Norm over the present rollouts of each group (Bessel std), 0 if fewer than 2 or absent."""
    scores, group_ids = list(map(float, scores)), list(map(int, group_ids))
    present = [True] * len(scores) if present is None else list(map(bool, present))
    out = [0.0] * len(scores)
    for g in set(group_ids):
        idx = [i for i, h in enumerate(group_ids) if h == g and present[i]]
        if len(idx) < 2:
            continue
        vals = [scores[i] for i in idx]
        mean, std = statistics.fmean(vals), statistics.stdev(vals)
        for i in idx:
            out[i] = (scores[i] - mean) / (std + eps) if norm_by_std else scores[i] - mean
    return torch.tensor(out, dtype=torch.float64)


def ref_runs(row):
    """Run index (0-based) of each learnable token of one mask row, -1 elsewhere."""
    out, run, prev = [], -1, 0
    for m in map(int, row):
        if m and not prev:
            run += 1
        out.append(run if m else -1)
        prev = m
    return out, run + 1


# --- rollouts made of runs of learnable tokens ---------------------------------------------------------


@st.composite
def run_layouts(draw, max_b=8, max_runs=3, n_groups=3):
    """Per rollout: a group id and a list of (gap before, run length) pairs; gaps >= 1 between runs."""
    b = draw(st.integers(1, max_b))
    rows = []
    for _ in range(b):
        n = draw(st.integers(0, max_runs))
        rows.append([(draw(st.integers(0 if k == 0 else 1, 2)), draw(st.integers(1, 3))) for k in range(n)])
    return draw(st.lists(st.integers(0, n_groups - 1), min_size=b, max_size=b)), rows


def build_runs(rows, extra=None):
    """(response_mask [B, T] float, run index [B, T] long, -1 off the mask) from a layout.

    ``extra[i][k]`` more mask-0 tokens go before run k of rollout i (longer observations / prompt).
    """
    masks, runs = [], []
    for i, row in enumerate(rows):
        m, r = [], []
        for k, (gap, n) in enumerate(row):
            gap += extra[i][k] if extra else 0
            m += [0] * gap + [1] * n
            r += [-1] * gap + [k] * n
        masks.append(m)
        runs.append(r)
    width = max(map(len, masks), default=0) + 1  # at least one pad column
    mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.float32)
    run = torch.tensor([r + [-1] * (width - len(r)) for r in runs])
    return mask, run
