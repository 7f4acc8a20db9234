"""Per-rollout Python-loop references of every registered credit estimator, for ``benchmarks.estimators``.

Each function reads its formula from docs/methods.md and computes the token advantages [B, T] the way a
first, naive implementation would: a ``for i in range(B)`` loop over the rollouts with per-row tensor ops
over that row's T tokens, per-rollout (and per-turn) scalars as Python floats, and group statistics
(mean, Bessel or population std, presence guard) in Python dicts keyed by group id (and turn index).
Nothing here calls the vectorised library code, so the benchmark times two independent readings of the
same formulas; ``tests/test_benchmark_references.py`` checks that they agree.

Only the advantages are computed (no metrics), so the loop reference does less work than the estimator.
Per-row lookups use ``gather``, not advanced indexing: ``row[index]`` on a few thousand tokens is ~100x
slower with 2 torch threads on a loaded 2-core machine (thread hand-off per call), which would flatter the
estimators.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence

import torch
from torch import Tensor

from lit_credit.credit import registration
from lit_credit.types import RolloutBatch


def group_norm(
    values: Sequence[float],
    groups: Sequence[Hashable],
    present: Sequence[bool] | None = None,
    *,
    eps: float = 1e-6,
    norm_by_std: bool = True,
    unbiased: bool = True,
) -> list[float]:
    """``Norm_G(x) = (x - mean_G x) / (std_G x + eps)`` (``x - mean_G x`` without ``norm_by_std``), G the
    present elements of the element's group; 0 where absent or when fewer than 2 are present."""
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        if present is None or present[i]:
            members[g].append(i)
    out = [0.0] * len(values)
    for idx in members.values():
        if len(idx) < 2:
            continue
        mean = math.fsum(values[i] for i in idx) / len(idx)
        std = math.sqrt(math.fsum((values[i] - mean) ** 2 for i in idx) / (len(idx) - int(unbiased)))
        for i in idx:
            out[i] = (values[i] - mean) / (std + eps) if norm_by_std else values[i] - mean
    return out


def row_segments(mask_row: Tensor) -> tuple[Tensor, Tensor]:
    """(tool, summary) bool masks of one rollout: runs of learnable tokens; >= 2 runs: the last is the
    summary, the others the tool segment; 1 run: summary only; 0 runs: both empty."""
    m = mask_row > 0
    starts = m.clone()
    starts[1:] &= ~m[:-1]
    run = starts.cumsum(0)  # 1-based run index of each learnable token
    summary = m & (run == int(starts.sum()))
    return m & ~summary, summary


def _empty(batch: RolloutBatch) -> Tensor:
    return torch.zeros_like(batch.response_mask)


def _omitted(batch: RolloutBatch, score: list[float]) -> list[bool]:
    """SLCA omission guard flag: ``should_call_but_no_call`` or a negative total score."""
    flag = batch.reward_parts.get("should_call_but_no_call")
    flags = [False] * len(score) if flag is None else [bool(v) for v in flag.tolist()]
    return [flags[i] or score[i] < 0 for i in range(len(score))]


# --- GRPO family (docs/methods.md §0, §3) ---------------------------------------------------------------


def grpo(batch: RolloutBatch, *, norm_by_std: bool = True, eps: float = 1e-6, unbiased: bool = True) -> Tensor:
    """``A_i = Norm_{g(i)}(R_i)`` on every learnable token of rollout i, 0 elsewhere."""
    gids = batch.group_ids.tolist()
    adv = group_norm(batch.scores.tolist(), gids, eps=eps, norm_by_std=norm_by_std, unbiased=unbiased)
    out = _empty(batch)
    for i in range(len(gids)):
        out[i] = torch.where(batch.response_mask[i] > 0, adv[i], 0.0)
    return out


def dr_grpo(batch: RolloutBatch) -> Tensor:
    """Dr.GRPO: ``A_i = R_i - mean_{g(i)} R``."""
    return grpo(batch, norm_by_std=False)


def rloo(batch: RolloutBatch) -> Tensor:
    """RLOO: ``A_i = R_i - mean_{j in g(i), j != i} R_j`` (0 for a group of one)."""
    scores, gids = batch.scores.tolist(), batch.group_ids.tolist()
    out = _empty(batch)
    for i, g in enumerate(gids):
        others = [scores[j] for j, h in enumerate(gids) if h == g and j != i]
        adv = scores[i] - sum(others) / len(others) if others else 0.0
        out[i] = torch.where(batch.response_mask[i] > 0, adv, 0.0)
    return out


