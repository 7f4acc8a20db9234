"""GPU mistakes caught on CPU: ``lit-credit ... emulate_gpu=true`` runs the real job with three checks that a CPU
run otherwise skips, so what would stop a first GPU run stops here instead.

1. **A checking device** (:class:`DeviceCheck`). The trainer's device becomes ``cpu:0`` (:class:`EmulatedAccelerator`),
   a CPU device that is told apart from plain ``cpu`` by its index, and every tensor carries where it would live on
   a GPU machine: *accelerator* (the module's parameters and buffers, anything made with ``device=<the module's
   device>`` or moved there, anything computed from such a tensor) or *host* (what the project's code makes without a
   device, or moves to ``cpu``). An operation where an accelerator tensor meets a host tensor with a dimension
   raises :class:`DeviceMismatchError`, naming the project's (or the calling library's) file and line, as CUDA would (0-dim host tensors mix, as CPU
   scalars do on CUDA), wherever it happens (a host tensor the project hands to a model is caught in the model's
   first layer), and so does ``.numpy()`` of an accelerator tensor. Host tensors are only ever the project's: a
   tensor a library makes (transformers, torch.distributed) carries what it was computed from, or nothing.
2. **Evaluation in inference mode**: ``trainer.validate`` (the run's ``validate_first``) runs under
   ``torch.no_grad`` when the process group is gloo and under ``torch.inference_mode`` under NCCL; emulated, it
   always takes NCCL's choice (validation inside ``fit`` is ``no_grad`` in Lightning on every backend).
3. **Collective symmetry** (:class:`CollectiveRecorder`): every call of a ``torch.distributed`` function collective
   (FSDP2's all-gathers and reduce-scatters included; DTensor's functional collectives, as in ``full_tensor``, are
   not recorded), of the
   engine's ``generate`` (a collective under tensor parallelism) and of ``manual_backward`` (DDP's gradient
   all-reduce) is recorded per rank; after every training step, validation and at the end of the run the ranks
   compare their sequences and raise :class:`CollectiveMismatchError` at the first difference. Each rank's sequence is
   written to ``<run dir>/collectives/rank<r>.txt`` as it goes, so a run that hangs shows where the ranks parted.

With ``trainer=fsdp2_cpu`` (FSDP2 over 2 gloo ranks) the same checks run on every rank. What only a GPU settles
(CUDA kernels, bf16 weight pushes into a CUDA vLLM engine, NCCL timings, several nodes) is listed in docs/usage.md.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.accelerators import CPUAccelerator
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from lit_credit.backends import NotRetried

ACCELERATOR = torch.device("cpu", 0)  # the emulated accelerator: a CPU device told apart by its index
ACC, HOST = "accelerator", "host"
_TAG = "_lit_credit_place"
_ROOT = Path(__file__).resolve().parents[1]
PROJECT_DIRS = tuple(str(_ROOT / d) + os.sep for d in ("lit_credit", "data_modules", "callbacks"))
_DEVICE_GETTER = torch._C.TensorBase.device
_TORCH_DIR = str(Path(torch.__file__).parent) + os.sep
# Operations that CUDA allows across devices (indexing with CPU indices, copies between devices, moves).
CROSS_DEVICE_OK = frozenset({"__getitem__", "__setitem__", "copy_", "to", "cpu", "cuda", "__repr__", "__format__",
                             "__str__", "tolist", "item", "numel", "size", "dim", "__len__", "__iter__"})


class DeviceMismatchError(NotRetried, RuntimeError):
    """An accelerator tensor met a host tensor in the project's code: on a GPU this raises."""


class CollectiveMismatchError(NotRetried, RuntimeError):
    """The ranks' sequences of collectives differ: on a GPU cluster this hangs or pairs the wrong calls."""


def place_of(tensor: torch.Tensor) -> str | None:
    """Where ``tensor`` would live on a GPU machine: ``"accelerator"``, ``"host"``, or None (not known)."""
    return getattr(tensor, _TAG, None)


def mark(tensor: torch.Tensor, place: str | None) -> None:
    """Record that ``tensor`` lives at ``place`` (None: leave it unplaced)."""
    if place is not None:
        with contextlib.suppress(AttributeError, RuntimeError):  # a tensor type without a __dict__
            setattr(tensor, _TAG, place)


def _place_of_device(device: Any) -> str | None:
    """The place a ``device=`` argument names: the emulated accelerator (``cpu:0``, or any non-CPU device) or the
    host (plain ``cpu``); None for something else."""
    if isinstance(device, (str, int)) and not isinstance(device, bool):
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError):
            return None
    if not isinstance(device, torch.device):
        return None
    return HOST if device.type == "cpu" and device.index is None else ACC


