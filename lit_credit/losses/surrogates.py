"""Clipped policy-gradient surrogates: token-level PPO (GRPO, DAPO, Dr.GRPO) and sequence-level GSPO.

A surrogate maps log-probs and advantages to a per-token loss; :class:`~lit_credit.losses.PolicyLoss`
adds the KL term and aggregates. Masked tokens (``mask == 0``) are neutralised at the input: their
log-ratio and advantage are set to 0 before any non-linearity, so garbage there (padding, ``-inf``,
NaN) changes neither the loss nor the gradient, and their per-token loss is 0.
"""

from __future__ import annotations

import abc

import torch
from torch import Tensor

from lit_credit.losses.aggregate import _safe_div, masked_mean


def _check_same_shape(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    first = next(iter(shapes.values()))
    if len(first) != 2 or any(s != first for s in shapes.values()):
        raise ValueError(f"expected tensors of one shape [B, T], got {shapes}")


def _resolve_clip(clip_low: float, clip_high: float | None) -> tuple[float, float]:
    clip_low = float(clip_low)
    clip_high = clip_low if clip_high is None else float(clip_high)
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must be in [0, 1), got {clip_low}")
    if clip_high < 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}")
    return clip_low, clip_high


def _resolve_dual_clip(clip_ratio_c: float | None) -> float | None:
    if clip_ratio_c is None:
        return None
    if not float(clip_ratio_c) > 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (verl's 3.0) or None (no dual-clip), got {clip_ratio_c}")
    return float(clip_ratio_c)


def _clipped_objective(
    ratio: Tensor, adv: Tensor, clip_low: float, clip_high: float, clip_ratio_c: float | None = None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``loss = -min(r A, clip(r, 1-clip_low, 1+clip_high) A)``, where the clip binds, and where the dual clip
    ``loss = min(loss, -c A)`` on ``A < 0`` binds (``c = clip_ratio_c``; None when off)."""
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    loss = -torch.minimum(unclipped, clipped)
    dual = None
    if clip_ratio_c is not None:
        bound = -clip_ratio_c * adv
        dual = ((adv < 0) & (loss > bound)).detach()
        loss = torch.where(dual, bound, loss)  # a constant there: zero gradient
    return loss, (clipped < unclipped).detach(), dual


def _range_stats(values: Tensor, valid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Masked mean / min / max of ``values``; each is 1.0 (the neutral ratio) when nothing is valid."""
    any_valid = valid.any()
    one = torch.ones((), dtype=values.dtype, device=values.device)
    mean = torch.where(any_valid, masked_mean(values, valid), one)
    vmin = torch.where(any_valid, torch.where(valid, values, torch.inf).amin(), one)
    vmax = torch.where(any_valid, torch.where(valid, values, -torch.inf).amax(), one)
    return mean, vmin, vmax


def _clip_metrics(ratio: Tensor, clipped: Tensor, present: Tensor, log_ratio: Tensor, valid: Tensor,
                  dual: Tensor | None = None) -> dict[str, Tensor]:
    """Clip fractions and ratio range over the ``present`` entries (tokens or sequences), and the token
    mean of ``-log_ratio`` (k1 estimate of ``KL(pi_old || pi)``); ``clip_frac_dual`` where ``dual`` is
    given."""
    ratio_mean, ratio_min, ratio_max = _range_stats(ratio, present)
    metrics = {
        "clip_frac": masked_mean(clipped.to(ratio.dtype), present),
        "clip_frac_low": masked_mean((clipped & (ratio < 1.0)).to(ratio.dtype), present),
        "clip_frac_high": masked_mean((clipped & (ratio > 1.0)).to(ratio.dtype), present),
        "ratio_mean": ratio_mean,
        "ratio_min": ratio_min,
        "ratio_max": ratio_max,
        "ppo_kl": masked_mean(-log_ratio.detach(), valid),
    }
    if dual is not None:
        metrics["clip_frac_dual"] = masked_mean(dual.to(ratio.dtype), present)
    return metrics


class Surrogate(abc.ABC):
    """Base of the per-token policy-gradient surrogates used by :class:`PolicyLoss`.

    ``__call__(logp, old_logp, advantages, mask) -> (loss [B, T], metrics)`` where ``metrics`` maps short
    names (``clip_frac``, ``ratio_mean``, ...) to detached 0-dim tensors (``PolicyLoss`` turns them into
    floats with one device sync). ``loss`` is 0 wherever ``mask == 0``. ``clip_high=None`` means
    symmetric clipping (``clip_high = clip_low``). ``clip_ratio_c``: verl's dual-clip (None: off, the default;
    verl's default 3.0), see :class:`ClippedSurrogate`.
    """

    def __init__(self, clip_low: float = 0.2, clip_high: float | None = None,
                 clip_ratio_c: float | None = None) -> None:
        self.clip_low, self.clip_high = _resolve_clip(clip_low, clip_high)
        self.clip_ratio_c = _resolve_dual_clip(clip_ratio_c)

    def __repr__(self) -> str:
        dual = "" if self.clip_ratio_c is None else f", clip_ratio_c={self.clip_ratio_c}"
        return f"{type(self).__name__}(clip_low={self.clip_low}, clip_high={self.clip_high}{dual})"

    @abc.abstractmethod
    def __call__(
        self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        raise NotImplementedError


class ClippedSurrogate(Surrogate):
    r"""PPO clipped surrogate, per token (GRPO, Dr.GRPO, DAPO clip-higher).

    ``r_t = exp(logp_t - old_logp_t)``,
    ``loss_t = -min(r_t A_t, clip(r_t, 1 - clip_low, 1 + clip_high) A_t)``.

    ``clip_high=None`` means symmetric (``clip_high = clip_low``; GRPO 0.2). DAPO's clip-higher is
    ``clip_low=0.2, clip_high=0.28``. The gradient is 0 on a token where the clipped branch is the
    (strictly) smaller one: ``A > 0`` and ``r > 1 + clip_high``, or ``A < 0`` and ``r < 1 - clip_low``.
    Elsewhere ``d loss_t / d logp_t = -r_t A_t``.

    Dual-clip (``clip_ratio_c = c > 1``; verl's ``compute_policy_loss``, Ye et al. 2020; off by default):
    ``loss_t = min(loss_t, -c A_t)`` where ``A_t < 0``, so a negative-advantage token's loss is at most
    ``c |A_t|``: it binds where ``r_t > c`` (given ``c >= 1 + clip_high``), and the gradient is 0 there.

    Metrics (detached 0-dim tensors, over tokens with ``mask != 0``): ``clip_frac`` (share of tokens
    where clipping binds as above), ``clip_frac_low`` / ``clip_frac_high`` (its two sides), ``ratio_mean``,
    ``ratio_min``, ``ratio_max`` (1.0 on an empty mask), ``ppo_kl`` (mean of ``old_logp - logp``, the
    k1 estimate of ``KL(pi_old || pi)``), and with dual-clip ``clip_frac_dual`` (share of tokens where it
    binds; verl's ``pg_clipfrac_lower``).

    Shape:
        logp, old_logp: [B, T] log-probs of the sampled tokens under the current / behaviour policy.
        advantages: [B, T] token-level advantages.
        mask: [B, T] bool/int/float, nonzero on learnable tokens.
        output: (loss [B, T], metrics dict[str, 0-dim Tensor]).
    """

    def __call__(
        self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        _check_same_shape(logp=logp, old_logp=old_logp, advantages=advantages, mask=mask)
        valid = mask != 0
        log_ratio = torch.where(valid, logp - old_logp, torch.zeros_like(logp))
        adv = torch.where(valid, advantages, torch.zeros_like(advantages))
        ratio = torch.exp(log_ratio)
        loss, is_clipped, dual = _clipped_objective(ratio, adv, self.clip_low, self.clip_high,
                                                    self.clip_ratio_c)
        with torch.no_grad():
            metrics = _clip_metrics(ratio.detach(), is_clipped & valid, valid, log_ratio, valid,
                                    None if dual is None else dual & valid)
        return loss, metrics


class GSPOSurrogate(Surrogate):
    r"""GSPO: one length-normalised importance ratio per sequence (Zheng et al., 2025, "GSPO-token").

    With ``m`` the mask and ``|y_i| = sum_t m_{i,t}``:

    ``s_i = exp( sum_t m_{i,t} (logp_{i,t} - old_logp_{i,t}) / |y_i| )``   (``s_i = 1`` for an empty row),
    ``s_{i,t} = sg[s_i] * exp(logp_{i,t} - sg[logp_{i,t}])``                (value ``s_i``; ``sg`` = detach),
    ``loss_{i,t} = -min(s_{i,t} A_{i,t}, clip(s_{i,t}, 1 - clip_low, 1 + clip_high) A_{i,t})``.

    The stop-gradient trick makes ``d s_{i,t} / d logp_{i,t} = s_i``, so averaging over the row's tokens
    gives ``d/d logp_{i,t} [(1/|y_i|) sum_u s_{i,u} A_i] = s_i A_i / |y_i|``, which is exactly the gradient of
    GSPO's sequence objective ``s_i A_i`` (as ``d s_i / d logp_{i,t} = s_i / |y_i|``). Hence pair it with
    ``aggregation="seq-mean-token-mean"`` to reproduce GSPO's objective
    ``(1/G) sum_i min(s_i A_i, clip(s_i) A_i)``; ``token-mean`` gives a length-weighted variant.

    Advantages are used per token (GSPO-token): with a row-constant ``A_{i,t} = A_i`` (GRPO-style credit)
    this is GSPO proper; token-varying credit (SLCA, TCPO) is weighted per token under the shared ratio.
    The clip is on the sequence ratio, set by ``clip_low`` / ``clip_high``; ``method=gspo`` uses the paper's
    very small ranges (3e-4 / 4e-4): a length-normalised ratio moves little, so 0.2 almost never binds on it.
    ``clip_ratio_c`` (off by default) applies :class:`ClippedSurrogate`'s dual-clip to ``s_{i,t}`` (verl's
    GSPO loss has none).

    Metrics (detached 0-dim tensors) are sequence level, over rows with at least one learnable token:
    ``clip_frac`` (share of sequences where clipping binds on any token, i.e. the sequence is clipped
    when its advantage is row-constant), ``clip_frac_low`` / ``clip_frac_high``, ``ratio_mean`` /
    ``ratio_min`` / ``ratio_max`` of ``s_i`` (1.0 when no row is present), ``ppo_kl`` (token mean of
    ``old_logp - logp``), with dual-clip ``clip_frac_dual`` (share of sequences where it binds).

    Shape:
        logp, old_logp: [B, T] log-probs of the sampled tokens under the current / behaviour policy.
        advantages: [B, T] token-level advantages (row-constant for GSPO proper).
        mask: [B, T] bool/int/float, nonzero on learnable tokens.
        output: (loss [B, T], metrics dict[str, 0-dim Tensor]).
    """

    def __call__(
        self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        _check_same_shape(logp=logp, old_logp=old_logp, advantages=advantages, mask=mask)
        valid = mask != 0
        zeros = torch.zeros_like(logp)
        lp = torch.where(valid, logp, zeros)
        log_ratio = torch.where(valid, logp - old_logp, zeros)
        adv = torch.where(valid, advantages, torch.zeros_like(advantages))
        m = torch.where(valid, mask.to(logp.dtype), zeros)
        seq_log_ratio = _safe_div((log_ratio * m).sum(-1), m.sum(-1))  # log s_i, [B]; 0 on empty rows
        tok_log_ratio = seq_log_ratio.detach().unsqueeze(-1) + (lp - lp.detach())  # value log s_i
        ratio = torch.exp(tok_log_ratio)
        loss, is_clipped, dual = _clipped_objective(ratio, adv, self.clip_low, self.clip_high,
                                                    self.clip_ratio_c)
        with torch.no_grad():
            present = valid.any(-1)
            seq_clipped = (is_clipped & valid).any(-1)
            seq_dual = None if dual is None else (dual & valid).any(-1)
            metrics = _clip_metrics(torch.exp(seq_log_ratio.detach()), seq_clipped, present, log_ratio, valid,
                                    seq_dual)
        return loss, metrics


class ReinforceSurrogate(Surrogate):
    r"""The plain policy-gradient term, per token: ``loss_t = -A_t * logp_t`` (no ratio, no clip).

    With ``aggregation="seq-mean-token-sum"`` and a row-constant ``A_i`` this is DPA-GRPO's action loss
    ``-A_i log pi(a_i)`` with the sequence-summed log-prob ``log pi(a_i) = sum_t logp_{i,t}``
    (docs/methods.md §3); :class:`PolicyLoss` adds ``beta * (log pi - log pi_ref)`` with
    ``kl_estimator="k1"``. ``old_logp`` is not used (on-policy, one update per batch: its gradient equals the
    PPO surrogate's at ratio 1).

    Shape:
        logp, old_logp, advantages, mask: [B, T]. output: (loss [B, T], no metrics).
    """

    def __init__(self) -> None:
        self.clip_low = self.clip_high = self.clip_ratio_c = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __call__(
        self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        _check_same_shape(logp=logp, old_logp=old_logp, advantages=advantages, mask=mask)
        valid = mask != 0
        zeros = torch.zeros_like(logp)
        return -torch.where(valid, advantages, zeros) * torch.where(valid, logp, zeros), {}
