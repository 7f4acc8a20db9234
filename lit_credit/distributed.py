"""Several processes, one run: who leads a launch, the run directory's claim, each rank's share of a step, and
the gathers that make every logged value the whole run's.

Launchers and what they tell a process before any process group exists:

- Lightning's subprocess launcher (``trainer=ddp_cpu``, ``trainer=fsdp``, ``lit-credit-cli``): the command is
  started once (rank 0), and Lightning re-runs it for local ranks 1..N-1 inside ``trainer.fit``, with
  ``LOCAL_RANK`` set. Rank 0 claims the run directory before that and exports the claim's id
  (``LIT_CREDIT_RUN_ID``), which the ranks it starts inherit.
- ``torchrun``: every process at once, ``RANK`` set, ``TORCHELASTIC_RUN_ID`` shared.
- SLURM (``srun``, Hydra's submitit launcher with ``tasks_per_node`` = devices): every task at once,
  ``SLURM_PROCID`` set, ``SLURM_JOB_ID`` shared (kept on requeue).
"""
from __future__ import annotations

import json
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

import torch

from lit_credit.checkpoint import atomic_write
from lit_credit.types import RolloutBatch, cat_batches

CLAIM = ".lit-credit-run.json"
RUN_MARKERS = ("checkpoints", "tensorboard", "records", "csv", ".hydra", CLAIM)  # what makes a directory a run's
RUN_ID = "LIT_CREDIT_RUN_ID"
# What Lightning's subprocess launcher exports into the launching process; a later run in the same process
# (the next job of a Hydra sweep) must start without them, or Lightning would think an outside launcher made it.
LAUNCH_VARIABLES = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", RUN_ID)


def launch_rank() -> int:
    """This process's rank as its launcher announced it (module docstring): ``RANK``, else ``SLURM_PROCID`` of a
    multi-task SLURM step, else ``NODE_RANK`` / ``LOCAL_RANK`` (any non-zero one makes it a follower); 0 when
    none is set (a single process, or the first process of Lightning's launcher)."""
    env = os.environ
    if "RANK" in env:
        return int(env["RANK"])
    if int(env.get("SLURM_NTASKS", "1")) > 1 and "SLURM_PROCID" in env:
        return int(env["SLURM_PROCID"])
    return max(int(env.get("NODE_RANK", "0")), int(env.get("LOCAL_RANK", "0")))


def shared_run_id() -> str | None:
    """The id every process of this launch shares without talking: rank 0's exported claim id, else
    :func:`launcher_run_id`."""
    return os.environ.get(RUN_ID) or launcher_run_id()


def launcher_run_id() -> str | None:
    """torchrun's rendezvous id or the SLURM job (array task) id; None when the launcher gives none."""
    env = os.environ
    if env.get("TORCHELASTIC_RUN_ID"):
        return f"torchrun-{env['TORCHELASTIC_RUN_ID']}" + _attempt(env.get("TORCHELASTIC_RESTART_COUNT"))
    if env.get("SLURM_JOB_ID"):
        task = env.get("SLURM_ARRAY_TASK_ID")
        return (f"slurm-{env.get('SLURM_ARRAY_JOB_ID', env['SLURM_JOB_ID'])}" + (f"-{task}" if task else "")
                + _attempt(env.get("SLURM_RESTART_COUNT")))
    return None


def _attempt(restarts: str | None) -> str:
    """A requeued SLURM job or a restarted torchrun keeps its id; the restart count tells its attempts apart, so a
    follower of the new attempt never joins the previous attempt's claim."""
    return f"-attempt{restarts}" if restarts and restarts != "0" else ""