def _device_argument(name: str, args: tuple, kwargs: dict) -> tuple[bool, Any]:
    """``(given, value)`` of the target device of a call: ``device=``, or ``.to(device)`` / ``.to(tensor)``."""
    if kwargs.get("device") is not None:
        return True, kwargs["device"]
    if name == "cpu":
        return True, "cpu"
    if name == "cuda":
        return True, ACCELERATOR
    if name == "to":
        for arg in args[1:]:
            if isinstance(arg, (str, torch.device)) or (isinstance(arg, int) and not isinstance(arg, bool)):
                return True, arg
            if isinstance(arg, torch.Tensor):
                return True, arg
    return False, None


class DeviceCheck(TorchFunctionMode):
    """The checking device (module docstring, 1): each torch call's tensors are placed, and a call that mixes an
    accelerator tensor with a host tensor of dimension > 0 raises :class:`DeviceMismatchError` (``checked`` counts
    the calls with an accelerator tensor).

    Placement of a call's result: an explicit target (``device=``, ``.to``, ``.cpu``) decides (``cpu:0`` or any
    non-CPU device: accelerator; plain ``cpu``: host when the project asked for it, else unchanged); a call without
    tensor inputs and without a device (``torch.arange(n)``) makes a host tensor when the project calls it; otherwise
    the result is on the accelerator when an input is, else on the host when an input is. ``tensor.device`` of an
    accelerator tensor reads ``cpu:0``, so ``device=x.device`` follows ``x``; so does, in the project's code, that of
    a tensor a library made (FSDP2's unsharded parameters, a model's outputs), which on a GPU machine lives on the
    accelerator. ``roots``: the directories whose code makes host tensors (the project's packages)."""

    def __init__(self, roots: tuple[str, ...] = PROJECT_DIRS) -> None:
        super().__init__()
        self.roots = tuple(roots)
        self.checked = 0  # calls with an accelerator tensor among their inputs, each checked

    def _caller(self) -> tuple[bool, Any]:
        """Whether the code that called the torch function is the project's (it alone makes host tensors), and its
        frame."""
        frame = sys._getframe(2)  # 0: here, 1: __torch_function__, 2: the caller
        return frame.f_code.co_filename.startswith(self.roots), frame

    @staticmethod
    def _where(frame: Any) -> str:
        """``file:line`` of the first frame outside torch itself (``F.pad``, ``torch.einsum`` and ``nn.Module``
        are torch's Python code): where the mistake is to be fixed."""
        while frame.f_back is not None and frame.f_code.co_filename.startswith(_TORCH_DIR):
            frame = frame.f_back
        return f"{frame.f_code.co_filename}:{frame.f_lineno}"

    def _check(self, name: str, inputs: list[torch.Tensor], places: list[str | None], frame: Any) -> None:
        """Raise where CUDA would: an accelerator tensor with a host tensor of a dimension (indexing excepted, but
        not a host tensor indexed by an accelerator one), ``.numpy()`` of an accelerator tensor."""
        if name == "numpy":
            where = self._where(frame)
            raise DeviceMismatchError(f"{where}: .numpy() of an accelerator tensor (CUDA refuses it). Fix: .cpu() "
                                      "first, or keep the values as a tensor")
        host = [t for t, p in zip(inputs, places) if p == HOST and t.dim() > 0]
        if name in ("__getitem__", "__setitem__"):
            host = host[:1] if places[0] == HOST and ACC in places[1:] else []
        elif name in CROSS_DEVICE_OK:
            host = []
        if host:
            raise DeviceMismatchError(
                f"{self._where(frame)}: torch {name} mixes an accelerator tensor with a host tensor of shape "
                f"{tuple(host[0].shape)}; on a GPU this raises 'Expected all tensors to be on the same device'. "
                "Fix: make the host tensor on the other's device (device=x.device), or move it (.to(x.device))")

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__self__", None) is _DEVICE_GETTER:  # tensor.device
            device, place = func(*args, **kwargs), place_of(args[0])
            if device.type == "cpu" and (place == ACC or (place is None and self._caller()[0])):
                return ACCELERATOR
            return device
        name = getattr(func, "__name__", "")
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        places = [place_of(t) for t in inputs]
        in_project, frame = self._caller()
        if ACC in places:
            self.checked += 1
            self._check(name, inputs, places, frame)
        result = func(*args, **kwargs)
        given, target = _device_argument(name, args, kwargs)
        if given:
            place = place_of(target) if isinstance(target, torch.Tensor) else _place_of_device(target)
            if place == HOST and not in_project:
                place = ACC if ACC in places else (HOST if HOST in places else None)
        elif name.endswith("_") and inputs:  # in place: the tensor stays where it is
            place = places[0]
        elif not inputs:
            place = HOST if in_project else None
        else:
            place = ACC if ACC in places else (HOST if HOST in places else None)
        if place is not None and result is not None and not isinstance(result, (bool, int, float, str)):
            moved = [p for t, p in zip(inputs, places) if t is result]
            if moved and moved[0] != place and not isinstance(result, torch.nn.Parameter):
                result = result.view_as(result)  # a move that is a no-op on CPU: a new tensor, the input keeps its place
            for out in tree_flatten(result)[0]:
                if isinstance(out, torch.Tensor):
                    mark(out, place)
        return result


