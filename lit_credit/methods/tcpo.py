"""TCPO: the GRPO module with turn credit, counterfactual resampling and multi-turn metrics."""
from __future__ import annotations

from dataclasses import replace

import torch

from lit_credit.credit.tcpo import select_counterfactual_turns
from lit_credit.methods.grpo import GRPOModule
from lit_credit.types import RolloutBatch


def turn_metrics(turn_scores: torch.Tensor, turn_mask: torch.Tensor, success: float = 1.0,
                 max_turns: int = 1) -> dict[str, float]:
    """Multi-turn outcome metrics of a batch, with ``hit[i, k] = r[i, k] >= success`` on reached turns:

    - ``pass@turn{k}`` (k = 1..max(max_turns, K)): share of rollouts with a hit among their first k turns
      (best-turn pass rate; a rollout that ended earlier keeps its value);
    - ``success``: share of rollouts whose final turn is a hit (the outcome ``reward=final_turn`` scores;
      equal to ``pass@turn{K}`` when episodes stop at the first success);
    - ``regress_after_success``: share of rollouts with a hit at some turn and a final turn that is not one
      (``pass@turn{K} - success``);
    - ``maintain_rate``: share of the turns that follow a rollout's first hit that are hits again (NaN when no
      turn follows a hit, e.g. with ``task.stop_on_success=true``);
    - ``turns_to_success``: mean 1-based index of the first hit over the rollouts with one (NaN when none);
    - ``turns``: mean turns taken.

    Shape:
        turn_scores: [B, K] float, turn_mask: [B, K] bool (a prefix of the K turns per rollout).
    """
    mask = turn_mask.bool()
    hit = (turn_scores >= success - 1e-9) & mask
    seen = hit.cummax(1).values  # a hit at some turn t <= k
    within = seen.float()
    within = torch.cat([within, within[:, -1:].expand(-1, max(max_turns - within.shape[1], 0))], 1)
    solved = seen[:, -1]
    final = hit.gather(1, (mask.sum(1, keepdim=True) - 1).clamp_min(0)).squeeze(1)
    after = torch.cat([torch.zeros_like(seen[:, :1]), seen[:, :-1]], 1) & mask  # turns after the first hit
    first = hit.float().argmax(1) + 1.0
    return {**{f"pass@turn{k + 1}": within[:, k].mean().item() for k in range(within.shape[1])},
            "success": final.float().mean().item(),
            "regress_after_success": (solved & ~final).float().mean().item(),
            "maintain_rate": ((hit & after).sum() / after.sum()).item() if after.any() else float("nan"),
            "turns_to_success": first[solved].mean().item() if solved.any() else float("nan"),
            "turns": mask.sum(1).float().mean().item()}


class TCPOModule(GRPOModule):
    """GRPO base + what turn credit needs. The credit estimator is injected as usual: ``credit=tcpo`` (any
    preset of the ladder), ``credit=mt_grpo`` (the MT-GRPO baseline) or ``credit=grpo``.

    Counterfactual resampling (when the estimator has ``uses_counterfactual``, i.e. preset ``tcpo`` with
    ``w_cf != 0``): the top ``cf_top_l`` turns per group by ``cf_select`` (``surprisal``: mean negative
    behaviour log-prob of the turn; ``random``; ``all``) are resampled ``cf_samples`` times from their exact
    history tokens (``input_ids[i, :turn_starts[i, k]]``) with the rollout engine and sampling settings,
    each alternative scored by :meth:`score_alternative` (the environment's verifier at that turn); the result is
    ``reward_parts["alt_scores"]`` [B, K, M] (NaN where not sampled) and ``reward_parts["cf_mask"]`` [B, K].

    Metrics (``<stage>/``, see :func:`turn_metrics`): ``pass@turn{k}`` (best-turn pass rate within the
    first k turns, k = 1..K), ``success`` (the final turn succeeds: the outcome), ``regress_after_success``,
    ``maintain_rate``, ``turns_to_success`` (mean 1-based turn of the first success, over the rollouts that
    succeed), ``turns`` (mean turns taken); ``tcpo/cf_turns`` and ``tcpo/cf_alt_mean`` when
    counterfactuals run. Credit by turn type and turn index come from the estimator (``credit/turn_type/*``,
    ``credit/turn/*``).
    """

    def __init__(self, *args, cf_top_l: int = 5, cf_samples: int = 4, cf_select: str = "surprisal",
                 success: float = 1.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if cf_samples < 1 or cf_top_l < 1:
            raise ValueError(f"method.cf_samples={cf_samples}, method.cf_top_l={cf_top_l}: both must be >= 1")
        self.cf_top_l, self.cf_samples, self.cf_select, self.success = cf_top_l, cf_samples, cf_select, success
        self._cf_generator = torch.Generator().manual_seed(0)

    def rollout_metrics(self, batch: RolloutBatch, stage: str) -> dict[str, float]:
        logs = super().rollout_metrics(batch, stage)
        if batch.turn_scores is None:
            return logs
        env = getattr(self.trainer.datamodule, "env", None) if self._trainer is not None else None
        metrics = turn_metrics(batch.turn_scores, batch.turn_mask, self.success, getattr(env, "max_turns", 1))
        return logs | {f"{stage}/{k}": v for k, v in metrics.items()}

    def scored_turns(self, batch: RolloutBatch) -> torch.Tensor | None:
        """[B, K] bool: the turns that carry a score and may be resampled (the verifier's turns), or None."""
        return None if batch.turn_scores is None else batch.turn_mask.bool()

    def score_alternative(self, row: dict, turn: int, reply: str) -> float:
        """The score of an alternative ``reply`` at ``turn``: the environment's verifier."""
        return self.rollouts.env.step(row, turn, reply).score or 0.0

    @torch.no_grad()
    def augment_experience(self, batch: RolloutBatch) -> dict[str, float]:
        mask = self.scored_turns(batch)
        if not getattr(self.credit, "uses_counterfactual", False) or mask is None:
            return {}
        selected = select_counterfactual_turns(batch.turn_surprisal(), mask, batch.group_ids, top_l=self.cf_top_l,
                                               mode=self.cf_select, generator=self._cf_generator)
        rollout, turn = selected.nonzero(as_tuple=True)
        starts = batch.turn_starts()[rollout, turn].tolist()
        prefixes = [batch.input_ids[i, :s].tolist() for i, s in zip(rollout.tolist(), starts)]
        data = self.rollouts
        alternatives = data.engine.generate(prefixes, replace(data.sampling, n=self.cf_samples)) if prefixes else []
        rows = [batch.metadata[i]["row"] for i in rollout.tolist()]
        scores = [[self.score_alternative(row, k, c.text) for c in alts]
                  for row, k, alts in zip(rows, turn.tolist(), alternatives)]
        alt = torch.full((*mask.shape, self.cf_samples), float("nan"), device=mask.device)
        if scores:
            alt[rollout, turn] = torch.tensor(scores, dtype=alt.dtype, device=alt.device)
        batch.reward_parts["alt_scores"], batch.reward_parts["cf_mask"] = alt, selected
        return {"tcpo/cf_turns": float(len(prefixes)),
                "tcpo/cf_alt_mean": alt.nanmean().item() if scores else float("nan")}