def dpa(batch: RolloutBatch, *, eps: float = 1e-8) -> Tensor:
    """DPA pair credit: ``A = (r - mean) / (std_pop + eps)`` within each pair of canonical actions."""
    return grpo(batch, eps=eps, unbiased=False)


def mt_grpo(batch: RolloutBatch, *, c: float = 1.0, eps: float = 1e-6) -> Tensor:
    """MT-GRPO: ``A_turn = Norm(turn 0's score)`` over the rollouts that reached turn 0, ``A_out =
    Norm(R)``; tokens of turn 0 get ``A_out + c * A_turn``, tokens of later turns ``A_out``."""
    gids = batch.group_ids.tolist()
    a_turn = group_norm(batch.turn_scores[:, 0].tolist(), gids, batch.turn_mask[:, 0].tolist(), eps=eps)
    a_out = group_norm(batch.scores.tolist(), gids, eps=eps)
    out = _empty(batch)
    for i in range(len(gids)):
        turn = torch.where(batch.response_mask[i] > 0, batch.turn_ids[i], -1)
        row = torch.where(turn >= 0, a_out[i], 0.0)
        out[i] = torch.where(turn == 0, row + c * a_turn[i], row)
    return out


# --- SLCA-GRPO and ToolPO (docs/methods.md §1) ----------------------------------------------------------


def slca(batch: RolloutBatch, *, w_process: float = 1.0, w_summary: float = 1.0, eps: float = 1e-6) -> Tensor:
    """SLCA-GRPO: omission guard (``s_tool = 0``, ``s_sum = score``), ``A_tool = w_process * Norm(s_tool)``
    over rollouts with a tool segment, ``A_sum = w_summary * Norm(s_sum)`` over those with a summary; tool
    tokens get ``A_tool``, summary tokens ``A_sum``."""
    parts, gids = batch.reward_parts, batch.group_ids.tolist()
    score = parts.get("score", batch.scores).tolist()
    process, summary = parts["process"].tolist(), parts["summary"].tolist()
    omitted = _omitted(batch, score)
    segments, s_tool, s_sum = [], [], []
    for i in range(len(gids)):
        segments.append(row_segments(batch.response_mask[i]))
        s_tool.append(0.0 if omitted[i] else process[i])
        s_sum.append(score[i] if omitted[i] else summary[i])
    has_tool = [bool(tool.any()) for tool, _ in segments]
    has_sum = [bool(sm.any()) for _, sm in segments]
    a_tool = group_norm(s_tool, gids, has_tool, eps=eps)
    a_sum = group_norm(s_sum, gids, has_sum, eps=eps)
    out = _empty(batch)
    for i, (tool, sm) in enumerate(segments):
        out[i] = torch.where(tool, w_process * a_tool[i], 0.0) + torch.where(sm, w_summary * a_sum[i], 0.0)
    return out


def _toolpo(batch: RolloutBatch, outcome: list[float], s_tool: list[float], lam: float, eps: float) -> Tensor:
    gids = batch.group_ids.tolist()
    tools = [row_segments(batch.response_mask[i])[0] for i in range(len(gids))]
    a_global = group_norm(outcome, gids, eps=eps)
    a_tool = group_norm(s_tool, gids, [bool(tool.any()) for tool in tools], eps=eps)
    out = _empty(batch)
    for i, tool in enumerate(tools):
        row = torch.where(batch.response_mask[i] > 0, a_global[i], 0.0)
        out[i] = row + torch.where(tool, lam * a_tool[i], 0.0)
    return out


def toolpo(batch: RolloutBatch, *, lam: float = 1.0, eps: float = 1e-6) -> Tensor:
    """ToolPO (official): ``A_global = Norm(solved)`` on every learnable token plus ``lam * A_tool`` on the
    tool tokens, ``A_tool = Norm(toolpo_correct_ratio)`` over the rollouts with a tool segment; no omission
    guard."""
    parts = batch.reward_parts
    return _toolpo(batch, parts["solved"].tolist(), parts["toolpo_correct_ratio"].tolist(), lam, eps)


