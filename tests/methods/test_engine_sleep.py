"""Sleep mode: an engine with ``enable_sleep_mode`` sleeps through the policy update and wakes before the push.

Real Trainer runs (the tiny embedded policy for GRPO, the scripted DPA game on its LoRA policy) with engines
that record every call and a copy of the policy's weights at that moment, so the test sees both the order of
the calls and that the update happened while the engine slept.
"""
from __future__ import annotations

import pytest
import torch

from lit_credit.rollout import HFEngine
from lit_credit.train import build
from tests.methods.test_dpa_module import NO_EXPLORE, SMALL, ScriptedEngine

# 16 groups x 8 rollouts: the first step has informative groups whatever the warm start (with 8 x 4 a weak start
# can draw none, and then no weight moves while the engine sleeps).
GRPO_RUN = ["trainer.max_steps=2", "method.optimizer.lr=1e-2", "data.prompts_per_step=16", "data.sampling.n=8",
            "data.sampling.max_new_tokens=8", "logger=csv", "callbacks=none", "validate_first=false",
            "trainer.val_check_interval=100"]


class Recording:
    """Records ``(call, the bound policy's flattened weights)`` for every engine call, on top of a real engine."""

    def __init__(self, *args, sleep_mode: bool, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sleep_mode, self.events = sleep_mode, []

    @property
    def enable_sleep_mode(self) -> bool:
        return self.sleep_mode

    def _record(self, name: str) -> None:
        self.events.append((name, torch.cat([p.detach().flatten().clone() for p in self.model.parameters()])))

    def bind(self, model, tokenizer):
        super().bind(model, tokenizer)
        self._record("bind")

    def generate(self, prompts, sampling, seeds=None):
        self._record("generate")
        return super().generate(prompts, sampling, seeds)

    def update_weights(self, model):
        self._record("update_weights")
        super().update_weights(model)

    def sleep(self):
        self._record("sleep")
        super().sleep()

    def wake(self):
        self._record("wake")
        super().wake()

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.events]


class RecordingHFEngine(Recording, HFEngine):
    pass


class RecordingScriptedEngine(Recording, ScriptedEngine):
    pass


def grpo_run(make_cfg, sleep_mode: bool) -> RecordingHFEngine:
    module, datamodule, trainer = build(make_cfg(*GRPO_RUN))
    datamodule.experience.engine = engine = RecordingHFEngine(sleep_mode=sleep_mode)
    trainer.fit(module, datamodule=datamodule)
    assert trainer.global_step == 2
    return engine


def test_grpo_step_sleeps_through_the_update_and_wakes_before_the_push(make_cfg):
    engine = grpo_run(make_cfg, sleep_mode=True)
    # Per step: generate -> sleep -> (update) -> wake -> update_weights; bind once, on the first step.
    assert engine.names == ["bind", "generate", "sleep", "wake", "update_weights",
                            "generate", "sleep", "wake", "update_weights"]
    weights = dict(engine.events[:5])
    assert torch.equal(weights["generate"], weights["sleep"])  # nothing trained before the engine slept
    assert not torch.equal(weights["sleep"], weights["wake"])  # the update ran while it slept
    assert torch.equal(weights["wake"], weights["update_weights"])  # the weights pushed are the new ones


def test_grpo_without_sleep_mode_never_sleeps(make_cfg):
    engine = grpo_run(make_cfg, sleep_mode=False)
    assert engine.names == ["bind", "generate", "update_weights", "generate", "update_weights"]  # as before


@pytest.mark.parametrize("sleep_mode", [True, False])
def test_dpa_step_sleeps_after_the_game_and_wakes_at_the_next_push(make_cfg, sleep_mode):
    # roles=separate: 2 optimiser steps per round, so max_steps=4 is two rounds (two games).
    module, datamodule, trainer = build(make_cfg(*SMALL, NO_EXPLORE, "trainer.max_steps=4", fast_task=False))
    datamodule.setup("fit")
    engine = RecordingScriptedEngine([*datamodule.train_set, *datamodule.val_set], sleep_mode=sleep_mode)
    datamodule.experience.engine = engine
    trainer.fit(module, datamodule=datamodule)
    assert trainer.global_step == 4
    # A round: the proposer's push and draw, then each role switch pushes its adapter (proposer/reviser/approver
    # share the generator's): verifier push + draw, reviser push + draw, approver draw. The update follows.
    game = ["update_weights", "generate", "update_weights", "generate", "update_weights", "generate", "generate"]
    if not sleep_mode:
        assert engine.names == ["bind", *game, *game]  # as before: no sleep, no wake
        return
    assert engine.names == ["bind", *game, "sleep", "wake", *game, "sleep"]
    sleep, wake = engine.names.index("sleep"), engine.names.index("wake")
    assert torch.equal(engine.events[sleep - 1][1], engine.events[sleep][1])  # the game's last draw: no update yet
    assert not torch.equal(engine.events[sleep][1], engine.events[wake][1])  # both adapters moved while asleep
    assert engine.names[wake + 1] == "update_weights"  # woken to receive the new weights, before any draw
