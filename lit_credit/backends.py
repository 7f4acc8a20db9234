"""Calls to backends that can fail (the rollout engine, a judge, a tool simulator): timeouts, retries, counts.

Every failure-prone call goes through a :class:`Retry`. Attempt 0 runs at once; retry r (1-based, at most
``max_retries``) runs after sleeping ``backoff * 2**(r-1)`` seconds. An attempt fails when it raises, runs past
``timeout`` seconds, or its result is refused by ``accept``; when every attempt fails, :class:`BackendFailure`
is raised and the caller scores the item as a failure (a zero score, an empty reply) instead of crashing.

Counts go to the process-wide :data:`COUNTS` under ``backend/<name>/{calls,retries,timeouts,failures}``
(and ``backend/reward/{errors,nonfinite}``, ``backend/environment/errors`` from the rollout loop); the training
step logs what changed since its previous step (:class:`CountsSince`).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from time import sleep
from typing import Any, TypeVar

T = TypeVar("T")
COUNTS: Counter[str] = Counter()


class BackendFailure(RuntimeError):
    """Every attempt of a backend call failed (the message names the backend and the last error)."""


def count(key: str, n: int = 1) -> None:
    COUNTS[key] += n


class NotRetried(Exception):
    """An error of the program, not of a backend (a check such as lit_credit.emulation's): :class:`Retry` lets it
    through at once, never retried or counted as the backend's failure."""


@dataclass
class Retry:
    """Call ``fn`` with a per-attempt ``timeout`` (seconds, None: wait), retrying with exponential backoff.

    A timed-out attempt is abandoned, not killed: its thread runs on in the background (Python cannot stop a
    thread), so a backend that hangs for good should have its own deadline too.
    """

    name: str
    max_retries: int = 2
    backoff: float = 0.5
    timeout: float | None = None

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.backoff < 0 or (self.timeout is not None and self.timeout <= 0):
            raise ValueError(f"Retry({self.name!r}): max_retries={self.max_retries}, backoff={self.backoff}, "
                             f"timeout={self.timeout}; fix: max_retries >= 0, backoff >= 0, timeout > 0 or null")

    def __call__(self, fn: Callable[..., T], *args: Any, accept: Callable[[T], bool] | None = None,
                 agree: Callable[[bool], bool] | None = None, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``, retried as the class docstring says.

        ``agree``: the ranks' agreement on failure, for a ``fn`` that is a collective (a tensor-parallel engine's
        ``generate``; several processes): ``agree(this rank's attempt failed)`` is whether any rank's did
        (:func:`lit_credit.distributed.any_rank`). After every attempt but the last the ranks agree, and when
        any rank's failed every rank makes the next attempt (a rank whose own attempt succeeded drops its
        result), so every rank calls ``fn`` equally often; after the last each rank keeps its own outcome (its
        result, or :class:`BackendFailure`). Retries are then counted on every rank that repeats. A timed-out
        attempt of a collective runs on in its thread, inside the collective: leave ``timeout`` null there."""
        key, last, attempts = f"backend/{self.name}/", None, 1 + self.max_retries
        for attempt in range(attempts):
            if attempt:
                COUNTS[key + "retries"] += 1
                sleep(self.backoff * 2 ** (attempt - 1))
            COUNTS[key + "calls"] += 1
            ok, result = False, None
            try:
                result = self._attempt(fn, args, kwargs)
            except NotRetried:
                raise
            except TimeoutError as err:
                COUNTS[key + "timeouts"] += 1
                last = err
            except Exception as err:  # a flaky backend is retried, then scored as a failure by the caller
                last = err
            else:
                ok = accept is None or accept(result)
                if not ok:
                    last = ValueError(f"result refused: {str(result)[:200]!r}")
            if agree is not None and attempt < attempts - 1:
                ok = not agree(not ok)  # every rank retries when one failed
            if ok:
                return result
        COUNTS[key + "failures"] += 1
        raise BackendFailure(f"{self.name}: {attempts} attempts failed; last: {last!r}") from last

    def _attempt(self, fn: Callable[..., T], args: tuple, kwargs: dict) -> T:
        if self.timeout is None:
            return fn(*args, **kwargs)
        pool = ThreadPoolExecutor(1, thread_name_prefix=f"backend-{self.name}")
        try:
            future = pool.submit(fn, *args, **kwargs)
            return future.result(timeout=self.timeout)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)


class CountsSince:
    """What :data:`COUNTS` gained since the previous :meth:`take` (or construction), as float metrics.

    Every key seen so far is reported (0 when unchanged), except the ``calls`` tallies.
    """

    def __init__(self) -> None:
        self.seen = Counter(COUNTS)

    def take(self) -> dict[str, float]:
        now = Counter(COUNTS)
        delta = {k: float(v - self.seen[k]) for k, v in now.items() if not k.endswith("/calls")}
        self.seen = now
        return delta
