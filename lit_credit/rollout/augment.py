"""Augmenters: experience a credit estimator needs, added to a scored batch before credit (``augment=...``)."""
from __future__ import annotations

from dataclasses import replace
from typing import Literal

import torch

from lit_credit.credit.groups import member_index
from lit_credit.credit.tcpo import SELECT_MODES, select_counterfactual_turns
from lit_credit.distributed import any_rank
from lit_credit.interfaces import Sampler
from lit_credit.rollout.seeds import seeds_of, uniform
from lit_credit.types import RolloutBatch

Scorer = Literal["verifier", "reward"]
# Seed streams (0, 1: the DataModule's train and validation groups; 2: the minibatch split)
SAMPLE_STREAM, SELECT_STREAM = 3, 4


class CounterfactualTurns:
    """TCPO's fixed-history counterfactual resampling (``augment=counterfactual`` / ``counterfactual_tool``).

    The top ``top_l`` scored turns per group by ``select`` (``surprisal``: mean negative behaviour log-prob of
    the turn; ``random``: noise ``uniform(seed, 4, g, j, k)``; ``all``,
    :func:`~lit_credit.credit.tcpo.select_counterfactual_turns`) are resampled ``samples`` times from their
    exact history tokens (``input_ids[i, :turn_starts[i, k]]``) with the train sampling settings, through the
    experience layer (retries, failure counts, engine wake), turn ``k`` of rollout ``j`` of group ``g``
    (:func:`~lit_credit.credit.groups.member_index`) seeded ``mix_seed(seed, 3, g, j, k)``: both depend on the
    rollout, not on the process or batch it sits in, so a run's alternatives are the same on 1 or N processes
    (with an engine that honours seeds, as HFEngine does). Each alternative is scored by ``score``:

    - ``verifier``: the environment's answer at that turn, from the rollout's episode continued after its
      first k replies (``sampler.verify(row, k, reply, prefix, seed).score``, 0 when it gives none); the scored
      turns are the reached turns of a batch with ``turn_scores``;
    - ``reward``: the reward's per-turn score (``sampler.turn_score``, HierR's process score of the reply
      against gold step k); the scored turns are ``turn_parts["tool_turn_mask"]`` (SLCA x TCPO's tool turns).

    Adds ``batch.extras["alt_scores"]`` [B, K, M] (NaN where not sampled) and ``batch.extras["cf_mask"]``
    [B, K]; logs ``tcpo/cf_turns`` and ``tcpo/cf_alt_mean``. A batch without scored turns is left alone.

    Several processes: every rank makes the one engine call of a batch (the call is a collective under tensor
    parallelism, :func:`~lit_credit.rollout.loop.generate`), with no prompt where it selected no turn or its
    batch has no scored turns while another rank's has (agreed with :func:`~lit_credit.distributed.any_rank`).
    """

    provides = frozenset({"alt_scores", "cf_mask"})

    def __init__(self, top_l: int = 5, samples: int = 4, select: str = "surprisal", score: Scorer = "verifier",
                 seed: int = 0) -> None:
        if samples < 1 or top_l < 1:
            raise ValueError(f"augment.samples={samples}, augment.top_l={top_l}: both must be >= 1")
        if select not in SELECT_MODES:
            raise ValueError(f"augment.select={select!r}: use one of {', '.join(SELECT_MODES)}")
        if score not in ("verifier", "reward"):
            raise ValueError(f"augment.score={score!r}: use 'verifier' (the environment's turn score) or 'reward' "
                             "(the reward's turn_score, e.g. HierR's tool turns)")
        self.top_l, self.samples, self.select, self.score, self.seed = top_l, samples, select, score, seed

    def scored_turns(self, batch: RolloutBatch) -> torch.Tensor | None:
        """[B, K] bool: the turns that carry a score and may be resampled, or None."""
        if self.score == "reward":
            mask = batch.turn_parts.get("tool_turn_mask")
            return None if mask is None else mask.bool()
        return None if batch.turn_scores is None else batch.turn_mask.bool()

    def score_alternative(self, sampler: Sampler, meta: dict, turn: int, reply: str) -> float:
        """The score of ``reply`` as turn ``turn`` of the rollout of ``meta`` (its metadata): the reward's, or the
        environment's from that rollout's episode continued after its first ``turn`` replies."""
        row = meta["row"]
        if self.score == "reward":
            return sampler.turn_score(row, turn, reply)
        prefix = meta["replies"][:turn] if "replies" in meta else None  # a batch made by hand: the turn alone
        return sampler.verify(row, turn, reply, prefix=prefix, seed=meta.get("seed", 0)).score or 0.0

    @torch.no_grad()
    def __call__(self, batch: RolloutBatch, sampler: Sampler) -> dict[str, float]:
        mask = self.scored_turns(batch)
        if not any_rank(mask is not None):
            return {}
        if mask is None:  # another rank resamples: join its engine call with no prompt (a collective)
            sampler.sample([], replace(sampler.sampling, n=self.samples), [])
            return {}
        group, member = batch.group_ids.cpu()[:, None], member_index(batch.group_ids).cpu()[:, None]
        turns = torch.arange(mask.shape[1])
        noise = uniform(self.seed, SELECT_STREAM, group, member, turns) if self.select == "random" else None
        selected = select_counterfactual_turns(batch.turn_surprisal(), mask, batch.group_ids, top_l=self.top_l,
                                               mode=self.select, noise=noise)
        rollout, turn = selected.nonzero(as_tuple=True)
        starts = batch.turn_starts()[rollout, turn].tolist()
        prefixes = [batch.input_ids[i, :s].tolist() for i, s in zip(rollout.tolist(), starts)]
        r, k = rollout.cpu(), turn.cpu()
        seeds = seeds_of(self.seed, SAMPLE_STREAM, group[r, 0], member[r, 0], k)
        alternatives = sampler.sample(prefixes, replace(sampler.sampling, n=self.samples), seeds)
        metas = [batch.metadata[i] for i in rollout.tolist()]
        scores = [[self.score_alternative(sampler, meta, k, c.text) for c in alts]
                  for meta, k, alts in zip(metas, turn.tolist(), alternatives)]
        alt = torch.full((*mask.shape, self.samples), float("nan"), device=mask.device)
        if scores:
            alt[rollout, turn] = torch.tensor(scores, dtype=alt.dtype, device=alt.device)
        batch.extras["alt_scores"], batch.extras["cf_mask"] = alt, selected
        return {"tcpo/cf_turns": float(len(prefixes)),
                "tcpo/cf_alt_mean": alt.nanmean().item() if scores else float("nan")}
