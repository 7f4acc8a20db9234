"""Counter-based random numbers for sampling: a rollout's randomness is a function of its seed, not of the process,
batch or position it is sampled in.

``mix(*parts)`` hashes int64 counters with SplitMix64's finaliser (Steele, Lea and Flood 2014),
``h = fmix(h ^ part)`` for each part from ``h = 0``, where

    fmix(x) = z3,  z1 = (x ^ (x >>> 30)) * 0xbf58476d1ce4e5b9,  z2 = (z1 ^ (z1 >>> 27)) * 0x94d049bb133111eb,
    z3 = z2 ^ (z2 >>> 31)

(``>>>`` a logical shift, products modulo 2**64), elementwise on broadcast tensors. ``gumbel(seeds, step, vocab)``
is the Gumbel noise of decoding step ``step`` for rows with those seeds: ``g[b, v] = -log(-log(u))`` with
``u = ((mix(seeds[b], step, v) >>> 11) + 1/2) / 2**53`` in (0, 1), so ``argmax(z / T + g)`` is an exact sample of
``softmax(z / T)`` (the Gumbel-max trick) whose draw depends on (seed, step, token) only.
"""
from __future__ import annotations

import torch

_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _signed(x: int) -> int:
    """The int64 with the bits of the uint64 ``x``."""
    return x - (1 << 64) if x >= 1 << 63 else x


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's ``>>`` is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _fmix(x: torch.Tensor) -> torch.Tensor:
    x = (x ^ _shr(x, 30)) * _signed(_M1)
    x = (x ^ _shr(x, 27)) * _signed(_M2)
    return x ^ _shr(x, 31)


def mix(*parts: torch.Tensor | int) -> torch.Tensor:
    """The int64 hash of ``parts`` (tensors broadcast together, ints as scalars; see the module docstring), on the
    first tensor's device."""
    device = next((p.device for p in parts if isinstance(p, torch.Tensor)), None)
    h = torch.zeros((), dtype=torch.long, device=device)
    for part in parts:
        if isinstance(part, int):
            part = _signed(part & ((1 << 64) - 1))
        h = _fmix(h ^ torch.as_tensor(part, dtype=torch.long, device=device))
    return h


def mix_seed(*parts: int) -> int:
    """A seed in ``[0, 2**63)`` from integers (e.g. the run's seed, a stream tag, a group id)."""
    return int(mix(*parts)) & ((1 << 63) - 1)


def row_seeds(seeds: list[int], n: int) -> torch.Tensor:
    """[len(seeds) * n] int64: completion ``k`` of prompt ``i`` gets ``mix(seeds[i], k)``, prompt-major."""
    return mix(torch.tensor(seeds, dtype=torch.long)[:, None], torch.arange(n)).reshape(-1)


def uniform(*parts: torch.Tensor | int) -> torch.Tensor:
    """float64 uniform noise in (0, 1) from counters: ``u = ((mix(*parts) >>> 11) + 1/2) / 2**53``, elementwise."""
    return (_shr(mix(*parts), 11).double() + 0.5) / 2.0 ** 53


def seeds_of(*parts: torch.Tensor | int) -> list[int]:
    """:func:`mix_seed` elementwise over broadcast counters, as a list of seeds in ``[0, 2**63)``."""
    return (mix(*parts) & ((1 << 63) - 1)).reshape(-1).tolist()


def gumbel(seeds: torch.Tensor, step: int, vocab: int) -> torch.Tensor:
    """[B, vocab] float32 Gumbel(0, 1) noise of decoding step ``step`` for rows seeded ``seeds`` [B]."""
    u = uniform(seeds[:, None], step, torch.arange(vocab, device=seeds.device))
    return (-torch.log(-torch.log(u))).float()
