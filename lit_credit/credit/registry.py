"""Credit estimators by name.

An estimator is a small plain class with keyword-only, type-hinted ``__init__`` arguments stored as
attributes, so Hydra (``_target_: lit_credit.credit.GRPOCredit``) and LightningCLI
(``class_path: lit_credit.credit.GRPOCredit``) build the same object. Calling it on a
:class:`~lit_credit.types.RolloutBatch` returns a :class:`~lit_credit.types.CreditOutput`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TypeVar

from lit_credit.types import CreditOutput, RolloutBatch


class CreditEstimator(ABC):
    """``RolloutBatch -> CreditOutput``: per-token advantages, zero wherever ``response_mask == 0``."""

    @abstractmethod
    def __call__(self, batch: RolloutBatch) -> CreditOutput: ...

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


_REGISTRY: dict[str, type[CreditEstimator]] = {}
_E = TypeVar("_E", bound=type[CreditEstimator])


def register(name: str) -> Callable[[_E], _E]:
    """Class decorator: make ``get(name)`` return the class. A name can be registered once."""

    def add(cls: _E) -> _E:
        if name in _REGISTRY:
            raise ValueError(
                f"credit estimator {name!r} is already registered ({_REGISTRY[name].__qualname__})"
            )
        _REGISTRY[name] = cls
        return cls

    return add


def get(name: str) -> type[CreditEstimator]:
    """The estimator class registered as ``name``; a miss raises KeyError listing the valid names."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown credit estimator {name!r}; valid names: {', '.join(available())}") from None


def available() -> list[str]:
    """Registered names, sorted."""
    return sorted(_REGISTRY)
