"""Credit estimators by name.

An estimator is a small plain class with keyword-only, type-hinted ``__init__`` arguments stored as
attributes (or a dataclass of its settings), so Hydra (``_target_: lit_credit.credit.GRPOCredit``) and
LightningCLI (``class_path: lit_credit.credit.GRPOCredit``) build the same object. Calling it on a
:class:`~lit_credit.types.RolloutBatch` returns a :class:`~lit_credit.types.CreditOutput`.

``@register(name)`` is the one place an estimator is named: ``conf/credit/<name>.yaml`` must carry the same name
(a test holds every config to its registered class), ``get(name)`` and the benchmarks find it by it, and every
module of ``lit_credit.credit`` is imported with the package, so a new file registers itself. The registration
also says how the estimator is checked against a plain loop: ``loop_reference=fn`` (a per-rollout Python loop of
the same formula, ``fn(batch, **kwargs) -> [B, T]``) or ``without_loop_reference="why"``; the shipped estimators'
loops are in ``benchmarks/loop_reference.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, TypeVar

import torch
from torch import Tensor

from lit_credit.interfaces import CreditEstimator
from lit_credit.types import RolloutBatch

MAX_LISTED_ROWS = 10


@dataclass(frozen=True)
class Registration:
    """What ``@register`` recorded of an estimator: its class and how it is checked against a plain loop
    (``loop_reference``, or the reason it has none, ``without_loop_reference``; both None for the shipped
    estimators, whose loops ``benchmarks/loop_reference.py`` holds)."""

    cls: type[CreditEstimator]
    loop_reference: Callable[..., Tensor] | None = None
    without_loop_reference: str | None = None


_REGISTRY: dict[str, Registration] = {}
_E = TypeVar("_E", bound=type[CreditEstimator])


def register(name: str, *, loop_reference: Callable[..., Tensor] | None = None,
             without_loop_reference: str | None = None) -> Callable[[_E], _E]:
    """Class decorator: make ``get(name)`` return the class. A name can be registered once, and is a Python
    identifier (it is the config's file name, ``credit=<name>``). ``loop_reference`` / ``without_loop_reference``:
    see the module docstring (at most one of them)."""
    if not name.isidentifier():
        raise ValueError(f"credit estimator name {name!r}: must be a Python identifier (it names "
                         f"conf/credit/<name>.yaml), e.g. {name.replace('-', '_').replace('.', '_')!r}")
    if loop_reference is not None and without_loop_reference is not None:
        raise ValueError(f"credit estimator {name!r}: give loop_reference or without_loop_reference, not both")

    def add(cls: _E) -> _E:
        if name in _REGISTRY:
            raise ValueError(
                f"credit estimator {name!r} is already registered ({_REGISTRY[name].cls.__qualname__})"
            )
        _REGISTRY[name] = Registration(cls, loop_reference, without_loop_reference)
        return cls

    return add


def registration(name: str) -> Registration:
    """What ``@register(name)`` recorded; a miss raises KeyError listing the valid names."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown credit estimator {name!r}; valid names: {', '.join(available())}") from None


def get(name: str) -> type[CreditEstimator]:
    """The estimator class registered as ``name``; a miss raises KeyError listing the valid names."""
    return registration(name).cls


def name_of(cls: type[CreditEstimator]) -> str:
    """The name ``cls`` is registered under; KeyError when it is not registered."""
    for name, entry in _REGISTRY.items():
        if entry.cls is cls:
            return name
    raise KeyError(f"{cls.__qualname__} is not a registered credit estimator; fix: decorate it with "
                   "@lit_credit.credit.register(name)")


def available() -> list[str]:
    """Registered names, sorted."""
    return sorted(_REGISTRY)


def check_batch(batch: RolloutBatch, values: Mapping[str, Tensor | tuple[Tensor, Tensor]]) -> None:
    """The input check every registered estimator runs before computing credit.

    Raises ``ValueError`` (naming the field and the fix) when the batch has no rollout (``B = 0``), when a
    value does not have one row per rollout, or when a value holds NaN / inf. ``values`` maps a field's
    name (as the message shows it, e.g. ``"batch.scores"``) to its tensor, or to ``(tensor, where)`` to
    check only where the bool ``where`` (same leading dims, e.g. ``turn_mask`` for ``turn_scores``) is set.
    Inside a training run the data module zeroes and counts non-finite rewards before credit sees them, so
    this fires only on batches built by hand or by a broken reward.

    Shape:
        every value: [B, ...]; where: [B, ...] with a prefix of the value's shape.
    """
    n_rows = batch.response_mask.shape[0] if batch.response_mask.dim() else 0
    if n_rows == 0:
        raise ValueError("empty batch: batch.response_mask has 0 rows (B = 0); fix: skip the credit step "
                         "when no rollout is left (e.g. after dynamic sampling dropped every group)")
    for name, value in {"batch.group_ids": batch.group_ids, **values}.items():
        tensor, where = value if isinstance(value, tuple) else (value, None)
        if tensor.dim() == 0 or tensor.shape[0] != n_rows:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)} but the batch has {n_rows} rollouts "
                             f"(batch.response_mask rows); fix: give one value per rollout")
        bad = ~torch.isfinite(tensor)
        if where is not None:
            bad &= where.bool().reshape(*where.shape, *[1] * (tensor.dim() - where.dim()))
        if bad.any():
            rows = bad.reshape(n_rows, -1).any(1).nonzero().flatten().tolist()
            listed = f"{rows[:MAX_LISTED_ROWS]}"[:-1] + (", ...]" if len(rows) > MAX_LISTED_ROWS else "]")
            raise ValueError(f"{name} has {int(bad.sum())} non-finite values (NaN/inf) at rows {listed}; "
                             "fix: the reward must return finite floats")


BatchDict = Literal["reward_parts", "turn_parts", "extras"]


def require_parts(batch: RolloutBatch, keys: Iterable[str], *, credit: str, fix: str,
                  field: BatchDict = "reward_parts") -> None:
    """Raise ``ValueError`` naming each missing key an estimator reads as ``batch.<field>[key]`` (``field``:
    the reward's ``reward_parts`` [B] or ``turn_parts`` [B, K], or the augmenters' ``extras``), what the batch
    has there, and the fix."""
    have = getattr(batch, field)
    missing = [k for k in sorted(keys) if k not in have]
    if missing:
        names = ", ".join(f"batch.{field}[{k!r}]" for k in missing)
        raise ValueError(f"credit={credit} needs {names} (batch.{field} has {sorted(have)}); fix: {fix}")
