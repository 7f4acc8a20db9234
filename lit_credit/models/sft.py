"""Supervised warm start on gold demonstrations (its own LightningModule)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import lightning as L
import torch
from torch import Tensor

from lit_credit.models.chat import ChatCodec


def encode_demonstration(codec: ChatCodec, demo: dict[str, Any]) -> tuple[list[int], list[int]]:
    """Token ids of a gold conversation and its loss mask (1 on assistant turns, end-of-turn included).

    Built from the same pieces as a rollout (prompt, reply, feedback, reply, ...), so SFT and RL see the
    same tokens. The prompt is every message before the first assistant turn.
    """
    messages = demo["messages"]
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    ids = codec.prompt_ids(messages[:first], demo.get("tools"))
    mask = [0] * len(ids)
    pending: list[dict[str, str]] = []
    for message in messages[first:]:
        if message["role"] != "assistant":
            pending.append(message)
            continue
        if pending:
            feedback = codec.feedback_ids(pending)
            ids, mask, pending = ids + feedback, mask + [0] * len(feedback), []
        reply = codec.reply_ids(message["content"])
        ids, mask = ids + reply, mask + [1] * len(reply)
    return ids, mask


def pad_right(rows: Iterable[list[int]], value: int) -> Tensor:
    rows = list(rows)
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=torch.long)


def greedy_exact(model: torch.nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """Per demonstration, whether greedy decoding reproduces it: every assistant token (end of turn included) is
    the argmax of the logits before it. With the demonstration's own tool responses as feedback, this is exactly
    what greedy decoding emits turn by turn, computed in one forward pass (teacher forcing)."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
    scored = batch["loss_mask"][:, 1:].bool()
    return ((logits.argmax(-1) == batch["input_ids"][:, 1:]) | ~scored).all(-1)


class StopAtGreedyExact(L.Callback):
    """Stops SFT at the first check (every ``every`` steps) where :func:`greedy_exact` over ``batch`` (training
    demonstrations) reaches ``target``; ``checks`` keeps ``(step, fraction)`` of each check, ``reached`` the one
    that stopped it (None while not reached)."""

    def __init__(self, batch: dict[str, Tensor], target: float, every: int) -> None:
        self.batch, self.target, self.every = batch, target, every
        self.checks: list[tuple[int, float]] = []
        self.reached: tuple[int, float] | None = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.global_step % self.every:
            return
        model = pl_module.model
        was_training = model.training
        model.eval()
        with torch.no_grad():
            fraction = greedy_exact(model, self.batch).float().mean().item()
        model.train(was_training)
        self.checks.append((trainer.global_step, fraction))
        if fraction >= self.target:
            self.reached, trainer.should_stop = (trainer.global_step, fraction), True


class SFTModule(L.LightningModule):
    """Next-token cross-entropy on assistant tokens only; AdamW with linear warmup, then cosine decay to
    ``total_steps`` (a constant learning rate when ``total_steps`` is None: a run that stops at a criterion)."""

    def __init__(self, model: torch.nn.Module, lr: float = 3e-3, total_steps: int | None = 150,
                 warmup_steps: int = 10):
        super().__init__()
        self.model, self.lr, self.total_steps, self.warmup_steps = model, lr, total_steps, warmup_steps

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        labels = batch["input_ids"].masked_fill(batch["loss_mask"] == 0, -100)
        loss = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss
        self.log("sft/loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.model.parameters(), lr=self.lr, weight_decay=0.0)
        warm = torch.optim.lr_scheduler.LinearLR(opt, 0.1, 1.0, total_iters=max(self.warmup_steps, 1))
        if self.total_steps is None:
            return {"optimizer": opt, "lr_scheduler": {"scheduler": warm, "interval": "step"}}
        decay = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(self.total_steps - self.warmup_steps, 1))
        sched = torch.optim.lr_scheduler.SequentialLR(opt, [warm, decay], milestones=[max(self.warmup_steps, 1)])
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def collate_demonstrations(encoded: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, Tensor]:
    ids = pad_right((e[0] for e in encoded), pad_id)
    lengths = torch.tensor([len(e[0]) for e in encoded])
    return {
        "input_ids": ids,
        "attention_mask": (torch.arange(ids.shape[1]) < lengths[:, None]).long(),
        "loss_mask": pad_right((e[1] for e in encoded), 0),
    }
