"""What every method module shares: the policy and its frozen reference, log-probs, exact resume, FSDP2."""
from __future__ import annotations

import contextlib
import copy
import hashlib
import warnings
from typing import Any

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from lit_credit.checkpoint import capture_rng, restore_rng
from lit_credit.distributed import gather_objects, launch_rank, max_over_ranks
from lit_credit.losses import PolicyLoss
from lit_credit.models.chunked_head import check_chunkable
from lit_credit.models.logprobs import length_buckets, token_logprobs
from lit_credit.models.policy import PolicySource, is_peft
from lit_credit.rollout import Experience
from lit_credit.types import RolloutBatch

# Checkpoints hold the state after step N's update, consistent with global_step = N: that is what we want.
warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization")
# The frozen reference is in eval mode on purpose (and HF policies load in eval mode: no dropout in RL).
warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode")
# Every value a module logs is already the whole run's (computed from every rank's rollouts, or reduced over
# the ranks), so Lightning's sync_dist advice does not apply.
warnings.filterwarnings("ignore", message=r".*sync_dist=True.*")


def _drop_reference_keys(module: torch.nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """A ``load_state_dict`` pre-hook: the ``reference.*`` entries of a checkpoint written before the reference
    left the state dict are dropped (the reference is made again from the policy's initial weights)."""
    for key in [k for k in state_dict if k.startswith(f"{prefix}reference.")]:
        del state_dict[key]


def _unsaved_buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The buffers the state dict leaves out (non-persistent, e.g. rotary frequencies), by qualified name."""
    return {f"{name}.{key}" if name else key: buffer for name, module in model.named_modules()
            for key, buffer in module._buffers.items()
            if buffer is not None and key in module._non_persistent_buffers_set}


def _to_meta(model: torch.nn.Module) -> None:
    """Every parameter and buffer of ``model`` replaced by a meta tensor of its shape, in place (the module
    objects stay; a tied weight stays one parameter)."""
    made: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for module in model.modules():
        for store in (module._parameters, module._buffers):
            for key, value in store.items():
                if value is None or value.is_meta:
                    continue
                if id(value) not in made:
                    empty = torch.empty_like(value, device="meta")
                    if isinstance(value, torch.nn.Parameter):
                        empty = torch.nn.Parameter(empty, requires_grad=value.requires_grad)
                    made[id(value)] = (value, empty)
                store[key] = made[id(value)][1]


def _fill_from_rank0(model: torch.nn.Module, full: dict[str, torch.Tensor], extra: dict[str, torch.Tensor],
                     device: torch.device) -> None:
    """Allocate the sharded meta ``model`` on ``device`` and fill it from rank 0's ``full`` state dict and
    ``extra`` unsaved buffers (empty on the other ranks), one tensor at a time."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    model.to_empty(device=device)
    set_model_state_dict(model, dict(full), options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    for name, buffer in _unsaved_buffers(model).items():
        with torch.no_grad():
            if name in extra:
                buffer.copy_(extra[name])
            torch.distributed.broadcast(buffer, src=0)


def weights_hash(model: torch.nn.Module) -> str:
    """BLAKE2b of every parameter's name, dtype, shape and bytes, in order: the same weights, whatever the machine."""
    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in model.state_dict().items():
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class PolicyModule(L.LightningModule):
    """The plumbing of a policy-optimisation module with manual optimisation; the algorithm is the subclass's.

    Holds the policy (``policy.load()``: loads, never trains; the entry points prepare the embedded policy
    first), the frozen reference when ``uses_reference`` (:attr:`reference`: a copy of the policy as loaded, kept
    out of the state dict and the checkpoints; for a LoRA policy the base with adapters disabled, no copy), the
    optimiser and scheduler factories, ``max_grad_norm`` and the log-prob micro-batch budget. Provides log-probs at
    the batch's temperature, gradient clipping, FSDP2 sharding, the dropout-off RL mode and exact resume (every
    random state of the module, its :meth:`random_sources`, the DataModule's position, the reward's and judge's
    generators in the checkpoint). Every generation goes through :attr:`experience`, the DataModule's experience
    layer, bound to the policy once in :meth:`setup`.

    Host memory: the launch's rank 0 loads the policy; under several processes the other ranks build it on the
    meta device (no weight read). Under FSDP2 their shards, and every rank's reference shards, are filled from
    rank 0's one load (:meth:`configure_model`); under any other strategy they load it in :meth:`setup`, as rank 0
    did. A LoRA policy is loaded on every rank.
    """

    def __init__(self, policy: PolicySource, uses_reference: bool, optimizer: OptimizerCallable = torch.optim.AdamW,
                 lr_scheduler: LRSchedulerCallable | None = None, max_grad_norm: float = 1.0,
                 logprob_token_budget: int | None = 16384, logprob_temperature: float | None = None) -> None:
        super().__init__()
        if logprob_temperature is not None and not logprob_temperature > 0:
            raise ValueError(f"method.logprob_temperature={logprob_temperature}: must be > 0, or null (the "
                             "temperature the batch was sampled at)")
        self.save_hyperparameters(ignore=["policy", "uses_reference"])
        self.automatic_optimization = False
        self.source = policy
        self.optimizer_factory, self.scheduler_factory = optimizer, lr_scheduler
        self.max_grad_norm = max_grad_norm
        self.logprob_token_budget = logprob_token_budget  # padding-free micro-batches (models.token_logprobs)
        self.logprob_temperature = logprob_temperature  # None: the batch's sampling temperature
        self._resume_rng: dict[str, Any] | None = None
        self._awaits_weights = policy.lora is None and launch_rank() != 0  # on the meta device until rank 0's
        self.policy, self.tokenizer = policy.load(empty=self._awaits_weights)
        self.head_chunk_tokens = policy.head_chunk_tokens  # the chunked LM head (models.chunked_head)
        if self.head_chunk_tokens is not None:
            check_chunkable(self.policy)
        self.uses_reference = uses_reference
        # A LoRA policy's reference is itself with adapters disabled; any other's is a copy of the policy as
        # loaded, made in setup / configure_model (:attr:`reference`), before a resumed run restores the weights.
        self._reference_due = self.uses_reference and not is_peft(self.policy)
        self.__dict__["_reference"] = None  # no submodule: not in the state dict, so in no checkpoint
        # The initial weights the reference is made from, as a hash a checkpoint carries (on the loading rank).
        self.initial_weights = weights_hash(self.policy) if self._reference_due and not self._awaits_weights else None
        self.register_load_state_dict_pre_hook(_drop_reference_keys)  # an older checkpoint's reference.* keys

    @property
    def reference(self) -> torch.nn.Module | None:
        """The frozen reference policy: a copy of the policy as loaded, fp32 like its master weights, computing as
        the policy does (the same autocast; under FSDP2 the same sharding and mixed precision), so the KL starts at
        exactly 0. None for a LoRA policy (its base with adapters disabled) and without a KL term.

        Not a submodule, so neither the state dict nor a checkpoint holds it: it is made again from the policy's
        initial weights in :meth:`setup` (one process, DDP: a deep copy) or :meth:`configure_model` (FSDP2: from
        rank 0's load), both before a resumed run's checkpoint restores the policy; :meth:`_apply` moves and casts
        it with the module. A module driven without a Trainer gets it at first use."""
        if self._reference_due and self.device_mesh is None:
            self._bring_in()
        return self.__dict__["_reference"]

    def _bring_in(self) -> None:
        """Without a device mesh: the policy's weights on a rank that built it on the meta device (loaded now, as
        rank 0 loaded them) and the reference's deep copy. With one, only rank 0's weights (configure_model
        broadcasts them): loaded here if this rank built the meta model."""
        mesh = self.device_mesh
        if self._awaits_weights and (mesh is None or torch.distributed.get_rank() == 0):
            self.policy, self._awaits_weights = self.source.load()[0], False
        if mesh is None and self._reference_due:
            self.__dict__["_reference"] = copy.deepcopy(self.policy).eval().requires_grad_(False)
            self._reference_due = False

    def _apply(self, fn, recurse: bool = True):
        """``nn.Module._apply`` (``to``, ``cuda``, ``float``, ``to_empty``, ...), the reference included."""
        super()._apply(fn, recurse)
        if recurse and self.__dict__.get("_reference") is not None:
            self.__dict__["_reference"]._apply(fn, recurse)
        return self

    def configure_model(self) -> None:
        """FSDP2 under ``ModelParallelStrategy``: ``fully_shard`` each decoder layer, then the root, of the policy
        and of the frozen reference, on the data-parallel mesh: each rank holds 1/N of both (a LoRA policy's
        reference is its own base, sharded with it). The reference's root is resharded after every forward too
        (``reshard_after_forward=True``; FSDP2 keeps a root unsharded for its backward, and the reference has
        none), so between its forwards it holds its shard only.

        Precision: ``trainer.precision=bf16-mixed`` adds ``MixedPrecisionPolicy(param_dtype=bfloat16,
        reduce_dtype=float32)`` to both: the sharded parameters stay the fp32 master weights
        :meth:`~lit_credit.models.policy.PolicySource.load` made, the forward all-gathers and computes with bf16
        copies of them (half the traffic and unsharded memory of fp32), the gradients are reduce-scattered in
        fp32 and the optimiser updates the fp32 shards, so an update smaller than a bf16 ulp still moves a weight.
        Lightning's bf16 autocast stays on around it. Without a device mesh (one device, DDP) that autocast alone
        gives bf16 compute over the fp32 weights.

        Host memory (not LoRA): only rank 0 holds the loaded weights; every rank shards the policy and the
        reference on the meta device, allocates its shards (``to_empty``) and receives them from rank 0's load,
        one tensor at a time (``set_model_state_dict(..., broadcast_from_rank0=True)``; the buffers outside the
        state dict, e.g. rotary frequencies, broadcast too). No rank but 0 ever holds a full copy, and the
        reference is filled from the same load. The values are rank 0's load's, bitwise those every rank loaded
        before. A LoRA policy is sharded where every rank loaded it.

        A no-op without a device mesh and when the policy is already sharded. Lightning calls it before
        ``configure_optimizers``, so the optimiser sees the sharded (DTensor) parameters.
        """
        mesh = self.device_mesh
        if mesh is None:
            return
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

        if isinstance(self.policy, FSDPModule):
            return
        names = mesh.mesh_dim_names or ()
        dp_mesh = mesh["data_parallel"] if "data_parallel" in names and mesh.ndim > 1 else mesh
        mixed = self.trainer.precision == "bf16-mixed"
        mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed \
            else MixedPrecisionPolicy()
        blocks = set(getattr(self.policy, "_no_split_modules", None) or ())

        def shard(model: torch.nn.Module, reshard_root: bool | None) -> None:
            for module in model.modules():
                if any(cls.__name__ in blocks for cls in type(module).__mro__):  # checkpointed layers subclass them
                    fully_shard(module, mesh=dp_mesh, mp_policy=mp_policy)
            fully_shard(model, mesh=dp_mesh, mp_policy=mp_policy, reshard_after_forward=reshard_root)

        if is_peft(self.policy):
            shard(self.policy, None)
            return
        self._bring_in()  # rank 0's weights, if this rank was not the launch's rank 0
        loaded = torch.distributed.get_rank() == 0
        full = self.policy.state_dict() if loaded else {}  # the loaded tensors themselves, no copy
        extra = _unsaved_buffers(self.policy) if loaded else {}
        _to_meta(self.policy)
        models = [(self.policy, None)]
        if self._reference_due:  # a copy of the meta model costs nothing
            self.__dict__["_reference"] = copy.deepcopy(self.policy).eval().requires_grad_(False)
            self._reference_due = False
            models.append((self.reference, True))
        for model, reshard_root in models:
            shard(model, reshard_root)
            _fill_from_rank0(model, full, extra, self.trainer.strategy.root_device)

    @property
    def experience(self) -> Experience:
        """The experience layer every generation of a step goes through (the DataModule's
        :class:`~lit_credit.rollout.Experience`: draws, refills, validation, roles; bound to the policy in
        :meth:`setup`)."""
        return self.trainer.datamodule.experience

    def setup(self, stage: str) -> None:
        """Bring the weights in (:meth:`_bring_in`: before sharding, and before a resumed run's checkpoint restores
        them), then bind the policy to the experience layer, once (the engine gets it at its first use, after a
        resumed run's checkpoint restored the weights)."""
        self._bring_in()
        self.experience.bind(self.policy, self.tokenizer)

    def random_sources(self) -> dict[str, Any]:
        """Objects whose private random generators a checkpoint saves: the module itself; subclasses add the
        parts they own (augmenters, a game)."""
        return {"module": self}

    def _rng_owners(self) -> dict[str, Any]:
        """Every owner of a private generator a checkpoint saves: :meth:`random_sources` and the experience
        layer's (reward, judge)."""
        return {**self.random_sources(), **self.experience.random_sources()}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Every rank's random states (every rank calls this; rank 0 writes the file): rank 0's as
        ``rng_states``, and with several processes each rank's in ``rng_states_by_rank``."""
        states = gather_objects(capture_rng(self._rng_owners()))
        checkpoint["rng_states"] = states[0]
        if len(states) > 1:
            checkpoint["rng_states_by_rank"] = states
        if self.initial_weights is not None:
            checkpoint["initial_weights"] = self.initial_weights

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """This rank's saved random states (rank 0's when the checkpoint has no entry for it), after checking that the
        policy's initial weights, which the frozen reference is made from, are the checkpoint's (its
        ``initial_weights`` hash, where both the checkpoint and this rank have one)."""
        saved = checkpoint.get("initial_weights")
        if saved is not None and self.initial_weights is not None and saved != self.initial_weights:
            raise ValueError(
                "the checkpoint was trained from other initial weights than model= loads now (their hashes differ), "
                "and the frozen KL reference is made again from them, not saved: resume with the model the run "
                "started from (the same model.path, or the same paths.cache_dir and model.embedded settings)")
        by_rank = checkpoint.get("rng_states_by_rank") or []
        rank = self.global_rank if self._trainer is not None else 0
        self._resume_rng = by_rank[rank] if rank < len(by_rank) else checkpoint.get("rng_states")

    def on_train_start(self) -> None:
        """Dropout off for RL (the LoRA dropout PEFT leaves in training mode too), so the old, reference and
        trainer log-probs and the engine's, which samples in eval mode, are of one distribution and the PPO ratio
        of the first update is exactly 1. Resuming: put back the checkpoint's random states once everything
        that might draw on setup ran."""
        self.policy.eval()
        if self._resume_rng is not None:
            restore_rng(self._resume_rng, self._rng_owners())
            self._resume_rng = None

    def on_validation_epoch_end(self) -> None:
        """Validation's generation is done: release the engine (an engine in sleep mode sleeps, an FSDP2 policy
        gathered for generation is resharded), as the training step does after its rollouts."""
        self.experience.release()

    def _logprobs(
        self, model: torch.nn.Module, batch: RolloutBatch, entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[B, T] log-probs under ``model`` at the batch's sampling temperature (``logprob_temperature`` when
        set: the DPA-GRPO official baseline scores ``log_softmax(logits)``, T = 1, whatever it sampled at) and,
        with ``entropy``, the entropy (else None)."""
        forwards = 0
        if self.logprob_token_budget is not None and not torch.is_grad_enabled():  # old / reference log-probs
            # FSDP2 all-gathers in every forward: every rank runs as many as the rank with the most
            forwards = self._micro_batch_count(len(length_buckets(batch.attention_mask, self.logprob_token_budget)))
        return token_logprobs(model, batch.input_ids, batch.attention_mask, self.logprob_token_budget,
                              entropy=entropy, head_chunk=self.head_chunk_tokens,
                              temperature=batch.temperature if self.logprob_temperature is None
                              else self.logprob_temperature,
                              min_forwards=forwards)

    def backward_by_micro_batch(self, batch: RolloutBatch, loss: PolicyLoss, advantages: torch.Tensor,
                                mask: torch.Tensor, ref_logp: torch.Tensor | None, old_logp: torch.Tensor | None = None,
                                scale: float = 1.0, entropy: bool = True
                                ) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, float]]:
        """Gradients of ``scale * loss(logp, old, advantages, mask, ref_logp)`` over the whole ``batch``
        (``old = old_logp``, or ``logp`` detached when None: one update per rollout batch), accumulated one
        :func:`~lit_credit.models.logprobs.length_buckets` micro-batch of rows at a time (at most
        ``logprob_token_budget`` tokens; all rows at once without a budget): forward the micro-batch, put its
        rows into ``logp`` [B, T] (the other rows hold detached values: those already run, the rest the
        behaviour log-probs), backward, free the graph, next. Activation memory is one micro-batch's, whatever
        the batch size.

        Exact because every row's loss terms depend on that row's log-probs alone (token and sequence ratios,
        KL; the aggregations' normalisers come from the mask): ``d loss / d logp_b`` is the same whichever rows
        are live, so the micro-batches' gradients sum to the whole batch's (float rounding aside).
        Several processes: every rank runs as many micro-batches as the rank with the most (the extra ones
        re-run one row with weight 0), so the collectives of FSDP2 (all-gather, reduce-scatter) line up; under
        DDP the gradients are all-reduced once, at the last micro-batch.
        Returns the detached log-probs (and, with ``entropy``, the entropy) of every row and the loss's metrics
        over all of them.
        """
        buckets = ([rows for rows, _ in length_buckets(batch.attention_mask, self.logprob_token_budget)]
                   if self.logprob_token_budget is not None else [torch.arange(len(batch), device=self.device)])
        runs = self._micro_batch_count(len(buckets))
        logp = batch.behaviour_logprobs.detach().clone()
        entropies = torch.zeros_like(logp) if entropy else None
        for k in range(runs):
            rows = buckets[k] if k < len(buckets) else buckets[0][:1]  # a padding run: weight 0
            part, part_entropy = self._logprobs(self.policy, batch.select(rows), entropy=entropy)
            live = logp.index_copy(0, rows, part)
            value, metrics = loss(live, live.detach() if old_logp is None else old_logp, advantages, mask, ref_logp)
            with self._gradient_sync(k == runs - 1):
                self.manual_backward((scale if k < len(buckets) else 0.0) * value)
            if k < len(buckets):
                logp[rows] = part.detach()
                if entropy:
                    entropies[rows] = part_entropy.detach()
        if len(buckets) != 1:  # the metrics of the whole batch (one bucket: the loss call above saw every row)
            with torch.no_grad():
                metrics = loss(logp, logp if old_logp is None else old_logp, advantages, mask, ref_logp)[1]
        return logp, entropies, metrics

    @staticmethod
    def _micro_batch_count(local: int) -> int:
        """The largest number of micro-batches over the ranks (``local`` in one process)."""
        return max_over_ranks([local])[0]

    def _gradient_sync(self, on: bool):
        """A context in which DDP all-reduces the gradients of a backward only when ``on`` (else it accumulates
        them locally, ``no_sync``); a no-op otherwise (FSDP2 reduce-scatters every backward)."""
        model = self.trainer.strategy.model if self._trainer is not None else None
        if not on and isinstance(model, torch.nn.parallel.DistributedDataParallel):
            return model.no_sync()
        return contextlib.nullcontext()

    @torch.no_grad()
    def reference_logprobs(self, batch: RolloutBatch) -> torch.Tensor | None:
        """[B, T] log-probs under the frozen reference (the base with adapters disabled for a LoRA policy), or
        None when the loss has no KL term."""
        if not self.uses_reference:
            return None
        if self.reference is not None:
            return self._logprobs(self.reference, batch)[0]
        with self.policy.disable_adapter():
            return self._logprobs(self.policy, batch)[0]

    def _step(self, opt, last: bool) -> None:
        """One optimiser update. Lightning counts the step's last one (``global_step``: one per training step);
        the others go to the strategy directly, which applies the same precision plugin, uncounted."""
        if last:
            opt.step()
        else:
            self.trainer.strategy.optimizer_step(opt.optimizer, closure=lambda: None)

    def _clip(self, opt) -> float:
        params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
        return float(torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm))
