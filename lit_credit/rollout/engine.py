"""The HF ``generate`` engine (the :class:`~lit_credit.interfaces.RolloutEngine` protocol is in
lit_credit.interfaces)."""
from __future__ import annotations

from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from lit_credit.interfaces import RolloutEngine
from lit_credit.rollout.seeds import gumbel, row_seeds
from lit_credit.types import Completion, SamplingParams


def _fsdp_modules(model: torch.nn.Module) -> list[Any]:
    """The ``fully_shard`` modules of ``model`` (root first; [] for a model without FSDP2)."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def nucleus(z: torch.Tensor, top_p: float) -> torch.Tensor:
    """[B, V] bool: the tokens of the top-p nucleus of ``softmax(z)``, the most likely first until their mass
    reaches ``top_p`` (a token is in when the mass of the tokens more likely than it is below ``top_p``; the most
    likely token always)."""
    probs, order = z.softmax(-1).sort(-1, descending=True)
    inside = probs.cumsum(-1) - probs < top_p
    return torch.zeros_like(inside).scatter_(-1, order, inside)


class SeededSampler(LogitsProcessor):
    """The token choice of :class:`HFEngine`, as the last logits processor of a greedy ``generate``: it returns
    scores that are 0 at the chosen token and -inf elsewhere, and records ``log_softmax(z / T)[chosen]`` per row
    (``logprobs``, one [B] tensor per step). ``width``: the padded prompt width, so ``t = len - width``."""

    def __init__(self, seeds: torch.Tensor, width: int, sampling: SamplingParams) -> None:
        self.seeds, self.width, self.sampling = seeds, width, sampling
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        s = self.sampling
        z = scores.float() if s.greedy else scores.float() / s.temperature
        if s.greedy:
            choice = z.argmax(-1)
        else:
            perturbed = z + gumbel(self.seeds, input_ids.shape[1] - self.width, z.shape[-1])
            if s.top_p < 1.0:
                perturbed.masked_fill_(~nucleus(z, s.top_p), float("-inf"))
            choice = perturbed.argmax(-1)
        self.logprobs.append(z.gather(-1, choice[:, None]).squeeze(-1) - z.logsumexp(-1))
        return torch.full_like(scores, float("-inf")).scatter_(-1, choice[:, None], 0.0)


class HFEngine:
    """``model.generate`` with KV cache on the trainer's own policy: no weight copy, so sync is a no-op.

    Sampling is seeded per prompt (:meth:`generate`'s ``seeds``; completion ``k`` of prompt ``i`` is row seed
    ``mix(seeds[i], k)``) and counter-based: at decoding step ``t`` a row draws token
    ``argmax_v (z_v / T + g_v)`` over the nucleus (the smallest set of most likely tokens of ``softmax(z / T)``
    whose mass reaches ``top_p``; every token at ``top_p = 1``), ``g = gumbel(row seed, t)``
    (:mod:`lit_credit.rollout.seeds`): an exact sample of the nucleus-restricted ``softmax(z / T)`` whose random
    numbers depend on (seed, t, token) alone, so a rollout is the same whichever process, batch or row it is
    sampled in (up to the float rounding of a batch-dependent kernel moving an argmax). Greedy rows take
    ``argmax z``. Without ``seeds`` the prompts' seeds are drawn from torch's global generator.

    Behaviour log-probs are ``log_softmax(z / T)[token]`` of each sampled token (``T = 1`` greedy), ``z`` the
    model's logits, taken at each decoding step for the sampled token only (no [N, L, V] stack of logits): the
    distribution the trainer recomputes for a batch sampled at ``T`` (``token_logprobs(temperature=T)``). Top-p
    is not renormalised (as in verl): tokens come from the nucleus, their log-probs are of the full tempered
    softmax, so engine and trainer agree. The model's own generation config (its logits processors, e.g. a
    repetition penalty) is not applied: the engine samples exactly the distribution the trainer computes.

    FSDP2 (a ``fully_shard`` policy): the first generation of a rollout phase all-gathers the policy once and
    keeps it unsharded (``reshard_after_forward`` off) until :meth:`sleep`, which the experience layer calls when
    the phase's generation is done (``release``): no all-gather per decoded token, and no collective while
    decoding, so the ranks decode independently (their batches differ). The unsharded policy costs its full
    size in memory during generation (as an engine's own copy would).
    """

    def __init__(self, batch_size: int = 256) -> None:
        self.batch_size = batch_size
        self.model: torch.nn.Module | None = None
        self.tokenizer: Any = None
        self._unsharded: list[Any] = []  # FSDP2 modules gathered for this rollout phase

    def bind(self, model: torch.nn.Module, tokenizer: Any) -> None:
        self.model, self.tokenizer = model, tokenizer

    def update_weights(self, model: torch.nn.Module) -> None:
        if model is not self.model:
            self.model = model

    @property
    def enable_sleep_mode(self) -> bool:
        """True for an FSDP2 policy: the experience layer then calls :meth:`sleep` when generation is done."""
        return bool(_fsdp_modules(self.model)) if self.model is not None else False

    def sleep(self) -> None:
        """Reshard an FSDP2 policy gathered for generation (its forwards reshard after each layer again)."""
        for module in self._unsharded:
            module.reshard()
            module.set_reshard_after_forward(module is not self.model, recurse=False)
        self._unsharded = []

    def wake(self) -> None:
        pass  # the next generation gathers an FSDP2 policy again

    def _unshard(self) -> None:
        """All-gather an FSDP2 policy once for the rollout phase (a collective: every rank's first generation of a
        phase, together). Blocks keep ``reshard_after_forward`` True, the root False, as ``configure_model`` set
        them, when :meth:`sleep` puts them back."""
        if self._unsharded or not (modules := _fsdp_modules(self.model)):
            return
        # FSDP2 keeps the unsharded parameters it allocates here for the whole run and all-gathers into them in
        # training: they must not be inference tensors, which Lightning's validation under NCCL would make.
        with torch.inference_mode(False):
            # FSDP2 makes the first module to run forward its root. A LoRA policy generates through its base
            # model's generate, below the root: initialise the root first, or the first layer reached would be.
            modules[0]._get_fsdp_state()._lazy_init()
            for module in modules:
                module.set_reshard_after_forward(False, recurse=False)
                module.unshard()
        self._unsharded = modules

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], sampling: SamplingParams,
                 seeds: list[int] | None = None) -> list[list[Completion]]:
        """``sampling.n`` completions per prompt. No prompt: ``[]``, the model untouched, except that an FSDP2
        policy is still gathered for the phase (:meth:`_unshard`, a collective), so a rank with nothing to
        sample keeps in step with the ranks that do (every rank makes the same calls:
        :func:`~lit_credit.rollout.loop.generate`)."""
        if self.model is None:
            raise RuntimeError("HFEngine.generate before bind(model, tokenizer)")
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"HFEngine.generate: {len(seeds)} seeds for {len(prompts)} prompts (one per prompt)")
        self._unshard()
        if not prompts:
            return []
        if seeds is None:
            seeds = torch.randint(0, 2 ** 62, (len(prompts),)).tolist()
        flat = [p for p in prompts for _ in range(sampling.n)]
        rows = row_seeds(seeds, sampling.n)
        out: list[Completion] = []
        for start in range(0, len(flat), self.batch_size):
            out.extend(self._generate(flat[start:start + self.batch_size], rows[start:start + self.batch_size],
                                      sampling))
        return [out[i * sampling.n:(i + 1) * sampling.n] for i in range(len(prompts))]

    def _generate(self, prompts: list[list[int]], seeds: torch.Tensor, sampling: SamplingParams) -> list[Completion]:
        model, tok = self.model, self.tokenizer
        device = next(model.parameters()).device
        pad, eos = tok.pad_token_id, tok.eos_token_id
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for row, p in enumerate(prompts):  # left padding for generation
            ids[row, width - len(p):] = torch.tensor(p)
            attn[row, width - len(p):] = 1
        sampler = SeededSampler(seeds.to(device), width, sampling)
        hf_model = model.get_base_model() if hasattr(model, "get_base_model") else model
        own_config, hf_model.generation_config = hf_model.generation_config, GenerationConfig()
        was_training = model.training
        model.eval()
        try:
            gen = model.generate(
                input_ids=ids.to(device), attention_mask=attn.to(device), do_sample=False,
                logits_processor=LogitsProcessorList([sampler]), max_new_tokens=sampling.max_new_tokens,
                eos_token_id=eos, pad_token_id=pad, stop_strings=list(sampling.stop) or None,
                tokenizer=tok if sampling.stop else None, synced_gpus=False, return_dict_in_generate=True,
            )
        finally:
            model.train(was_training)
            hf_model.generation_config = own_config
        new = gen.sequences[:, width:]
        logprobs = torch.stack(sampler.logprobs, 1)[:, :new.shape[1]] if sampler.logprobs else new.float()
        return [self._completion(row, lp, sampling.stop) for row, lp in zip(new.tolist(), logprobs.tolist())]

    def _completion(self, tokens: list[int], logprobs: list[float], stop: tuple[str, ...]) -> Completion:
        """Cut a generated row at its first eos (kept) or pad (dropped), then at the earliest stop string."""
        tok = self.tokenizer
        ends = [i for i, t in enumerate(tokens) if t in (tok.eos_token_id, tok.pad_token_id)]
        length, reason = len(tokens), "length"
        if ends:
            length, reason = ends[0] + (tokens[ends[0]] == tok.eos_token_id), "stop"
        text = tok.decode(tokens[:length], skip_special_tokens=True)
        if stop and any(s in text for s in stop):
            length = next(k for k in range(1, length + 1)
                          if any(s in tok.decode(tokens[:k], skip_special_tokens=True) for s in stop))
            text, reason = tok.decode(tokens[:length], skip_special_tokens=True), "stop"
        return Completion(tokens[:length], logprobs[:length], text, reason)


__all__ = ["HFEngine", "RolloutEngine"]
