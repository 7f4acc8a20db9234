"""Run a function on several real gloo processes (torch.multiprocessing spawn), for the tests of what every rank
must do alike: ``run_ranks(fn, *args)`` calls ``fn(rank, *args)`` on each rank inside a ``gloo`` process group
and returns the ranks' results in rank order. A rank that raises fails the call with its traceback; ranks that
wait on each other for longer than ``timeout`` seconds (a collective only some ranks reach) are killed and the
call raises ``TimeoutError``."""
from __future__ import annotations

import os
import pickle
import socket
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, fn: Callable[..., Any], world: int, port: int, out: str, timeout: float, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        os.environ.pop(key, None)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=timeout))
    result = fn(rank, *args)
    dist.barrier()
    Path(out, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
    dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], *args: Any, world: int = 2, timeout: float = 240.0) -> list[Any]:
    """``[fn(0, *args), ..., fn(world - 1, *args)]``, each on its own spawned gloo rank (``fn`` and ``args``
    picklable: a module-level function)."""
    with tempfile.TemporaryDirectory() as out:
        ctx = mp.start_processes(_entry, args=(fn, world, free_port(), out, timeout / 2, args), nprocs=world,
                                 join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        try:
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{fn.__name__} on {world} ranks ran past {timeout} s: a rank waits in a "
                                       "collective the others never reach")
        finally:
            for process in ctx.processes:
                if process.is_alive():
                    process.terminate()
                    process.join()
        return [pickle.loads(Path(out, f"rank{r}.pkl").read_bytes()) for r in range(world)]
