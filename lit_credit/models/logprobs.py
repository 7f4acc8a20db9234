"""Per-token log-probs and entropies of a causal LM."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def token_logprobs(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
    """``logp[b, t] = log pi(input_ids[b, t] | input_ids[b, :t])`` and the entropy of that distribution.

    Shape: input_ids, attention_mask [B, T] -> logp [B, T], entropy [B, T]; position 0 (no context) is 0.
    Computed in float32 whatever the model dtype.
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    logp_all = logits.log_softmax(-1)
    logp = logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return F.pad(logp, (1, 0)), F.pad(entropy, (1, 0))
