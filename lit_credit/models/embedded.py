"""The embedded default policy: a ~1M-parameter Llama and its tokenizer, built and warm-started locally."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from functools import partial
from pathlib import Path

import lightning as L
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lit_credit.interfaces import Demonstrations
from lit_credit.models.chat import ChatCodec
from lit_credit.models.sft import SFTModule, StopAtGreedyExact, collate_demonstrations, encode_demonstration
from lit_credit.models.tokenizer import build_tokenizer
from lit_credit.quiet import StepProgressBar

log = logging.getLogger(__name__)
CHECK_ROWS = 256  # training demonstrations an ``sft_target`` is checked on
_RECIPE_VERSION = 1  # bump when the build recipe changes, so stale caches are not reused


def _task_identity(task: Demonstrations) -> dict:
    """The task's settings that shape its demonstrations and corpus (plain values and tuples of them)."""
    def plain(v) -> bool:
        return isinstance(v, (int, float, str, bool)) or (isinstance(v, tuple) and all(map(plain, v)))

    return {"class": type(task).__qualname__, **{k: v for k, v in sorted(vars(task).items()) if plain(v)}}


class CachedPolicy:
    """A policy built once into the cache directory :attr:`path` (by ``build()``, which returns it) and
    loaded from there by :class:`~lit_credit.models.policy.PolicySource`."""

    path: Path

    @property
    def built(self) -> bool:
        """Whether :attr:`path` holds a finished build (the rename that ends :meth:`save` has happened)."""
        return (self.path / "config.json").exists()

    def save(self, model: torch.nn.Module, tokenizer, note: str, record: dict) -> None:
        """``model`` and ``tokenizer`` (``save_pretrained``) and ``record`` (JSON, as ``note``) written to a
        temporary sibling of :attr:`path`, then renamed to it, so a crash never leaves a half-built cache;
        a concurrent build that got there first wins."""
        target = self.path
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            (tmp / note).write_text(json.dumps(record, indent=2))
            os.replace(tmp, target)
        except OSError:
            if not self.built:
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class EmbeddedPolicy(CachedPolicy):
    """Builds once, then reuses, an SFT-warm-started tiny policy for ``task`` under ``cache_dir``.

    ``task`` is what the warm start reads of a task (:class:`~lit_credit.interfaces.Demonstrations`, which every
    :class:`~lit_credit.tasks.Task` is). Recipe: a byte-level BPE tokenizer trained on the task corpus (digits
    split unless ``split_digits=False``), its chat template ending the tool list with the task's tool prompt, a
    Llama decoder (``hidden_size`` x ``num_layers``, tied embeddings), then supervised training on the task's gold
    demonstrations: ``sft_steps`` of it (cosine decay), or, with ``sft_target`` above 0, at a constant learning rate
    until greedy decoding reproduces that fraction of :data:`CHECK_ROWS` training demonstrations (checked every
    ``sft_check_every`` steps, ``sft_steps`` the cap, failing by name when reached first). A step count is a point
    on the learning curve that moves with the CPU's floating point; the criterion lands every machine at the same
    behaviour. The directory name hashes the whole recipe; it is written to a temporary directory and renamed, so
    a crash never leaves a half-built cache behind; its ``recipe.json`` records the checks.

    Constructing one only records the recipe; :meth:`build` (called by :meth:`PolicySource.prepare`, which
    the entry points call before they build the module) is the one step that trains.
    """

    def __init__(self, task: Demonstrations, cache_dir: str = ".cache/lit-credit", vocab_size: int = 512,
                 hidden_size: int = 128, num_layers: int = 4, num_heads: int = 4, intermediate_size: int = 384,
                 max_positions: int = 1024, sft_steps: int = 150, sft_batch_size: int = 32, sft_lr: float = 3e-3,
                 sft_target: float = 0.0, sft_check_every: int = 25, split_digits: bool = True,
                 seed: int = 0) -> None:
        if not 0 <= sft_target <= 1:
            raise ValueError(f"model.embedded.sft_target={sft_target} must be in (0, 1], the fraction of training "
                             "demonstrations greedy decoding reproduces, or 0 for exactly sft_steps")
        if sft_check_every < 1:
            raise ValueError(f"model.embedded.sft_check_every={sft_check_every} must be >= 1")
        self.task, self.cache_dir = task, cache_dir
        self.recipe = {"vocab_size": vocab_size, "split_digits": split_digits, "hidden_size": hidden_size,
                       "num_layers": num_layers, "num_heads": num_heads, "intermediate_size": intermediate_size,
                       "max_positions": max_positions, "sft_steps": sft_steps, "sft_batch_size": sft_batch_size,
                       "sft_lr": sft_lr, "seed": seed}
        if sft_target:  # only then: the fixed-step recipes keep their cache directories
            self.recipe |= {"sft_target": sft_target, "sft_check_every": sft_check_every, "check_rows": CHECK_ROWS}

    @property
    def path(self) -> Path:
        key = json.dumps({"v": _RECIPE_VERSION, "task": _task_identity(self.task), **self.recipe}, sort_keys=True)
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        return Path(self.cache_dir).expanduser().resolve() / "embedded" / f"{self.task.name}-{digest}"

    def build(self) -> Path:
        """The cache directory, built first when missing (the tokenizer, the model, ``sft_steps`` of SFT)."""
        target = self.path
        if self.built:
            return target
        log.info("building the embedded policy at %s (once; later runs reuse it)", target)
        r = self.recipe
        with torch.random.fork_rng():
            torch.manual_seed(r["seed"])
            tokenizer = build_tokenizer(self.task.corpus(), vocab_size=r["vocab_size"],
                                        split_digits=r["split_digits"], tool_prompt=self.task.tool_prompt)
            config = LlamaConfig(
                vocab_size=len(tokenizer), hidden_size=r["hidden_size"], intermediate_size=r["intermediate_size"],
                num_hidden_layers=r["num_layers"], num_attention_heads=r["num_heads"],
                num_key_value_heads=r["num_heads"], max_position_embeddings=r["max_positions"],
                tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
            )
            model = LlamaForCausalLM(config)
            record = {"task": _task_identity(self.task), **r}
            if r["sft_steps"] > 0:
                record |= self._sft(model, tokenizer)
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        self.save(model, tokenizer, "recipe.json", record)
        return target

    def _sft(self, model: torch.nn.Module, tokenizer) -> dict:
        """Trains ``model`` in place; returns what the build record keeps of it (the criterion's checks)."""
        r = self.recipe
        codec = ChatCodec(tokenizer, tool_prompt=self.task.tool_prompt)
        collate = partial(collate_demonstrations, pad_id=codec.pad_id)
        demos = [encode_demonstration(codec, d)
                 for d in self.task.demonstrations(r["sft_steps"] * r["sft_batch_size"], seed=r["seed"] + 1)]
        loader = torch.utils.data.DataLoader(demos, batch_size=r["sft_batch_size"], shuffle=True, collate_fn=collate,
                                             generator=torch.Generator().manual_seed(r["seed"]))
        callbacks: list[L.Callback] = [StepProgressBar("SFT warm start")]
        target = r.get("sft_target")
        if target:
            rows = [encode_demonstration(codec, d) for d in self.task.demonstrations(CHECK_ROWS, seed=r["seed"] + 2)]
            callbacks.append(stop := StopAtGreedyExact(collate(rows), target, r["sft_check_every"]))
        trainer = L.Trainer(max_steps=r["sft_steps"], accelerator="cpu", devices=1, logger=False,
                            enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0,
                            callbacks=callbacks)
        trainer.fit(SFTModule(model, lr=r["sft_lr"], total_steps=None if target else r["sft_steps"]), loader)
        if not target:
            return {}
        if stop.reached is None:
            best = max(stop.checks, key=lambda c: c[1], default=(0, 0.0))
            raise RuntimeError(
                f"the embedded policy's warm start did not reach model.embedded.sft_target={target} (greedy exact "
                f"match on {CHECK_ROWS} training demonstrations) in model.embedded.sft_steps={r['sft_steps']} "
                f"steps (best {best[1]:.3f} at step {best[0]}); fix: raise model.embedded.sft_steps or lower "
                "model.embedded.sft_target")
        log.info("warm start: greedy exact match %.3f >= %s on training demonstrations at SFT step %d",
                 stop.reached[1], target, stop.reached[0])
        return {"sft_stopped_at": stop.reached[0], "sft_checks": stop.checks}