def place_module(module: L.LightningModule) -> None:
    """Put every parameter and buffer of ``module`` and of its frozen reference (no submodule: it is in no
    checkpoint), and their local shards, on the emulated accelerator."""
    reference = getattr(module, "reference", None)
    modules = [module, *([reference] if isinstance(reference, torch.nn.Module) else [])]
    for tensor in [t for m in modules for t in (*m.parameters(), *m.buffers())]:
        mark(tensor, ACC)
        local = getattr(tensor, "_local_tensor", None)
        if isinstance(local, torch.Tensor):
            mark(local, ACC)


class EmulatedAccelerator(CPUAccelerator):
    """Lightning's CPU accelerator whose devices are ``cpu:0``: the module's device, as the checking device reads it,
    is the accelerator."""

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        return [ACCELERATOR] * len(CPUAccelerator.get_parallel_devices(devices))


def trainer_arguments(strategy: Any) -> dict[str, Any]:
    """The Trainer's arguments on the emulated accelerator: its accelerator, and for one process (``strategy``
    unset or ``"auto"``) a single-device strategy on it (Lightning would put a CPU run on plain ``cpu``)."""
    arguments: dict[str, Any] = {"accelerator": EmulatedAccelerator()}
    if strategy in (None, "auto"):
        from lightning.pytorch.strategies import SingleDeviceStrategy

        arguments["strategy"] = SingleDeviceStrategy(device=ACCELERATOR)
    return arguments


# ---------------------------------------------------------------------------------------------- collectives
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "reduce_scatter",
               "reduce_scatter_tensor", "reduce_scatter_single", "broadcast", "reduce", "gather", "scatter",
               "all_to_all", "all_to_all_single", "barrier", "all_gather_object", "broadcast_object_list",
               "gather_object", "scatter_object_list")


