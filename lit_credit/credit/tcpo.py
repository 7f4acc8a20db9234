"""TCPO: turn-level credit from per-turn verifier scores.

A score is not a credit: a kept success, a turn that enables a later fix and a regression after success
must be told apart. Scores ``r[i, k]`` exist on the turns rollout i reached (``turn_mask``, a prefix of
the K turns); everything here is 0 on turns not reached. Turn index k is 0-based here (the paper counts
from 1). Maintained and regressed turns exist only when an episode can go on after a success
(``task.stop_on_success=false``); with stop-at-success episodes ``m < tau`` on every reached turn, so the
``mu`` and ``rho`` terms of :func:`retrospective_credit` never act and ``retro`` equals ``[r - m]_+``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

from lit_credit.credit.groups import group_normalize, group_stats
from lit_credit.credit.registry import CreditEstimator, check_batch, register, require_parts
from lit_credit.credit.tokens import label_moments, moment_metrics, row_blocks, token_moments
from lit_credit.types import CreditOutput, RolloutBatch

Preset = Literal["trajectory", "turn", "diff", "retro", "retro_hindsight", "tcpo"]
Normalize = Literal["std", "mean_std", "turn_mean_std", "none"]
SelectMode = Literal["surprisal", "random", "all"]
PRESETS, NORMALIZE, SELECT_MODES = get_args(Preset), get_args(Normalize), get_args(SelectMode)
TURN_TYPES = ("flat", "improve", "maintain", "regress")


def check_choice(kind: str, value: str, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ValueError(f"unknown {kind} {value!r}; valid: {', '.join(options)}")


def _turn_cells(group_ids: Tensor, n_turns: int) -> Tensor:
    """[B, K] ids, one per (group, turn index) pair."""
    inv = torch.unique(group_ids, return_inverse=True)[1]
    return inv[:, None] * n_turns + torch.arange(n_turns, device=group_ids.device)


def _best_before(scores: Tensor, mask: Tensor, r0: float) -> Tensor:
    """``m[i, 0] = r0``, ``m[i, k] = max_{t<k} r[i, t]`` over reached turns (r0 where none was reached)."""
    best = scores.masked_fill(~mask, float("-inf")).cummax(1).values
    m = torch.cat([best.new_full((len(best), 1), r0), best[:, :-1]], 1)
    return torch.where(m.isneginf(), r0, m)


def retrospective_credit(
    scores: Tensor, turn_mask: Tensor, *, tau: float = 1.0, mu: float = 0.1, rho: float = 1.0, r0: float = 0.0
) -> Tensor:
    """Own contribution vs. the best so far.

    ``m[i, 0] = r0``, ``m[i, k] = max_{t<k} r[i, t]`` (r0 is the reference of the first turn only), and
    ``retro = [r - m]_+ + mu * 1[m >= tau and r >= tau] - rho * 1[m >= tau] * [m - r]_+``:
    an improvement earns its gain, a kept success (score >= tau) earns ``mu``, a drop after success costs
    ``rho`` per point lost; drops before any success cost nothing.

    Shape:
        scores: [B, K] float, turn_mask: [B, K] bool. Output: [B, K], 0 on turns not reached.
    """
    mask = turn_mask.bool()
    m = _best_before(scores, mask, r0)
    kept = mu * (scores >= tau).to(scores.dtype) - rho * (m - scores).clamp_min(0)
    retro = (scores - m).clamp_min(0) + torch.where(m >= tau, kept, 0)
    return torch.where(mask, retro, 0)


def hindsight_credit(scores: Tensor, turn_mask: Tensor, group_ids: Tensor) -> Tensor:
    """Future repair the turn led to, against the other rollouts of the group at the same turn.

    ``H[i, k] = max_{t >= k} r[i, t]`` in the completed rollout;
    ``hind[i, k] = H[i, k] - mean_j H[j, k]`` over the rollouts j of i's group that reached turn k
    (presence guard: 0 when fewer than 2 of them reached it).

    Shape:
        scores: [B, K] float, turn_mask: [B, K] bool, group_ids: [B]. Output: [B, K].
    """
    mask = turn_mask.bool()
    future_best = scores.masked_fill(~mask, float("-inf")).flip(1).cummax(1).values.flip(1)
    cells = _turn_cells(group_ids, scores.shape[1])
    return group_normalize(torch.where(mask, future_best, 0), cells, mask, norm_by_std=False)


def counterfactual_credit(scores: Tensor, alt_scores: Tensor, cf_mask: Tensor | None = None) -> Tensor:
    """Fixed-history counterfactual: ``cf[i, k] = r[i, k] - mean_m r'[i, k, m]``.

    ``r'`` are the verifier scores of M alternatives sampled with turn k's history fixed, NaN where not
    sampled. Turns outside ``cf_mask`` (default: turns with at least one alternative) or without any
    alternative get 0.

    Shape:
        scores: [B, K], alt_scores: [B, K, M] (NaN = not sampled), cf_mask: [B, K] bool. Output: [B, K].
    """
    sampled = ~alt_scores.isnan()
    n = sampled.sum(-1)
    alt_mean = torch.where(sampled, alt_scores, 0).sum(-1) / n.clamp_min(1)
    selected = n > 0 if cf_mask is None else cf_mask.bool() & (n > 0)
    return torch.where(selected, scores - alt_mean, 0)


def select_counterfactual_turns(
    surprisal: Tensor,
    turn_mask: Tensor,
    group_ids: Tensor,
    *,
    top_l: int = 5,
    mode: SelectMode = "surprisal",
    noise: Tensor | None = None,
) -> Tensor:
    """Turns that get counterfactual alternatives: the top-L reached turns of each group.

    ``mode="surprisal"`` ranks by surprisal (mean negative log-prob of the turn's tokens under the behaviour
    policy), ``"random"`` by ``noise`` ([B, K] uniform, the "random selection" ablation), ``"all"``
    takes every reached turn. Ties go to the earlier (rollout, turn) position.

    Shape:
        surprisal: [B, K] float, turn_mask: [B, K] bool, group_ids: [B]. Output: [B, K] bool.
    """
    check_choice("mode", mode, SELECT_MODES)
    mask = turn_mask.bool()
    if mode == "all":
        return mask.clone()
    if mode == "random" and (noise is None or noise.shape != surprisal.shape):
        raise ValueError(f"select_counterfactual_turns(mode='random') needs noise of shape {tuple(surprisal.shape)}")
    key = surprisal if mode == "surprisal" else noise.to(mask.device)
    key = key.masked_fill(~mask, float("-inf")).reshape(-1)
    group = torch.unique(group_ids, return_inverse=True)[1][:, None].expand_as(mask).reshape(-1)
    order = key.argsort(descending=True, stable=True)
    order = order[group[order].argsort(stable=True)]  # by group, then by key descending
    counts = torch.bincount(group)
    first = counts.cumsum(0) - counts
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order), device=order.device) - first[group[order]]
    return (rank < top_l).view_as(mask) & mask


@dataclass(kw_only=True)
class TCPOSettings:
    """TCPO's settings, passed whole to :func:`tcpo_turn_advantages`. :class:`TCPOCredit` is this dataclass, so
    each field is also the config key ``credit.<field>`` (conf/credit/tcpo.yaml, which a test holds to these
    fields and defaults): a setting is added here and in the YAML file, nowhere else.

    - ``preset``: the rung of the ablation ladder (:func:`tcpo_turn_advantages`): ``trajectory`` (GRPO on the
      final score), ``turn`` (each turn's score against the same turn of the group), ``diff`` (score
      differences), ``retro`` (retrospective credit), ``retro_hindsight`` (+ hindsight), ``tcpo`` (+ the
      counterfactual term, from the alternatives an augmenter adds).
    - ``normalize``: how the credit c of ``diff`` / ``retro`` / ``retro_hindsight`` / ``tcpo`` becomes the
      advantage: ``std`` (scaled by the group's std, not centred), ``mean_std`` (centred over the group's
      reached turns), ``turn_mean_std`` (centred within group and turn index) or ``none``; ``trajectory`` and
      ``turn`` ignore it.
    - ``w_retro``, ``w_hind``, ``w_cf``: the weights of the retrospective, hindsight and counterfactual terms
      in c.
    - ``tau``: the success threshold, a score ``>= tau`` is a success (:func:`retrospective_credit`).
    - ``mu``: the bonus of a kept success (best so far and score both ``>= tau``).
    - ``rho``: the cost per point lost after a success.
    - ``r0``: the reference score of the first turn (its best so far, and ``diff``'s previous score).
    - ``eps``: added to every std divided by.

    An unknown ``preset`` or ``normalize`` is a ``ValueError`` at construction naming ``credit.preset`` /
    ``credit.normalize`` and the valid values.
    """

    preset: Preset = "tcpo"
    normalize: Normalize = "std"
    w_retro: float = 1.0
    w_hind: float = 1.0
    w_cf: float = 1.0
    tau: float = 1.0
    mu: float = 0.1
    rho: float = 1.0
    r0: float = 0.0
    eps: float = 1e-6

    def __post_init__(self) -> None:
        check_choice("credit.preset", self.preset, PRESETS)
        check_choice("credit.normalize", self.normalize, NORMALIZE)


def tcpo_turn_advantages(
    scores: Tensor,
    turn_mask: Tensor,
    group_ids: Tensor,
    settings: TCPOSettings | None = None,
    *,
    alt_scores: Tensor | None = None,
    cf_mask: Tensor | None = None,
) -> Tensor:
    """Turn advantages ``A[i, k]`` along the ablation ladder, with the :class:`TCPOSettings` ``settings``.

    Presets:
      - ``trajectory``: GRPO on the final score, ``A[i, k] = Norm_{g(i)}(r[i, last])`` on every reached turn.
      - ``turn``: ``A[i, k] = Norm_{g(i), k}(r[i, k])``, normalised within group and turn index.
      - ``diff``: ``c = r[i, k] - r[i, k-1]`` (``r[i, -1] = r0``).
      - ``retro``: ``c = w_retro * retro``; ``retro_hindsight``: ``+ w_hind * hind``;
        ``tcpo``: ``+ w_cf * cf`` (cf = 0 without ``alt_scores``), see :func:`retrospective_credit` (with
        ``tau``, ``mu``, ``rho``, ``r0``), :func:`hindsight_credit`, :func:`counterfactual_credit`.
    The ``c`` of diff / retro / retro_hindsight / tcpo is then normalised (``trajectory`` and ``turn`` are
    normalised by definition and ignore ``normalize``):
      - ``std``: ``A = c / (std_G c + eps)``, G the group's reached turns (unbiased std, no centring, so
        improvements stay positive and regressions negative); a group with < 2 reached turns gets 0;
      - ``mean_std``: ``Norm_G(c)`` over the group's reached turns; ``turn_mean_std``: ``Norm`` within
        group and turn index (presence guard); ``none``: ``A = c``.

    Shape:
        scores: [B, K] float (any value where not reached), turn_mask: [B, K] bool, group_ids: [B],
        alt_scores: [B, K, M] (NaN where not sampled), cf_mask: [B, K] bool. Output: [B, K], 0 on turns
        not reached.
    """
    settings = TCPOSettings() if settings is None else settings
    preset, normalize, eps = settings.preset, settings.normalize, settings.eps
    mask = turn_mask.bool()
    scores = torch.where(mask, scores, 0)
    n_turns = scores.shape[1]
    if preset == "trajectory":
        last = (mask * torch.arange(1, n_turns + 1, device=mask.device)).amax(1).clamp_min(1) - 1
        final = scores.gather(1, last[:, None]).squeeze(1)
        return torch.where(mask, group_normalize(final, group_ids, mask.any(1), eps=eps)[:, None], 0)
    if preset == "turn":
        return group_normalize(scores, _turn_cells(group_ids, n_turns), mask, eps=eps)
    if preset == "diff":
        c = scores - torch.cat([scores.new_full((len(scores), 1), settings.r0), scores[:, :-1]], 1)
    else:
        c = settings.w_retro * retrospective_credit(
            scores, mask, tau=settings.tau, mu=settings.mu, rho=settings.rho, r0=settings.r0)
        if preset in ("retro_hindsight", "tcpo"):
            c = c + settings.w_hind * hindsight_credit(scores, mask, group_ids)
        if preset == "tcpo" and alt_scores is not None:
            c = c + settings.w_cf * counterfactual_credit(scores, alt_scores, cf_mask)
    rollout_group = group_ids[:, None].expand_as(mask)
    if normalize == "std":
        _, std, count = group_stats(c, rollout_group, mask)
        return torch.where(mask & (count >= 2), c / (std + eps), 0)
    if normalize == "mean_std":
        return group_normalize(c, rollout_group, mask, eps=eps)
    if normalize == "turn_mean_std":
        return group_normalize(c, _turn_cells(group_ids, n_turns), mask, eps=eps)
    return torch.where(mask, c, 0)


def turns_to_tokens(
    turn_values: Tensor, turn_ids: Tensor, on: Tensor | None = None, *, repeat_last: bool = False
) -> Tensor:
    """Every token of turn k gets ``turn_values[i, k]``: ``out[i, t] = turn_values[i, turn_ids[i, t]]``
    where ``0 <= turn_ids[i, t] < K`` and ``on[i, t]`` (default: everywhere); tokens with an id >= K get
    ``turn_values[i, K - 1]`` when ``repeat_last``, else 0; tokens off ``on`` or with id -1 (prompt,
    feedback, padding) get 0.

    One gather per row block (:func:`~lit_credit.credit.tokens.row_blocks`) from the table
    ``[0 | turn_values | last or 0]`` at ``clamp(turn_ids + 1, 0, K + 1) * on``.

    Shape:
        turn_values: [B, K], turn_ids: [B, T] long, on: [B, T] bool or 0 / 1. Output: [B, T].
    """
    b, k = turn_values.shape
    zeros = turn_values.new_zeros(b, 1)
    table = torch.cat([zeros, turn_values, turn_values[:, -1:] if repeat_last and k else zeros], 1)
    out = turn_values.new_empty(turn_ids.shape)
    for rows in row_blocks(turn_ids.shape):
        index = turn_ids[rows] + 1
        index.clamp_(0, k + 1)
        if on is not None:
            index.mul_(on[rows].bool())
        torch.gather(table[rows], 1, index, out=out[rows])
    return out


def turn_types(scores: Tensor, turn_mask: Tensor, *, tau: float = 1.0, r0: float = 0.0) -> Tensor:
    """Index into ``TURN_TYPES`` per reached turn, -1 elsewhere, with m the best score before the turn
    (as in :func:`retrospective_credit`), by which term of ``retro`` acts, in this order:

    - improve: ``r > m`` (the gain ``[r - m]_+ > 0``);
    - else maintain: ``m >= tau and r >= tau`` (the bonus ``mu``);
    - else regress: ``m >= tau and r < m`` (the penalty ``rho * [m - r]_+``);
    - else flat: no term acts, ``retro = 0``.

    With scores in [0, 1] and ``tau = 1`` exactly one term acts on each non-flat turn. With ``tau < 1`` a turn
    may carry two: ``r > m >= tau`` earns gain and ``mu`` (counted improve), ``tau <= r < m`` earns ``mu`` and
    pays ``rho * (m - r)`` (counted maintain).

    Shape:
        scores: [B, K], turn_mask: [B, K] bool. Output: [B, K] long.
    """
    mask = turn_mask.bool()
    m = _best_before(scores, mask, r0)
    solved = m >= tau
    kind = torch.where(solved & (scores < m), 3, 0)
    kind = torch.where(solved & (scores >= tau), 2, kind)
    kind = torch.where(scores > m, 1, kind)
    return torch.where(mask, kind, -1)


def turn_credit_metrics(adv: Tensor, scores: Tensor, turn_mask: Tensor, tau: float, r0: float) -> dict[str, float]:
    """Turn credit by kind and by index: ``credit/turn_type/{flat,improve,maintain,regress}/{adv_mean,
    adv_std,adv_abs_max,frac}`` over reached turns (:func:`turn_types`; ``frac`` = the kind's share of the
    reached turns) and ``credit/turn/{k}/adv_mean``.

    Shape:
        adv, scores: [B, K] float, turn_mask: [B, K] bool.
    """
    mask = turn_mask.bool()
    by_kind = label_moments(adv, turn_types(scores, mask, tau=tau, r0=r0) + 1, len(TURN_TYPES) + 1)[1:]
    reached = max(by_kind[:, 0].sum().item(), 1.0)
    metrics: dict[str, float] = {}
    for name, moments in zip(TURN_TYPES, by_kind):
        metrics |= moment_metrics(moments, f"credit/turn_type/{name}/")
        metrics[f"credit/turn_type/{name}/frac"] = moments[0].item() / reached
    by_index = (torch.where(mask, adv, 0).sum(0) / mask.sum(0).clamp_min(1)).tolist()
    return metrics | {f"credit/turn/{k}/adv_mean": v for k, v in enumerate(by_index)}


COUNTERFACTUALS = frozenset({"alt_scores", "cf_mask"})


def counterfactual_needs(preset: str, w_cf: float) -> frozenset[str]:
    """The ``batch.extras`` a TCPO preset reads: the counterfactual alternatives (:data:`COUNTERFACTUALS`)
    when they change the result (preset ``tcpo`` with ``w_cf != 0``), else none."""
    return COUNTERFACTUALS if preset == "tcpo" and w_cf != 0 else frozenset()


def counterfactual_inputs(batch: RolloutBatch, needs: frozenset[str], *, credit: str, fix: str
                          ) -> tuple[Tensor | None, Tensor | None, dict[str, tuple[Tensor, Tensor]]]:
    """``(alt_scores, cf_mask, checks)`` of ``batch.extras``: both None when the estimator ``needs`` none
    (they would not change the result); else both required (:func:`~lit_credit.credit.registry.require_parts`
    with ``fix``), and ``checks`` the :func:`~lit_credit.credit.registry.check_batch` entry of ``alt_scores``:
    NaN marks an alternative not sampled, so only the sampled entries must be finite."""
    if not needs:
        return None, None, {}
    require_parts(batch, needs, credit=credit, fix=fix, field="extras")
    alt = batch.extras["alt_scores"]
    return alt, batch.extras["cf_mask"], {"batch.extras['alt_scores']": (alt, ~alt.isnan())}


@register("tcpo")
@dataclass(kw_only=True)
class TCPOCredit(TCPOSettings, CreditEstimator):
    """:func:`tcpo_turn_advantages` of ``batch.turn_scores`` spread onto the tokens by ``batch.turn_ids``; the
    estimator is its :class:`TCPOSettings` (one keyword argument, and one ``credit.<field>`` key, per field).

    Reads ``batch.turn_scores``, ``turn_mask``, ``turn_ids``, ``group_ids`` and, when the preset uses
    counterfactuals (:attr:`needs`), ``batch.extras["alt_scores"]`` ([B, K, M]) and
    ``batch.extras["cf_mask"]`` ([B, K]), added by ``augment=counterfactual``.
    ``parts["turn"]`` holds A [B, K]; turn ids are read only on the response mask (tokens with
    ``response_mask == 0`` get 0). Metrics: ``credit/adv_*`` over the learnable tokens,
    ``credit/turn_type/{flat,improve,maintain,regress}/{adv_mean,adv_std,adv_abs_max,frac}`` over reached
    turns (see :func:`turn_types`) and
    ``credit/turn/{k}/adv_mean`` by turn index.
    """

    @property
    def needs(self) -> frozenset[str]:
        """``{"alt_scores", "cf_mask"}`` when they change the result (preset ``tcpo`` with ``w_cf != 0``): an
        augmenter must add them (``augment=counterfactual`` resamples the selected turns); else empty."""
        return counterfactual_needs(self.preset, self.w_cf)

    def __call__(self, batch: RolloutBatch) -> CreditOutput:
        if batch.turn_scores is None or batch.turn_mask is None:
            raise ValueError("credit=tcpo needs per-turn verifier scores (batch.turn_scores): use a task whose "
                             "environment scores every turn (task=math_revise or task=code_revise)")
        scores, mask = batch.turn_scores, batch.turn_mask.bool()
        alt, cf_mask, alt_check = counterfactual_inputs(
            batch, self.needs, credit="tcpo", fix="augment=counterfactual (TCPO's resampled alternatives), "
            "or credit.preset=retro_hindsight / credit.w_cf=0 (no counterfactual term)")
        check_batch(batch, {"batch.turn_scores": (scores, mask), **alt_check})
        adv = tcpo_turn_advantages(scores, mask, batch.group_ids, self, alt_scores=alt, cf_mask=cf_mask)
        tokens = turns_to_tokens(adv, batch.turn_ids, batch.response_mask)
        metrics = moment_metrics(token_moments(tokens, batch.response_mask.sum()))
        metrics |= turn_credit_metrics(adv, scores, mask, self.tau, self.r0)
        return CreditOutput(tokens, {"turn": adv}, metrics)
