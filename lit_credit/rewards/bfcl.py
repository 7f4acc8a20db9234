"""The rewards of ``task=bfcl`` (``reward=bfcl``, the task's default): BFCL's single-turn categories are scored by
HierR with BFCL's AST rules (:class:`~lit_credit.rewards.hierr.HierRReward` applies them itself to a row with a
``possible_answer``), the multi-turn categories by BFCL's per-turn checks (:class:`BFCLMultiTurnReward`).

One run scores one kind: :func:`bfcl_reward` (the ``_target_`` of ``conf/reward/bfcl.yaml``) builds HierR for
single-turn categories and :class:`BFCLMultiTurnReward` for multi-turn ones, and refuses a mix (``task=bfcl``
refuses it too). Nothing here imports a task: a multi-turn row says how many user turns it has
(``bfcl_ground_truth``, BFCL's ground truth per user turn) and the episode's turn scores say which passed.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from lit_credit.rewards.hierr import HierRReward
from lit_credit.types import RewardResult

MULTI_TURN_PREFIX = "multi_turn"


def is_multi_turn(category: str) -> bool:
    """Whether a BFCL category is a multi-turn one (``multi_turn_base``, ...)."""
    return str(category).startswith(MULTI_TURN_PREFIX)


def category_names(categories: Any) -> list[str]:
    """``task.categories`` as a list of names (a list, or a comma- or space-separated string; None: none)."""
    if categories is None:
        return []
    names = re.split(r"[,\s]+", categories) if isinstance(categories, str) else [str(c) for c in categories]
    return [c for c in names if c]


def refuse_mixed(categories: Iterable[str]) -> None:
    """A ``ValueError`` naming the fix when ``categories`` mix single-turn and multi-turn BFCL categories."""
    names = list(categories)
    multi = [c for c in names if is_multi_turn(c)]
    single = [c for c in names if not is_multi_turn(c)]
    if multi and single:
        raise ValueError(f"task.categories={names} mixes single-turn {single} and multi-turn {multi} BFCL "
                         "categories: a run scores one kind (HierR with BFCL's AST rules, or BFCL's per-turn state "
                         "and response checks); run them separately, e.g. task.categories=[" + ",".join(single)
                         + "] and task.categories=[" + ",".join(multi) + "]")


def user_turns(row: Mapping[str, Any]) -> int:
    """The number of user turns of a BFCL multi-turn row (the length of its ground truth)."""
    truth = row.get("bfcl_ground_truth")
    if truth is None:
        raise ValueError(f"row {row.get('id')!r} is no BFCL multi-turn row (no bfcl_ground_truth): "
                         "BFCLMultiTurnReward scores task=bfcl task.categories=[multi_turn_base] rows")
    return len(json.loads(truth) if isinstance(truth, str) else truth)


class BFCLMultiTurnReward:
    """BFCL's multi-turn accuracy, per user turn (``task=bfcl task.categories=[multi_turn_base]``).

    The environment (:class:`~lit_credit.tasks.bfcl_multi_turn.BFCLMultiTurnEnvironment`) scores each user turn
    where it ends (``Feedback.score`` of the reply that ends it: 1 when BFCL's checks pass, else 0; None on the
    tool-call steps within a turn). ``score`` = passed user turns / the row's user turns (a turn the episode
    never finished, cut by the turn limit or BFCL's step limit, failed). Parts: ``turn_pass`` (= ``score``),
    ``all_turns`` (1 when every user turn passed: BFCL's verdict on the entry, the leaderboard's accuracy) and
    ``turns_ended`` (the share of user turns the episode finished). ``turns["bfcl_turn_pass"]``: per assistant
    turn, the score of the user turn it ended (0 elsewhere, with ``bfcl_turn_end`` 1 where a user turn ended).

    Needs the environment's turn scores (``turn_scores``); without them it is a ``ValueError``."""

    @property
    def part_weights(self) -> dict[str, float]:
        """``score`` is the ``turn_pass`` part (:class:`~lit_credit.interfaces.Reward`'s ``part_weights``)."""
        return {"turn_pass": 1.0}

    def __call__(self, row: dict[str, Any], replies: list[str], tool_responses: Sequence[str] | None = None,
                 turn_scores: Sequence[float | None] | None = None) -> RewardResult:
        n = user_turns(row)
        if turn_scores is None:
            raise ValueError("BFCLMultiTurnReward needs the environment's per-turn scores (turn_scores): the "
                             "multi-turn environment of task=bfcl scores each user turn where it ends")
        ended = [float(s) for s in turn_scores if s is not None]
        passed = sum(ended)
        score = passed / n if n else 1.0
        return RewardResult(
            score,
            parts={"turn_pass": score, "all_turns": float(len(ended) >= n and passed >= n),
                   "turns_ended": len(ended) / n if n else 1.0},
            turns={"bfcl_turn_pass": [float(s or 0.0) for s in turn_scores],
                   "bfcl_turn_end": [float(s is not None) for s in turn_scores]})


def bfcl_reward(categories: Any = None, **hierr: Any) -> HierRReward | BFCLMultiTurnReward:
    """The reward of a ``task=bfcl`` run (``reward=bfcl``): :class:`BFCLMultiTurnReward` when ``categories`` are
    multi-turn, else :class:`~lit_credit.rewards.hierr.HierRReward` with the ``hierr`` settings (``reward=hierr``'s:
    it applies BFCL's AST rules to BFCL rows); a mix of both kinds is a ``ValueError`` naming the fix."""
    names = category_names(categories)
    refuse_mixed(names)
    if names and all(is_multi_turn(c) for c in names):
        return BFCLMultiTurnReward()
    return HierRReward(**hierr)