def claim_run_dir(output_dir: str | os.PathLike[str], resuming: bool, timeout_s: float | None = None,
                  checkpoint: str | None = None) -> bool:
    """Claim ``output_dir`` for this run; True on the process that leads it (writes the run's record).

    The leader (:func:`launch_rank` 0) refuses a directory that already holds a run (checkpoints, logs,
    records, configs, a claim) unless ``resuming``, then writes the claim ``.lit-credit-run.json`` with the
    launch's id (:func:`shared_run_id`, or a new one) and exports that id as ``LIT_CREDIT_RUN_ID`` for the
    ranks Lightning will start; the claim also holds the leader's ``checkpoint`` (what the run resumes from,
    :func:`claimed_checkpoint`), so that one rank decides for all. Every other rank joins: it waits (``timeout_s``, default
    ``LIT_CREDIT_CLAIM_TIMEOUT`` or 300 s) until the directory's claim carries its own launch's id, and writes
    nothing. A rank that finds another launch's claim there, or none in time, raises, naming both ids: a
    second, unrelated run is refused on every rank.
    """
    output_dir = Path(output_dir)
    claim = output_dir / CLAIM
    if launch_rank() == 0:
        found = [m for m in RUN_MARKERS if (output_dir / m).exists()]
        if found and not resuming:
            raise FileExistsError(
                f"paths.output_dir={output_dir} already holds a run ({', '.join(found)}); nothing was written. Fix: "
                f"resume it with ckpt_path={output_dir / 'checkpoints' / 'last.ckpt'} (or resume=auto), or start a "
                "new run in another directory (hydra.run.dir=...)")
        run_id = launcher_run_id() or uuid.uuid4().hex
        record = {"run_id": run_id, "pid": os.getpid(), "time": time.time(), "checkpoint": checkpoint}
        atomic_write(claim, lambda tmp: tmp.write_text(json.dumps(record)))
        os.environ[RUN_ID] = run_id
        return True
    expected = shared_run_id()
    if expected is None:
        raise RuntimeError(f"rank {launch_rank()} started without a launch id: start several processes with "
                           "Lightning's launcher (trainer.devices=N), torchrun or SLURM, which give every rank one")
    deadline = time.monotonic() + (timeout_s if timeout_s is not None
                                   else float(os.environ.get("LIT_CREDIT_CLAIM_TIMEOUT", "300")))
    seen = None
    while True:
        try:
            seen = json.loads(claim.read_text())["run_id"]
        except (OSError, ValueError, KeyError):
            seen = None
        if seen == expected:
            return False
        if time.monotonic() > deadline:
            raise FileExistsError(
                f"paths.output_dir={output_dir}: rank {launch_rank()} of launch {expected} found "
                f"{'the claim of launch ' + seen if seen else 'no claim'} there, not its rank 0's. Fix: give every "
                "rank the same directory (under torchrun or srun set hydra.run.dir=... explicitly; ${now:...} may "
                "differ between processes), and a new directory for a new run")
        time.sleep(0.2)


def earlier_attempt(output_dir: str | os.PathLike[str]) -> bool:
    """Whether ``output_dir`` was claimed by an earlier attempt of this launch: the claim's id is this launch's
    (:func:`launcher_run_id`) but for the attempt (a requeued SLURM job, a restarted torchrun). Never for a launch
    without an id of its own."""
    launch = launcher_run_id()
    try:
        seen = json.loads((Path(output_dir) / CLAIM).read_text())["run_id"]
    except (OSError, ValueError, KeyError):
        return False
    return launch is not None and re.sub(r"-attempt\d+$", "", seen) == re.sub(r"-attempt\d+$", "", launch)


def claimed_checkpoint(output_dir: str | os.PathLike[str]) -> str | None:
    """The checkpoint the run's leader decided to resume from (its claim's, :func:`claim_run_dir`); None: a new
    run."""
    return json.loads((Path(output_dir) / CLAIM).read_text()).get("checkpoint")


# ------------------------------------------------------------------------------------------------ collectives
def world() -> tuple[int, int]:
    """``(rank, world size)`` of the default process group; ``(0, 1)`` without one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def share(n: int, rank: int, size: int) -> slice:
    """Rank ``rank``'s contiguous share of ``n`` items split over ``size`` ranks, as even as can be (the first
    ``n % size`` ranks one more), in rank order: concatenating the shares gives the items back in order."""
    base, extra = divmod(n, size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


def gather_objects(obj: Any) -> list[Any]:
    """``obj`` of every rank, in rank order (``[obj]`` in one process): ``all_gather_object``, any backend."""
    size = world()[1]
    if size == 1:
        return [obj]
    out: list[Any] = [None] * size
    torch.distributed.all_gather_object(out, obj)
    return out


def gather_batch(batch: RolloutBatch, pad_id: int) -> tuple[RolloutBatch, torch.Tensor]:
    """The rollouts of every rank in one batch on this rank's device (rank order, :func:`cat_batches`), and
    each row's rank ([B] long); ``(batch, zeros)`` in one process. What the step's logged rollout metrics and
    credit records are computed from, so that they are the whole step's, not one rank's."""
    parts = gather_objects(batch.to("cpu")) if world()[1] > 1 else [batch]
    ranks = torch.cat([torch.full((len(b),), r, dtype=torch.long) for r, b in enumerate(parts)])
    device = batch.input_ids.device
    return cat_batches([b.to(device) for b in parts], pad_id), ranks.to(device)


def all_reduce_sum(value: torch.Tensor) -> torch.Tensor:
    """``value`` summed over the ranks (itself in one process); a new tensor."""
    value = value.detach().clone()
    if world()[1] > 1:
        torch.distributed.all_reduce(value)
    return value


def max_over_ranks(values: list[int]) -> list[int]:
    """The elementwise largest of ``values`` over the ranks (one ``all_reduce`` MAX, every rank giving as many
    values); ``values`` itself, with no collective, in one process. How the ranks agree on a count, e.g. how
    often to call an engine whose ``generate`` is a collective."""
    if world()[1] == 1:
        return list(values)
    backend = str(torch.distributed.get_backend())
    device = "cpu" if "gloo" in backend or not torch.cuda.is_available() else torch.cuda.current_device()
    out = torch.tensor([int(v) for v in values], dtype=torch.long, device=device)
    torch.distributed.all_reduce(out, op=torch.distributed.ReduceOp.MAX)
    return out.tolist()


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` holds on some rank (:func:`max_over_ranks`); ``flag`` itself in one process."""
    return bool(max_over_ranks([int(flag)])[0])