def toolpo_process(batch: RolloutBatch, *, lam: float = 1.0, eps: float = 1e-6) -> Tensor:
    """ToolPO with HierR's rewards: ``A_global = Norm(score)`` on every learnable token plus ``lam * A_tool``
    (SLCA's tool advantage, omission guard ``s_tool = 0``) on the tool tokens."""
    parts = batch.reward_parts
    score, process = parts.get("score", batch.scores).tolist(), parts["process"].tolist()
    omitted = _omitted(batch, score)
    return _toolpo(batch, score, [0.0 if omitted[i] else process[i] for i in range(len(score))], lam, eps)


# --- TCPO (docs/methods.md §2) and SLCA x TCPO (§4) -----------------------------------------------------


def tcpo_turns(
    scores: list[list[float]],
    reached: list[list[bool]],
    gids: list[int],
    *,
    preset: str = "tcpo",
    alt_scores: Tensor | None = None,
    cf_mask: Tensor | None = None,
    w_retro: float = 1.0,
    w_hind: float = 1.0,
    w_cf: float = 1.0,
    tau: float = 1.0,
    mu: float = 0.1,
    rho: float = 1.0,
    r0: float = 0.0,
    eps: float = 1e-6,
    normalize: str = "std",
) -> list[list[float]]:
    """Turn advantages ``A[i][k]`` of the presets ``retro``, ``retro_hindsight``, ``tcpo``:
    ``c = w_retro * retro + w_hind * hind + w_cf * cf``; ``normalize="std"``: ``A = c / (std_G c + eps)``
    over the group's reached turns (no centring; 0 when fewer than 2); ``"turn_mean_std"``: ``A = Norm`` of c
    within each (group, turn index) cell of reached turns."""
    if normalize not in ("std", "turn_mean_std"):
        raise ValueError(f"normalize={normalize!r}: the loop reference covers std and turn_mean_std")
    if preset not in ("retro", "retro_hindsight", "tcpo"):
        raise ValueError(f"preset={preset!r}: the loop reference covers the presets the benchmark times "
                         "(retro, retro_hindsight, tcpo); fix: pick one of those")
    n_rows, n_turns = len(scores), len(scores[0])
    r = [[scores[i][k] if reached[i][k] else 0.0 for k in range(n_turns)] for i in range(n_rows)]
    use_cf = preset == "tcpo" and alt_scores is not None
    alts = alt_scores.tolist() if use_cf else None
    chosen = cf_mask.tolist() if use_cf and cf_mask is not None else None
    # H[i][k] = max_{t >= k} r[i][t] over reached turns; hind = H - mean over the group's rollouts at turn k
    future = [[0.0] * n_turns for _ in range(n_rows)]
    for i in range(n_rows):
        for k in range(n_turns):
            if reached[i][k]:
                future[i][k] = max(r[i][t] for t in range(k, n_turns) if reached[i][t])
    cells = [(gids[i], k) for i in range(n_rows) for k in range(n_turns)]
    flat = group_norm([v for row in future for v in row], cells, [v for row in reached for v in row],
                      norm_by_std=False)
    hind = [flat[i * n_turns:(i + 1) * n_turns] for i in range(n_rows)]
    c = [[0.0] * n_turns for _ in range(n_rows)]
    for i in range(n_rows):
        best = None  # best score over the reached turns before k
        for k in range(n_turns):
            if not reached[i][k]:
                continue
            m = r0 if best is None else best
            retro = max(r[i][k] - m, 0.0)
            if m >= tau:
                retro += mu * (r[i][k] >= tau) - rho * max(m - r[i][k], 0.0)
            value = w_retro * retro
            if preset != "retro":
                value += w_hind * hind[i][k]
            if use_cf:
                sampled = [a for a in alts[i][k] if not math.isnan(a)]
                if sampled and (chosen is None or chosen[i][k]):
                    value += w_cf * (r[i][k] - math.fsum(sampled) / len(sampled))
            c[i][k] = value
            best = r[i][k] if best is None else max(best, r[i][k])
    if normalize == "turn_mean_std":
        flat = group_norm([v for row in c for v in row], cells, [v for row in reached for v in row], eps=eps)
        return [flat[i * n_turns:(i + 1) * n_turns] for i in range(n_rows)]
    # std of c over each group's reached turns (Bessel), no centring
    members: dict[int, list[float]] = defaultdict(list)
    for i in range(n_rows):
        members[gids[i]] += [c[i][k] for k in range(n_turns) if reached[i][k]]
    std: dict[int, float | None] = {}
    for g, vals in members.items():
        std[g] = None
        if len(vals) >= 2:
            mean = math.fsum(vals) / len(vals)
            std[g] = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
    return [
        [c[i][k] / (std[gids[i]] + eps) if reached[i][k] and std[gids[i]] is not None else 0.0
         for k in range(n_turns)]
        for i in range(n_rows)
    ]


