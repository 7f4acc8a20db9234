"""Reduce a per-token loss ``[B, T]`` to the scalar that is back-propagated.

The four modes are the ones GRPO, Dr.GRPO, DAPO and GSPO compare (verl's ``loss_agg_mode`` names).
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

AggregationMode = Literal[
    "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]
AGGREGATION_MODES: tuple[str, ...] = get_args(AggregationMode)


def _safe_div(num: Tensor, den: Tensor) -> Tensor:
    """``num / den`` where ``den != 0``, else ``0`` (``num`` is already 0 there); never NaN."""
    ok = den != 0
    return torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)), torch.zeros_like(num))


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over the entries where ``mask != 0``, weighted by ``mask``; 0 where nothing is selected.

    ``masked_mean(x, m) = sum(x * m) / sum(m)`` (``0`` when ``sum(m) = 0``). Entries with ``mask == 0``
    never enter, even if ``x`` is NaN or inf there.

    Shape:
        x, mask: any shape, the same.
        output: scalar when ``dim`` is None, else ``x`` with ``dim`` reduced.
    """
    if x.shape != mask.shape:
        raise ValueError(f"masked_mean: x {tuple(x.shape)} and mask {tuple(mask.shape)} must have one shape")
    m = mask.to(x.dtype)
    num = torch.where(mask != 0, x * m, torch.zeros_like(x))
    if dim is None:
        return _safe_div(num.sum(), m.sum())
    return _safe_div(num.sum(dim), m.sum(dim))


def aggregation_denominator(mask: Tensor, mode: AggregationMode = "token-mean", *,
                            norm_length: int | None = None) -> Tensor:
    """The normaliser :func:`aggregate` divides by in ``mode`` (``sum_i n_i``, ``B``, ``|P|`` or ``B * N``, see
    there), as a 0-dim float tensor. Several processes add theirs (an all-reduce) and pass the sum, divided by
    the number of processes, as ``denominator``: the mean of the ranks' losses (what DDP and FSDP average the
    gradients of) is then the loss of the whole minibatch."""
    m = (mask != 0).to(torch.float32)
    if mode == "token-mean":
        return m.sum()
    if mode == "seq-mean-token-mean":
        return m.any(-1).float().sum()
    rows = torch.tensor(float(mask.shape[0]), device=mask.device)
    if mode == "seq-mean-token-sum-norm":
        return rows * (mask.shape[-1] if norm_length is None else norm_length)
    return rows


def aggregate(
    loss: Tensor, mask: Tensor, mode: AggregationMode = "token-mean", *, norm_length: int | None = None,
    denominator: Tensor | None = None,
) -> Tensor:
    r"""Aggregate a per-token loss into a scalar.

    With ``m`` the mask, ``B`` rows, ``n_i = sum_t m_{i,t}`` and ``S_i = sum_t m_{i,t} l_{i,t}``:

    - ``token-mean`` (GRPO in verl, DAPO):   ``L = sum_i S_i / sum_i n_i``
      (every token of the batch weighs the same).
    - ``seq-mean-token-sum``:                ``L = (1/B) sum_i S_i``.
    - ``seq-mean-token-mean`` (original GRPO, GSPO): ``L = (1/|P|) sum_{i in P} S_i / n_i`` with
      ``P = {i : n_i > 0}``; a row without a learnable token is undefined for a per-row mean, so it is
      left out of the mean (it neither contributes nor counts).
    - ``seq-mean-token-sum-norm`` (Dr.GRPO): ``L = (1/B) sum_i S_i / N`` with the constant
      ``N = norm_length`` (default ``T = mask.shape[-1]``). Dr.GRPO's point is that ``N`` is a constant:
      set ``norm_length`` to the maximum response length so it does not vary with the batch's padding.

    ``denominator``: divide the same numerator by this normaliser instead of the batch's own
    (:func:`aggregation_denominator`; several processes pass the whole minibatch's); 0 gives 0.

    In the sum modes an empty row contributes 0 and still counts in ``B`` (constant normaliser).
    Every division is guarded: an all-zero mask gives an exact, finite 0 (with zero gradient) in every
    mode, never NaN. Masked entries never enter, even when ``loss`` is NaN/inf there. ``mask`` may be
    bool, int or float (float masks weight tokens).

    Shape:
        loss: [B, T]
        mask: [B, T], 1/True on learnable tokens.
        output: scalar (0-dim), dtype of ``loss``.

    Raises:
        ValueError: unknown ``mode`` (the message lists the valid ones), shape mismatch, or
            ``norm_length <= 0``.
    """
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; valid modes: {', '.join(AGGREGATION_MODES)}")
    if loss.dim() != 2 or loss.shape != mask.shape:
        raise ValueError(
            f"aggregate: loss {tuple(loss.shape)} and mask {tuple(mask.shape)} must both be [B, T]"
        )
    m = mask.to(loss.dtype)
    weighted = torch.where(mask != 0, loss * m, torch.zeros_like(loss))
    if denominator is not None:
        if mode == "seq-mean-token-mean":
            present = (mask != 0).any(-1).to(loss.dtype)
            weighted = (_safe_div(weighted.sum(-1), m.sum(-1)) * present)
        return _safe_div(weighted.sum(), denominator.to(loss.dtype))
    if mode == "token-mean":
        return _safe_div(weighted.sum(), m.sum())
    n_rows = max(loss.shape[0], 1)
    row_sum = weighted.sum(-1)  # S_i, [B]
    if mode == "seq-mean-token-sum":
        return row_sum.sum() / n_rows
    if mode == "seq-mean-token-sum-norm":
        length = mask.shape[-1] if norm_length is None else norm_length
        if length <= 0:
            raise ValueError(f"norm_length must be a positive int, got {length}")
        return row_sum.sum() / (n_rows * length)
    # seq-mean-token-mean
    present = (mask != 0).any(-1).to(loss.dtype)  # [B]
    row_mean = _safe_div(row_sum, m.sum(-1))
    return _safe_div((row_mean * present).sum(), present.sum())
