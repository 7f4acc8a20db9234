"""DPA-GRPO role rewards and case taxonomy (docs/methods.md §3).

A structured form is filled one line at a time. The generator proposes a line value x; the verifier
answers NS (accept silently) or SAC (a structured challenge). On SAC the generator samples K revisions,
one of them, z, is shown (:func:`shown_revision`: officially the first that matches gold, else the first
parsable), and the generator in its approver role answers KEEP (submit x) or REVISE (submit z). The
oracle gives ``S_x, S_z in {0, 1}`` (strict line correctness); an unparsable x counts as wrong, and when no
revision is parsable z counts as wrong.

Every function is vectorised over decisions (no Python loop). The pair tensors hold both canonical
actions of a decision, in the column order of :data:`VERIFIER_ACTIONS` / :data:`APPROVER_ACTIONS`, ready
for :func:`lit_credit.credit.dpa_pair_advantages`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

CASES: tuple[str, ...] = ("1", "2", "3", "4", "5a", "5b", "6a", "6b")
CASE_IDS = torch.tensor([1, 2, 3, 4, 5, 5, 6, 6])  # the official code's case_id of each case: 5a/5b -> 5, 6a/6b -> 6
SHOWN_REVISION_RULES: tuple[str, ...] = ("gold_first", "first_parsable", "first")
VERIFIER_ACTIONS: tuple[str, ...] = ("SAC", "NS")
APPROVER_ACTIONS: tuple[str, ...] = ("KEEP", "REVISE")


def _flags(**tensors: Tensor) -> int:
    """Check that every tensor is a 1-D bool vector of one common length; return that length."""
    n = None
    for name, t in tensors.items():
        if not isinstance(t, Tensor) or t.dim() != 1 or t.dtype != torch.bool:
            got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 1-D bool tensor [N], got {got}")
        if n is None:
            n = len(t)
        elif len(t) != n:
            first = next(iter(tensors))
            raise ValueError(f"{name} has N={len(t)} but {first} has N={n}")
    return 0 if n is None else n


def _labels(labels: Tensor) -> None:
    """Check that ``labels`` is a 1-D integer tensor of indices into :data:`CASES`."""
    if not isinstance(labels, Tensor) or labels.dim() != 1 or labels.dtype.is_floating_point \
            or labels.dtype.is_complex or labels.dtype == torch.bool:
        got = f"{tuple(labels.shape)} {labels.dtype}" if isinstance(labels, Tensor) else type(labels).__name__
        raise ValueError(f"labels must be a 1-D integer tensor [N], got {got}")
    if labels.numel() and (labels.min() < 0 or labels.max() >= len(CASES)):
        raise ValueError(f"labels must index CASES (0..{len(CASES) - 1}), got values outside that range")


def verifier_pair_rewards(x_correct: Tensor) -> Tensor:
    """Both verifier actions scored: ``r(SAC) = 1[x wrong]``, ``r(NS) = 1[x right]``.

    Decisions where x is unparsable are skipped by the caller (an unparsable x would count as wrong,
    i.e. SAC 1, NS 0, if passed in).

    Shape:
        x_correct: [N] bool. Output: [N, 2] float (default dtype), columns ``VERIFIER_ACTIONS`` (SAC, NS).
    """
    _flags(x_correct=x_correct)
    right = x_correct.to(torch.get_default_dtype())
    return torch.stack([1 - right, right], dim=1)


def revision_rewards(correct: Tensor, parsable: Tensor, *, unparsable: float = -0.25) -> Tensor:
    """Each of the K sampled revisions gets ``S_z`` if parsable, else ``unparsable`` (-0.25).

    ``correct`` is ignored where not ``parsable``. Groups whose rewards are all equal are skipped
    (see :func:`informative_groups`).

    Shape:
        correct, parsable: [N, K] bool. Output: [N, K] float (default dtype).
    """
    for name, t in (("correct", correct), ("parsable", parsable)):
        if not isinstance(t, Tensor) or t.dim() != 2 or t.dtype != torch.bool:
            got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 2-D bool tensor [N, K], got {got}")
    if correct.shape != parsable.shape:
        raise ValueError(f"parsable has shape {tuple(parsable.shape)} but correct has {tuple(correct.shape)}")
    score = correct.to(torch.get_default_dtype())
    return torch.where(parsable, score, torch.full_like(score, unparsable))


def informative_groups(rewards: Tensor) -> Tensor:
    """``True`` for rows whose rewards are not all equal; the rest carry no signal and are skipped.

    Shape:
        rewards: [N, K]. Output: [N] bool (all ``False`` when K = 0).
    """
    if not isinstance(rewards, Tensor) or rewards.dim() != 2:
        got = tuple(rewards.shape) if isinstance(rewards, Tensor) else type(rewards).__name__
        raise ValueError(f"rewards must be a 2-D tensor [N, K], got {got}")
    return (rewards != rewards[:, :1]).any(dim=1)


def shown_revision(correct: Tensor, parsable: Tensor, rule: str = "gold_first") -> Tensor:
    """Index of the revision shown to the approver among each decision's K samples.

    * ``gold_first`` (the official code's best-of-K): the first revision that matches gold, else the first
      parsable one, else the first. It reads the oracle, so the approver's input depends on gold at training
      time (its shown revision is right whenever any of the K is); with one revision (validation) there is
      no choice and nothing of gold leaks.
    * ``first_parsable``: the first parsable revision, else the first (no gold).
    * ``first`` (a later official commit): the first sample, on-policy (no gold).

    Vectorised as ``argmax`` of the score ``2 [right] + [parsable]`` (``[parsable]``, 0): ``argmax`` returns
    the first maximum, as the official loop (which replaces its pick only on a strictly higher score) does.
    E.g. parsable ``[F, T, T, T]``, right ``[F, F, T, T]``: gold_first 2, first_parsable 1, first 0.

    Shape:
        correct, parsable: [N, K] bool (``correct`` read only where parsable). Output: [N] long.
    """
    for name, t in (("correct", correct), ("parsable", parsable)):
        if not isinstance(t, Tensor) or t.dim() != 2 or t.dtype != torch.bool:
            got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 2-D bool tensor [N, K], got {got}")
    if rule not in SHOWN_REVISION_RULES:
        raise ValueError(f"method.shown_revision={rule!r}: use one of {SHOWN_REVISION_RULES}")
    if rule == "first":
        return torch.zeros(len(parsable), dtype=torch.long, device=parsable.device)
    score = parsable.long() + (2 * (correct & parsable).long() if rule == "gold_first" else 0)
    return score.argmax(1)


def reviser_pair_rewards(
    x_correct: Tensor, z_correct: Tensor, has_revision: Tensor, *, alpha: float = 0.5, unparsable: float = -0.25
) -> Tensor:
    """The reviser's paired keep-text vs revise-text rewards (the official filer KEEP/REVISE update).

    Under the reviser's prompt two replies are scored: the keep text (x again) and the revise text (the shown
    revision z), with the counterfactual decision reward ``(1, 0)`` if x is right, ``(0, 1)`` if wrong, plus
    the outcome bonus ``alpha * S`` (the official ``filer_outcome_bonus``, the approver table's alpha)::

        keep   = 1[x right] + alpha * S_x
        revise = 1[x wrong] + alpha * S_z        (unparsable z: 1[x wrong] + unparsable)

    x right: (1.5, 0.5) or (1.5, 0) or (1.5, -0.25); x wrong: (0, 1.5) or (0, 1) or (0, 0.75). After pair
    normalisation the keep text gets +1 exactly when x is right and the revise text +1 exactly when x is
    wrong, whether z is right or not (as in the official code).

    Shape:
        x_correct, z_correct, has_revision: [N] bool. Output: [N, 2] float (default dtype), columns (keep,
        revise).
    """
    _flags(x_correct=x_correct, z_correct=z_correct, has_revision=has_revision)
    s_x = x_correct.to(torch.get_default_dtype())
    s_z = (z_correct & has_revision).to(s_x.dtype)
    keep = s_x + alpha * s_x
    revise = (1 - s_x) + torch.where(has_revision, alpha * s_z, torch.full_like(s_z, unparsable))
    return torch.stack([keep, revise], dim=1)


def approver_pair_rewards(
    x_correct: Tensor,
    z_correct: Tensor,
    has_revision: Tensor,
    *,
    alpha: float = 0.5,
    cave: float = 0.2,
    miss: float = 0.3,
    unparsable: float = -0.25,
) -> Tensor:
    """Both approver actions scored (``S = 1[right]``)::

        situation                  KEEP              REVISE
        no parsable revision       1                 unparsable (-0.25)
        x right, z right           1 + alpha*S_x     alpha*S_z
        x right, z wrong           1 + alpha*S_x     -cave
        x wrong, z right           -miss             1 + alpha*S_z
        x wrong, z wrong           1                 alpha*S_z

    With ``alpha, cave, miss = 0.5, 0.2, 0.3``: (1.5, 0.5), (1.5, -0.2), (-0.3, 1.5), (1, 0), and (1, -0.25)
    without a revision. ``z_correct`` is ignored where ``~has_revision``.

    Shape:
        x_correct, z_correct, has_revision: [N] bool. Output: [N, 2] float (default dtype), columns
        ``APPROVER_ACTIONS`` (KEEP, REVISE).
    """
    _flags(x_correct=x_correct, z_correct=z_correct, has_revision=has_revision)
    z_correct = z_correct & has_revision
    s_x = x_correct.to(torch.get_default_dtype())
    s_z = z_correct.to(s_x.dtype)
    one = torch.ones_like(s_x)
    keep = torch.where(x_correct, 1 + alpha * s_x, torch.where(z_correct, -miss * one, one))
    revise = torch.where(
        x_correct,
        torch.where(z_correct, alpha * s_z, -cave * one),
        torch.where(z_correct, 1 + alpha * s_z, alpha * s_z),
    )
    keep = torch.where(has_revision, keep, one)
    revise = torch.where(has_revision, revise, unparsable * one)
    return torch.stack([keep, revise], dim=1)


REVISE_SHARES = ("all", "unforced")
REVISE_BONUS_ON = ("reward", "advantage")


def revise_share(own_revise: Sequence[bool], forced: Sequence[bool], rule: str = "all") -> float:
    """The REVISE share the bonus of :func:`revise_bonus` reads, over the step's challenged decisions
    (``game.revise_share``; 0 with none).

    ``own_revise[j]``: the approver itself answered REVISE on decision j; ``forced[j]``: exploration forced a
    decision that was not REVISE to REVISE (so ``own_revise[j]`` and ``forced[j]`` are never both set).

    - ``"all"`` (official): ``#(own or forced) / n``, forced REVISEs counted as REVISE. With exploration
      eps its expectation is ``p + eps (1 - p) >= eps``, p the approver's own REVISE rate: at the paper's
      eps = 0.4 it is at least 0.4 whatever p is, above the 0.30 target, so the bonus is 0 (up to sampling
      noise of small steps) and the shaping is inert.
    - ``"unforced"``: ``#own / n``, the approver's own REVISE rate, the share the paper's text describes
      (forced decisions count as the KEEP the approver chose). 10 challenges, 1 own REVISE and 3 forced:
      all 4/10 = 0.4 (bonus 0 at target 0.3), unforced 1/10 = 0.1 (bonus 1.5 * 0.2 = 0.3).
    """
    if rule not in REVISE_SHARES:
        raise ValueError(f"game.revise_share={rule!r}: use one of {', '.join(REVISE_SHARES)}")
    if len(own_revise) != len(forced):
        raise ValueError(f"own_revise has {len(own_revise)} decisions, forced {len(forced)}: give one flag each")
    if any(o and f for o, f in zip(own_revise, forced)):
        raise ValueError("a decision is both the approver's own REVISE and a forced one; forcing only applies "
                         "to decisions that were not REVISE")
    n = len(own_revise)
    revised = sum(bool(o) or (rule == "all" and bool(f)) for o, f in zip(own_revise, forced))
    return revised / n if n else 0.0


def revise_bonus(revise_share: float | Tensor, *, balance: float = 0.0, target: float = 0.3) -> float | Tensor:
    """REVISE shaping ``balance * max(target - revise_share, 0)`` (the official homeostatic balance); 0 with
    the default balance. ``revise_share`` is the step's share of REVISE among the approver's decisions
    (:func:`revise_share`): officially forced explorations included, as the official update computes it over
    its batch, which makes the bonus inert at the paper's settings (forced REVISE alone gives a share of at
    least ``explore_revise`` = 0.4 > 0.3); ``game.revise_share=unforced`` counts the approver's own only.

    The official code adds it to the REVISE *reward* before pair normalisation (DPA-GRPO's
    ``game.revise_bonus_on=reward``). There it never changes a pair advantage, which is
    sign(r_KEEP - r_REVISE): wherever KEEP wins by the table it wins by at least 1, and the paper's bonus is at
    most 1.5 * 0.3 = 0.45. ``revise_bonus_on=advantage`` adds it to the REVISE pair advantage instead, where
    it acts.

    With shaping on (``balance=1.5, target=0.3``) an observed REVISE share of 0.1 gives
    ``1.5 * 0.2 = 0.3``; a share at or above the target gives 0.

    Shape:
        revise_share (the observed share of REVISE among approver decisions, in [0, 1]): a float, or a tensor
            of shares (one per seed in the credit-learning benchmark).
        Output: a float, or a tensor of revise_share's shape.
    """
    if isinstance(revise_share, Tensor):
        if ((revise_share < 0) | (revise_share > 1)).any():
            raise ValueError(f"revise_share must be in [0, 1], got {revise_share}")
        return balance * (target - revise_share).clamp_min(0.0)
    if not 0.0 <= float(revise_share) <= 1.0:
        raise ValueError(f"revise_share must be in [0, 1], got {revise_share}")
    return balance * max(target - float(revise_share), 0.0)


@dataclass(kw_only=True)
class DPASettings:
    """DPA-GRPO's role-reward settings, passed whole: the approver table, the REVISE shaping, the rarity weight
    and the exploration. A game that plays DPA's decisions is this dataclass (the form game:
    :class:`~lit_credit.tasks.form_game.FormGame`, each field the config key ``game.<field>``, conf/game/form.yaml,
    which a test holds to these fields and defaults); the credit-learning benchmark's decision family takes one.
    A setting is added here and in the YAML file, nowhere else. Defaults: the official code's, with the paper's
    shaping on.

    - ``alpha``, ``cave``, ``miss``, ``unparsable``: the approver table (:func:`approver_pair_rewards`); ``alpha``
      and ``unparsable`` also score the reviser (:func:`reviser_pair_rewards`, :func:`revision_rewards`).
    - ``revise_balance``, ``revise_target``: the REVISE bonus ``balance * max(target - share, 0)``
      (:meth:`bonus`, :func:`revise_bonus`).
    - ``revise_share``: the share the bonus reads (:func:`revise_share`): ``all`` (official, forced REVISEs
      counted) or ``unforced``.
    - ``revise_bonus_on``: ``reward`` (official, added to the REVISE reward before pair normalisation) or
      ``advantage`` (added to the REVISE row's advantage).
    - ``rarity_power``: the approver pairs' weight ``(mean case count / case count)^rarity_power``
      (:func:`rarity_weights`).
    - ``explore_revise``: in training, a decision that is not REVISE is forced to REVISE with this probability.

    A value outside its range or choices is a ``ValueError`` at construction naming ``game.<field>``.
    """

    alpha: float = 0.5
    cave: float = 0.2
    miss: float = 0.3
    unparsable: float = -0.25
    revise_balance: float = 1.5
    revise_target: float = 0.3
    revise_share: str = "all"
    revise_bonus_on: str = "reward"
    rarity_power: float = 1.0
    explore_revise: float = 0.4

    def __post_init__(self) -> None:
        if not 0 <= self.explore_revise <= 1:
            raise ValueError(f"game.explore_revise={self.explore_revise}: must be in [0, 1]")
        self.check_choices({"revise_share": REVISE_SHARES, "revise_bonus_on": REVISE_BONUS_ON})

    def check_choices(self, choices: dict[str, tuple[str, ...]]) -> None:
        """A ``ValueError`` naming ``game.<field>`` and its valid values for a field outside ``choices[field]``."""
        for key, valid in choices.items():
            if getattr(self, key) not in valid:
                raise ValueError(f"game.{key}={getattr(self, key)!r}: use one of {', '.join(valid)}")

    def approver_rewards(self, x_correct: Tensor, z_correct: Tensor, has_revision: Tensor) -> Tensor:
        """:func:`approver_pair_rewards` with this table. Shape: [N] bool each -> [N, 2] (KEEP, REVISE)."""
        return approver_pair_rewards(x_correct, z_correct, has_revision, alpha=self.alpha, cave=self.cave,
                                     miss=self.miss, unparsable=self.unparsable)

    def bonus(self, share: float | Tensor) -> float | Tensor:
        """:func:`revise_bonus` ``revise_balance * max(revise_target - share, 0)`` of the step's REVISE share."""
        return revise_bonus(share, balance=self.revise_balance, target=self.revise_target)


def case_labels(
    x_correct: Tensor,
    challenged: Tensor,
    revised: Tensor,
    z_correct: Tensor,
    *,
    has_revision: Tensor | None = None,
) -> Tensor:
    """Index into :data:`CASES` of each decision::

        1   x right, NS                      4   x wrong, NS (missed error)
        2   x right, SAC, REVISE             5a  x wrong, SAC, REVISE, z right
        3   x right, SAC, KEEP               5b  x wrong, SAC, REVISE, z wrong
                                             6a  x wrong, SAC, KEEP, z wrong (rightly refused a bad revision)
                                             6b  x wrong, SAC, KEEP, z right (missed a fix)

    ``revised`` is read only where challenged, ``z_correct`` only where x is wrong and challenged. With no
    parsable revision z counts as wrong: pass ``z_correct = False`` there, or pass ``has_revision`` and
    ``z_correct`` is masked with it.

    Shape:
        x_correct, challenged, revised, z_correct, has_revision (optional): [N] bool. Output: [N] long.
    """
    flags = {"x_correct": x_correct, "challenged": challenged, "revised": revised, "z_correct": z_correct}
    if has_revision is not None:
        flags["has_revision"] = has_revision
    _flags(**flags)
    if has_revision is not None:
        z_correct = z_correct & has_revision

    def idx(name: str) -> Tensor:
        return torch.full_like(x_correct, CASES.index(name), dtype=torch.long)

    right = torch.where(challenged, torch.where(revised, idx("2"), idx("3")), idx("1"))
    wrong_revise = torch.where(z_correct, idx("5a"), idx("5b"))
    wrong_keep = torch.where(z_correct, idx("6b"), idx("6a"))
    wrong = torch.where(challenged, torch.where(revised, wrong_revise, wrong_keep), idx("4"))
    return torch.where(x_correct, right, wrong)


def case_shares(labels: Tensor) -> dict[str, float]:
    """``{case: count(case) / N}`` for every name in :data:`CASES` (0.0 for absent cases; all 0.0 when
    N = 0).

    Shape:
        labels: [N] integer, indices into ``CASES``. Output: a dict of 8 floats.
    """
    _labels(labels)
    counts = torch.bincount(labels, minlength=len(CASES)).double()
    shares = counts / max(len(labels), 1)
    return dict(zip(CASES, shares.tolist()))


def rarity_weights(labels: Tensor, power: float = 0.0, *, merge_subcases: bool = False) -> Tensor:
    """Optional loss weight ``w_n = (mean_c count(c) / count(case_n)) ** power``, the mean over the cases
    present in ``labels``; all ones when ``power = 0`` (the default, shaping off).

    E.g. counts 3 and 1 (mean 2) with ``power = 1``: weights 2/3 on the common case, 2 on the rare one.
    ``merge_subcases``: count by the official ``case_id`` (:data:`CASE_IDS`: 5a and 5b are one case, 6a and 6b
    one), as the official approver update does (over the challenged decisions only, see DPA-GRPO).

    Shape:
        labels: [N] integer, indices into ``CASES``. Output: [N] float (default dtype).
    """
    _labels(labels)
    dtype = torch.get_default_dtype()
    if power == 0 or labels.numel() == 0:
        return torch.ones(labels.shape, dtype=dtype, device=labels.device)
    if merge_subcases:
        labels = CASE_IDS.to(labels.device)[labels]
    counts = torch.bincount(labels, minlength=len(CASES)).to(dtype)
    mean = counts[counts > 0].mean()
    return (mean / counts[labels]) ** power