def _tcpo_kwargs(batch: RolloutBatch, settings: dict) -> dict:
    return {**settings, "alt_scores": batch.extras.get("alt_scores"), "cf_mask": batch.extras.get("cf_mask")}


def tcpo(batch: RolloutBatch, **settings) -> Tensor:
    """TCPO: turn advantages from ``batch.turn_scores`` / ``turn_mask`` (:func:`tcpo_turns`); every
    learnable token of turn k gets ``A[i][k]``, other tokens 0."""
    gids = batch.group_ids.tolist()
    adv = tcpo_turns(batch.turn_scores.tolist(), batch.turn_mask.bool().tolist(), gids,
                     **_tcpo_kwargs(batch, settings))
    out = _empty(batch)
    for i in range(len(gids)):
        turn = torch.where(batch.response_mask[i] > 0, batch.turn_ids[i], -1)
        row = torch.tensor(adv[i], dtype=out.dtype)
        out[i] = torch.where(turn >= 0, row.gather(0, turn.clamp_min(0)), 0.0)
    return out


def slca_tcpo(
    batch: RolloutBatch, *, preset: str = "retro_hindsight", normalize: str = "turn_mean_std",
    w_process: float = 1.0, w_summary: float = 1.0, eps: float = 1e-6, **settings,
) -> Tensor:
    """SLCA x TCPO: the summary gets SLCA's ``A_sum``; each tool token of turn k gets
    ``w_process * A[i][k]``, A the TCPO turn advantages of the per-turn tool scores (omission guard: all
    tool scores of an omitted rollout are 0), centred per turn index by default (``turn_mean_std``)."""
    parts, gids = batch.reward_parts, batch.group_ids.tolist()
    score, summary = parts.get("score", batch.scores).tolist(), parts["summary"].tolist()
    turns = batch.turn_parts
    tool_scores, tool_turns = turns["tool_scores"].tolist(), turns["tool_turn_mask"].bool().tolist()
    omitted = _omitted(batch, score)
    segments, s_sum = [], []
    for i in range(len(gids)):
        segments.append(row_segments(batch.response_mask[i]))
        s_sum.append(score[i] if omitted[i] else summary[i])
        if omitted[i]:
            tool_scores[i] = [0.0] * len(tool_scores[i])
    a_sum = group_norm(s_sum, gids, [bool(sm.any()) for _, sm in segments], eps=eps)
    a_turn = tcpo_turns(tool_scores, tool_turns, gids, preset=preset, eps=eps, normalize=normalize,
                        **_tcpo_kwargs(batch, settings))
    out = _empty(batch)
    for i, (tool, sm) in enumerate(segments):
        row = torch.tensor([w_process * a for a in a_turn[i]], dtype=out.dtype)
        turn = torch.where(tool & (batch.turn_ids[i] < len(row)), batch.turn_ids[i], -1)
        on_tool = torch.where(turn >= 0, row.gather(0, turn.clamp_min(0)), 0.0)
        out[i] = on_tool + torch.where(sm, w_summary * a_sum[i], 0.0)
    return out


REFERENCES = {
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "dpa": dpa,
    "mt_grpo": mt_grpo,
    "slca": slca,
    "toolpo": toolpo,
    "toolpo_process": toolpo_process,
    "tcpo": tcpo,
    "slca_tcpo": slca_tcpo,
}


def reference_of(name: str) -> Callable[..., Tensor] | None:
    """The loop reference of the estimator registered as ``name``: the shipped estimators' from
    :data:`REFERENCES`, a new one's from its registration (``register(name, loop_reference=fn)``); None when its
    registration says why it has none (``without_loop_reference``). An estimator with neither raises KeyError
    naming the fix."""
    entry = registration(name)
    if name in REFERENCES:
        return REFERENCES[name]
    if entry.loop_reference is None and entry.without_loop_reference is None:
        raise KeyError(f"credit estimator {name!r} has no loop reference; fix: register it with "
                       f"@register({name!r}, loop_reference=fn), fn(batch, **kwargs) -> [B, T] a per-rollout "
                       f"Python loop of the same formula, or with without_loop_reference='why not'")
    return entry.loop_reference
