"""Credit records: one row per (rollout, turn) of a training batch with the credit it received.

Schema (every shard, every method; a column a method lacks holds its neutral value):

=============== ======= ==============================================================================
column          type    meaning
=============== ======= ==============================================================================
step            int64   optimiser step (``trainer.global_step`` after the update)
method          string  the run's method label (e.g. the credit estimator's name: ``slca``)
source          string  which batch of the step: ``policy`` (GRPO family) or a DPA-GRPO role batch
                        (``verifier``, ``approver``, ``revisions``, ``proposals``)
group           int64   group id (one per prompt, or per DPA decision)
rank            int64   the data-parallel rank (process) that sampled the rollout (0 in one process)
rollout         int64   row of the batch
turn            int64   assistant turn index k (0-based)
segment         string  ``tool`` / ``summary`` (SLCA's rule, on tool tasks) or ``turn`` (other tasks)
turn_type       string  TCPO's ``flat`` / ``improve`` / ``maintain`` / ``regress`` where the turn has a
                        per-turn score (``turn_scores``, or a tool turn's ``turn_parts["tool_scores"]``),
                        else ""
case            string  DPA-GRPO decision case (``1`` ... ``6b``), else ""
turn_score      float64 the turn's score (verifier score or tool-turn score), NaN where none
score           float64 the rollout's total reward
advantage       float64 mean advantage over the turn's learnable tokens
advantage_min   float64 / advantage_max: its extremes
tokens          int64   learnable tokens of the turn
excerpt         string  the first ``excerpt_chars`` characters of the turn's text
reward/<part>   float64 every per-rollout reward part, ``batch.reward_parts`` (``reward/process``,
                        ``reward/summary``, ...)
extra/<name>    float64 every per-rollout extra, ``batch.extras`` [B] (not a reward: DPA-GRPO's approver
                        rarity ``extra/weight`` and reviser ``extra/adv_bonus``)
=============== ======= ==============================================================================

Per-turn reward lists (``turn_parts``) appear only through ``turn_score`` / ``turn_type``; extras that are not
one value per rollout (TCPO's ``alt_scores`` [B, K, M], ``cf_mask`` [B, K]) are not written.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import pandas as pd
import torch

from lit_credit.checkpoint import atomic_write
from lit_credit.credit.slca import segment_masks
from lit_credit.credit.tcpo import TURN_TYPES, turn_types
from lit_credit.rewards.dpa import CASES
from lit_credit.types import CreditTrace, RolloutBatch


def _turn_scores(batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The per-turn scores that carry TCPO turn types: the verifier's, else the reward's tool turns'."""
    if batch.turn_scores is not None:
        return batch.turn_scores, batch.turn_mask.bool()
    turns = batch.turn_parts
    if "tool_scores" in turns and "tool_turn_mask" in turns:
        return turns["tool_scores"], turns["tool_turn_mask"].bool()
    return None


def credit_records(trace: CreditTrace, *, step: int, method: str, excerpt_chars: int = 80) -> pd.DataFrame:
    """The records (module docstring) of one credited batch, one row per (rollout, turn) with >= 1 token.

    Per-turn sums, extremes and segments are scatters over the turn ids (:meth:`RolloutBatch.per_turn`);
    only the text excerpts are per-row Python.
    """
    batch = trace.batch
    if not (batch.turn_ids >= 0).any():
        return pd.DataFrame()
    adv = trace.advantages.detach().float()
    tokens = batch.per_turn((batch.turn_ids >= 0).float(), "sum", 0.0).cpu()
    total = batch.per_turn(adv, "sum", 0.0).cpu()
    low = batch.per_turn(adv, "amin", math.inf).cpu()
    high = batch.per_turn(adv, "amax", -math.inf).cpu()
    b, n_turns = tokens.shape
    rollout, turn = (tokens > 0).nonzero(as_tuple=True)

    parts = {k: v.cpu() for k, v in batch.reward_parts.items()}
    if "process" in parts:  # a tool task: SLCA's segments
        _, summary = segment_masks(batch.response_mask)
        is_summary = batch.per_turn(summary.float(), "amax", 0.0).cpu() > 0
        segment = ["summary" if s else "tool" for s in is_summary[rollout, turn].tolist()]
    else:
        segment = ["turn"] * len(rollout)
    kinds, turn_score = [""] * len(rollout), [math.nan] * len(rollout)
    scored = _turn_scores(batch)
    if scored is not None:
        s, m = scored[0].cpu().float(), scored[1].cpu()
        width = min(s.shape[1], n_turns)
        pad = n_turns - width
        s = torch.cat([s[:, :width], s.new_zeros(b, pad)], 1)
        m = torch.cat([m[:, :width], m.new_zeros(b, pad)], 1)
        k = turn_types(s, m)[rollout, turn].tolist()
        kinds = [TURN_TYPES[x] if x >= 0 else "" for x in k]
        turn_score = torch.where(m, s, math.nan)[rollout, turn].tolist()
    cases = [""] * len(rollout)
    if trace.cases is not None:
        cases = [CASES[c] for c in trace.cases.cpu()[rollout].tolist()]
    replies = [m.get("replies", []) for m in batch.metadata] if batch.metadata else [[] for _ in range(b)]
    excerpt = [(replies[i][k] if k < len(replies[i]) else "")[:excerpt_chars]
               for i, k in zip(rollout.tolist(), turn.tolist())]
    count = tokens[rollout, turn]
    frame = {
        "step": step, "method": method, "source": trace.source,
        "group": batch.group_ids.cpu()[rollout].numpy(),
        "rank": (trace.ranks.cpu()[rollout] if trace.ranks is not None else torch.zeros_like(rollout)).numpy(),
        "rollout": rollout.numpy(), "turn": turn.numpy(),
        "segment": segment, "turn_type": kinds, "case": cases, "turn_score": turn_score,
        "score": batch.scores.cpu().double()[rollout].numpy(),
        "advantage": (total[rollout, turn] / count).double().numpy(),
        "advantage_min": low[rollout, turn].double().numpy(), "advantage_max": high[rollout, turn].double().numpy(),
        "tokens": count.long().numpy(), "excerpt": excerpt,
    }
    frame |= {f"reward/{k}": v.double()[rollout].numpy() for k, v in sorted(parts.items()) if v.dim() == 1}
    extras = {k: v.cpu() for k, v in sorted(batch.extras.items()) if v.dim() == 1}
    frame |= {f"extra/{k}": v.double()[rollout].numpy() for k, v in extras.items()}
    return pd.DataFrame(frame)


def write_shard(frame: pd.DataFrame, directory: str | os.PathLike, name: str) -> Path:
    """Write ``frame`` as ``directory/name.parquet`` atomically (a temporary file, then a rename)."""
    return atomic_write(Path(directory) / f"{name}.parquet", lambda tmp: frame.to_parquet(tmp, index=False))
