"""Handing freed host memory back to the operating system between the phases of a training step."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim() -> ctypes._CFuncPtr | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        return None


def trim_host_memory() -> bool:
    """``malloc_trim(0)``: glibc keeps the pages of freed heap blocks (a rollout's logits, the reference
    pass's activations) mapped for reuse, so they add to the process's resident memory while the next phase
    allocates its own; trimming returns them, so peak RSS follows live memory. Returns whether anything was
    released (False where the C library has no ``malloc_trim``)."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