class CollectiveRecorder:
    """Every rank's sequence of collectives (module docstring, 3): ``record(name)`` appends one entry (a
    ``torch.distributed`` collective with its shapes, ``generate`` with its prompt count left out, since ranks hold
    different prompts, ``backward``); :meth:`compare` all-gathers the entries since the last comparison and raises at
    the first difference. ``directory``: where each rank writes ``rank<r>.txt``."""

    def __init__(self, directory: Path | None) -> None:
        self.entries: list[str] = []
        self.compared = 0
        self.directory = directory
        self._depth = 0  # collectives inside a recorded collective (all_gather_object's all_gather) are its own
        self._file = None

    def record(self, entry: str) -> None:
        self.entries.append(entry)
        if self.directory is not None and torch.distributed.is_initialized():
            if self._file is None:
                self.directory.mkdir(parents=True, exist_ok=True)
                self._file = open(self.directory / f"rank{torch.distributed.get_rank()}.txt", "w")  # noqa: SIM115
            self._file.write(entry + "\n")
            self._file.flush()

    def wrap(self, name: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            if self._depth == 0:
                shapes = [tuple(t.shape) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
                self.record(f"{name}{shapes if name not in ('all_gather_object', 'gather_object') else ''}")
            self._depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1
        return recorded

    def compare(self, where: str) -> None:
        """Raise :class:`CollectiveMismatchError` when the ranks recorded different entries since the last call."""
        if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
            return
        mine = self.entries[self.compared:]
        self._depth += 1  # the comparison's own gather is not recorded
        try:
            every = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(every, mine)
        finally:
            self._depth -= 1
        self.compared = len(self.entries)
        if all(e == every[0] for e in every):
            return
        first = next(i for i in range(max(map(len, every)) + 1)
                     if len({tuple(e[i:i + 1]) for e in every}) > 1)
        seen = "; ".join(f"rank {r}: {e[first] if first < len(e) else '(nothing)'} ({len(e)} calls)"
                         for r, e in enumerate(every))
        raise CollectiveMismatchError(
            f"{where}: the ranks' collectives differ at call {first} since the last check: {seen}. On GPUs this "
            "hangs (or pairs different calls). Fix: every rank makes the same calls, padding with empty or weight-0 "
            "ones where it has nothing")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class EmulationCallback(L.Callback):
    """Turns the checking device on for each ``validate`` and ``fit`` (``setup`` to ``teardown``), places the module's
    weights on the emulated accelerator once Lightning has set it up (sharded, moved), records the engine's
    ``generate`` and the module's ``manual_backward``, and compares the ranks' collectives after every training
    step, every validation and at the end of the run."""

    def __init__(self, recorder: CollectiveRecorder, check: DeviceCheck | None = None) -> None:
        self.recorder, self.check = recorder, check or DeviceCheck()
        self._checking = False
        self.inference_modes: list[bool] = []  # per validation: whether it ran in inference mode

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """From here to :meth:`teardown` (each ``validate`` / ``fit``) the checking device is on: the policy's
        loading and warm start before it run unchecked, as they only ever run on the host."""
        if not self._checking:
            self.check.__enter__()
            self._checking = True
        backward = pl_module.manual_backward
        if not getattr(backward, "_recorded", False):
            pl_module.manual_backward = self._recorded(backward, "backward")
        engine = pl_module.trainer.datamodule.experience.engine if trainer.datamodule is not None else None
        if engine is not None and not getattr(engine.generate, "_recorded", False):
            engine.generate = self._recorded(engine.generate, "generate")

    def _recorded(self, fn: Any, name: str) -> Any:
        @functools.wraps(fn)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            self.recorder.record(name)
            return fn(*args, **kwargs)
        recorded._recorded = True
        return recorded

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._checking:
            self.check.__exit__(None, None, None)
            self._checking = False
        self.write_summary(trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.teardown(trainer, pl_module, "exception")  # Lightning skips teardown after an exception

    def write_summary(self, trainer: L.Trainer) -> None:
        """``<run dir>/emulation/rank<r>.json``: what was checked (the calls with an accelerator tensor, the
        validations and whether each ran in inference mode, the recorded collectives)."""
        directory = Path(trainer.default_root_dir) / "emulation"
        directory.mkdir(parents=True, exist_ok=True)
        summary = {"checked_calls": self.check.checked, "validations_in_inference_mode": self.inference_modes,
                   "collectives": len(self.recorder.entries)}
        (directory / f"rank{trainer.global_rank}.json").write_text(json.dumps(summary))

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        place_module(pl_module)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        place_module(pl_module)
        self.inference_modes.append(torch.is_inference_mode_enabled())

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self.recorder.compare(f"training step {trainer.global_step}")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.recorder.compare(f"validation at step {trainer.global_step}")

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.recorder.compare("the end of the run")
        if torch.distributed.is_initialized():  # no rank tears its process group down while another still gathers
            torch.distributed.barrier()


@contextlib.contextmanager
def gpu_emulation(output_dir: Path) -> Iterator[CollectiveRecorder]:
    """Evaluation in inference mode and the recorded collectives (each rank's sequence under
    ``output_dir/collectives``) for what runs inside. Yields the recorder; the trainer needs
    :func:`trainer_arguments` and ``EmulationCallback(recorder)``, which turns the checking device on for each
    ``validate`` and ``fit`` (``train.build`` adds both)."""
    import lightning.pytorch.loops.utilities as loop_utilities

    if not hasattr(loop_utilities, "_distributed_is_initialized"):
        raise RuntimeError("lit_credit.emulation puts Lightning's evaluation in inference mode through "
                           "lightning.pytorch.loops.utilities._distributed_is_initialized, which this Lightning "
                           f"{L.__version__} lacks: update lit_credit/emulation.py for it")
    recorder = CollectiveRecorder(Path(output_dir) / "collectives")
    originals = {name: getattr(torch.distributed, name) for name in COLLECTIVES if hasattr(torch.distributed, name)}
    distributed_initialized = loop_utilities._distributed_is_initialized
    try:
        for name, fn in originals.items():
            setattr(torch.distributed, name, recorder.wrap(name, fn))
        loop_utilities._distributed_is_initialized = lambda: False  # NCCL's choice: inference mode (not gloo's)
        yield recorder
    finally:
        for name, fn in originals.items():
            setattr(torch.distributed, name, fn)
        loop_utilities._distributed_is_initialized = distributed_initialized
        recorder.close()
