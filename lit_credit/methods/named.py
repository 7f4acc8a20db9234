"""The GRPO-family methods by name: :class:`GRPOModule` with a method's credit estimator, augmenter, metric sets and
segment-gradient period as defaults, and nothing else.

``SLCAGRPOModule(policy, loss=...)`` is SLCA-GRPO, ``TCPOModule(policy, loss=...)`` TCPO and
``SLCATCPOModule(policy, loss=...)`` SLCA x TCPO; the same in the LightningCLI (``class_path:
lit_credit.methods.SLCAGRPOModule``) and in Hydra (``method=slca_grpo``, ``method=tcpo``, ``method=slca_tcpo``:
conf/method/grpo.yaml with that method's groups as defaults). Each is its GRPOModule composition (the
experiments ``slca_toolcall``, ``tcpo_math``, ``slca_tcpo_toolcall`` build the same parts on ``GRPOModule``;
tests/methods/test_named_modules.py holds the three doors and the experiments to one composition). A named
module has no step, loss or state of its own: the policy comes first, everything else by name, and every
argument it does not name (``loss``, which GRPOModule requires, the optimiser, the updates, ...) goes to
GRPOModule unchanged.

``credit``, ``augment``, ``metrics`` left None are the method's own (``metrics={}``: no metric set). A credit
estimator of another method is refused, naming the fix: each accepts its estimator class, any of its settings
(TCPO's presets included); ``method=grpo`` (:class:`GRPOModule`) takes any estimator.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from lit_credit.analysis.metrics import ToolMetrics, TurnMetrics
from lit_credit.credit import SLCACredit, SLCATCPOCredit, TCPOCredit, name_of
from lit_credit.interfaces import Augmenter, CreditEstimator, MetricSet
from lit_credit.methods.grpo import GRPOModule
from lit_credit.models.policy import PolicySource
from lit_credit.rollout.augment import CounterfactualTurns


def method_credit(module: type[GRPOModule], credit: CreditEstimator | None) -> CreditEstimator:
    """``credit``, or ``module.ESTIMATOR()`` (its registered defaults) when None; ValueError naming the fix when
    ``credit`` is not a ``module.ESTIMATOR``: a named module trains with its method's estimator only."""
    own = module.ESTIMATOR
    if credit is None:
        return own()
    if not isinstance(credit, own):
        try:
            given = f"credit={name_of(type(credit))} ({type(credit).__name__})"
        except KeyError:  # an unregistered estimator
            given = f"credit {type(credit).__name__}"
        raise ValueError(f"{module.__name__} trains with {own.__name__} (credit={name_of(own)}, any of its "
                         f"settings); {given} conflicts: leave credit to method={module.METHOD} (or give "
                         f"credit={name_of(own)}), or use method=grpo (GRPOModule) for another estimator")
    return credit


class SLCAGRPOModule(GRPOModule):
    """SLCA-GRPO (docs/methods.md §1): :class:`SLCACredit` (segment-level credit, the tool and summary segments
    normalised apart), the tool metric set (:class:`~lit_credit.analysis.metrics.ToolMetrics`) and the segment
    gradient cosine every 10 steps; no augmenter. Hydra: ``method=slca_grpo`` (with ``task=toolcall
    reward=hierr``); the same parts as ``experiment=slca_toolcall``'s GRPOModule."""

    METHOD: ClassVar[str] = "slca_grpo"  # conf/method/slca_grpo.yaml
    ESTIMATOR: ClassVar[type[CreditEstimator]] = SLCACredit  # the credit it accepts (subclasses too)

    def __init__(self, policy: PolicySource, *, credit: CreditEstimator | None = None,
                 augment: Augmenter | None = None, metrics: Mapping[str, MetricSet] | None = None,
                 grad_cosine_every: int = 10, **kwargs: Any) -> None:
        credit = method_credit(type(self), credit)
        metrics = {"tool": ToolMetrics()} if metrics is None else metrics
        super().__init__(policy, credit=credit, augment=augment, metrics=metrics,
                         grad_cosine_every=grad_cosine_every, **kwargs)


class TCPOModule(GRPOModule):
    """TCPO (docs/methods.md §2): :class:`TCPOCredit` (turn-level credit; preset ``tcpo`` by default, any preset of
    the ablation ladder accepted), TCPO's counterfactual resampling scored by the environment's verifier
    (:class:`~lit_credit.rollout.augment.CounterfactualTurns`, idle under a preset that needs no alternatives)
    and the multi-turn metric set (:class:`~lit_credit.analysis.metrics.TurnMetrics`). Hydra: ``method=tcpo``
    (with ``task=math_revise reward=final_turn``); the same parts as ``experiment=tcpo_math``'s GRPOModule."""

    METHOD: ClassVar[str] = "tcpo"  # conf/method/tcpo.yaml
    ESTIMATOR: ClassVar[type[CreditEstimator]] = TCPOCredit  # the credit it accepts (subclasses too)

    def __init__(self, policy: PolicySource, *, credit: CreditEstimator | None = None,
                 augment: Augmenter | None = None, metrics: Mapping[str, MetricSet] | None = None,
                 grad_cosine_every: int = 0, **kwargs: Any) -> None:
        credit = method_credit(type(self), credit)
        augment = CounterfactualTurns() if augment is None else augment
        metrics = {"turn": TurnMetrics()} if metrics is None else metrics
        super().__init__(policy, credit=credit, augment=augment, metrics=metrics,
                         grad_cosine_every=grad_cosine_every, **kwargs)


class SLCATCPOModule(GRPOModule):
    """SLCA x TCPO: :class:`SLCATCPOCredit` (TCPO turn credit on each tool turn, SLCA's summary advantage; any
    preset), counterfactual tool turns scored by the reward's per-turn tool score
    (``CounterfactualTurns(score="reward")``, idle under a preset that needs no alternatives), the tool and
    turn metric sets and the segment gradient cosine every 10 steps. Hydra: ``method=slca_tcpo`` (with
    ``task=toolcall_multistep reward=hierr``); the same parts as ``experiment=slca_tcpo_toolcall``'s GRPOModule."""

    METHOD: ClassVar[str] = "slca_tcpo"  # conf/method/slca_tcpo.yaml
    ESTIMATOR: ClassVar[type[CreditEstimator]] = SLCATCPOCredit  # the credit it accepts (subclasses too)

    def __init__(self, policy: PolicySource, *, credit: CreditEstimator | None = None,
                 augment: Augmenter | None = None, metrics: Mapping[str, MetricSet] | None = None,
                 grad_cosine_every: int = 10, **kwargs: Any) -> None:
        credit = method_credit(type(self), credit)
        augment = CounterfactualTurns(score="reward") if augment is None else augment
        metrics = {"tool": ToolMetrics(), "turn": TurnMetrics()} if metrics is None else metrics
        super().__init__(policy, credit=credit, augment=augment, metrics=metrics,
                         grad_cosine_every=grad_cosine_every, **kwargs)
