"""The HF ``generate`` engine (the :class:`~lit_credit.interfaces.RolloutEngine` protocol is in
lit_credit.interfaces)."""
from __future__ import annotations

from typing import Any

import torch

from lit_credit.interfaces import RolloutEngine
from lit_credit.models.logprobs import picked_logprobs_
from lit_credit.types import Completion, SamplingParams


class HFEngine:
    """``model.generate`` with KV cache on the trainer's own policy: no weight copy, so sync is a no-op.

    Behaviour log-probs are ``log_softmax(z / T)[token]`` of each sampled token, ``z`` the model's raw logits
    (``output_logits``, before any logits processor) and ``T`` the sampling temperature (1 for greedy): the
    distribution the trainer recomputes for a batch sampled at ``T`` (``token_logprobs(temperature=T)``).
    Top-p is not renormalised (as in verl): with ``top_p < 1`` tokens are drawn from the nucleus of
    ``softmax(z / T)``, but their log-probs are of the full tempered softmax, so engine and trainer agree.
    """

    def __init__(self, batch_size: int = 256) -> None:
        self.batch_size = batch_size
        self.model: torch.nn.Module | None = None
        self.tokenizer: Any = None

    def bind(self, model: torch.nn.Module, tokenizer: Any) -> None:
        self.model, self.tokenizer = model, tokenizer

    def update_weights(self, model: torch.nn.Module) -> None:
        if model is not self.model:
            self.model = model

    def sleep(self) -> None:
        pass

    def wake(self) -> None:
        pass

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        if self.model is None:
            raise RuntimeError("HFEngine.generate before bind(model, tokenizer)")
        flat = [p for p in prompts for _ in range(sampling.n)]
        out: list[Completion] = []
        for start in range(0, len(flat), self.batch_size):
            out.extend(self._generate(flat[start:start + self.batch_size], sampling))
        return [out[i * sampling.n:(i + 1) * sampling.n] for i in range(len(prompts))]

    def _generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        model, tok = self.model, self.tokenizer
        device = next(model.parameters()).device
        pad, eos = tok.pad_token_id, tok.eos_token_id
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for row, p in enumerate(prompts):  # left padding for generation
            ids[row, width - len(p):] = torch.tensor(p)
            attn[row, width - len(p):] = 1
        was_training = model.training
        model.eval()
        try:
            sample = {} if sampling.greedy else {"temperature": sampling.temperature, "top_p": sampling.top_p,
                                                 "top_k": 0}  # top_k=0: no hidden top-50 truncation
            gen = model.generate(
                input_ids=ids.to(device), attention_mask=attn.to(device), do_sample=not sampling.greedy, **sample,
                max_new_tokens=sampling.max_new_tokens, eos_token_id=eos, pad_token_id=pad,
                stop_strings=list(sampling.stop) or None, tokenizer=tok if sampling.stop else None,
                output_logits=True, return_dict_in_generate=True,
            )
        finally:
            model.train(was_training)
        new = gen.sequences[:, width:]
        logits = torch.stack(gen.logits, 1).float()  # [N, L, V], a new tensor: divided and consumed in place
        if not sampling.greedy:
            logits.div_(sampling.temperature)
        logprobs = picked_logprobs_(logits, new)
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
