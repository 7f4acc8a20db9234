"""DAPO's dynamic sampling refills a step from the prompt stream: hand-counted draws, the draw cap, a run that
always advances, and the stream's position (no batch served twice, exact re-entry after a checkpoint)."""
from __future__ import annotations

import copy

import pytest
import torch

from data_modules.rollout import PromptStream
from lit_credit.train import build
from lit_credit.types import RewardResult, cat_batches
from tests.credit.common import make_batch

P, N = 4, 2  # prompts per step, rollouts per prompt
RUN = ["loss=dapo", "method.dynamic_sampling=true", f"data.prompts_per_step={P}", f"data.sampling.n={N}",
       "data.sampling.max_new_tokens=4", "callbacks=none", "logger=csv", "validate_first=false",
       "+trainer.limit_val_batches=0", "+trainer.enable_checkpointing=false", "method.optimizer.lr=1e-3"]


class PromptReward:
    """Scores by prompt, recording the order prompts are scored in: a prompt in ``spread`` scores 1 on its
    first rollout and 0 on the others (a group with a reward spread), every other prompt 0 (zero variance)."""

    def __init__(self, spread: set[str]) -> None:
        self.spread, self.seen = spread, []

    def __call__(self, row, replies, **kwargs):
        first = not self.seen or self.seen[-1] != row["id"]
        self.seen.append(row["id"])
        return RewardResult(float(row["id"] in self.spread and first))


def run(make_cfg, positions: dict[int, list[int]], steps: int, max_draws: int):
    """``steps`` DAPO steps where the prompts at ``positions[k]`` of stream batch k have a reward spread."""
    module, datamodule, trainer = build(make_cfg(*RUN, f"trainer.max_steps={steps}",
                                                 f"method.max_sampling_draws={max_draws}"))
    datamodule.setup("fit")
    batch = datamodule.stream.batch
    reward = PromptReward({batch(k)[i]["id"] for k, idx in positions.items() for i in idx})
    datamodule.experience.reward = reward
    traces = []
    step = module.training_step
    module.training_step = lambda *a: (step(*a), traces.append(module.credit_trace[0]))[0]
    trainer.fit(module, datamodule=datamodule)
    order = [i for j, i in enumerate(reward.seen) if j % N == 0]  # one entry per prompt group, in draw order
    return module, datamodule, trainer, traces, order, batch


def ids_of(batch_rows):
    return [r["id"] for r in batch_rows]


def test_refill_draws_until_the_step_holds_prompts_per_step_informative_groups(make_cfg):
    # Informative prompts: batch 0 position 1; batch 2 none; batch 3 positions 0, 3; batch 4 positions 0-2.
    # Step 1 gets batch 0 from the loader, which has prefetched batch 1, so the refills draw batches 2, 3, 4:
    # informative groups after each draw 1, 1, 3, 6 >= 4 -> 4 draws. Kept: the first 4 in draw order, i.e.
    # batch 0's #1, batch 3's #0 and #3, batch 4's #0 (batch 4's #1, #2 dropped); group ids are minted 4 per
    # draw (0-3, 4-7, 8-11, 12-15), so the kept groups are 1, 8, 11, 12. kept_frac = 4 / 16 drawn groups.
    _, datamodule, trainer, traces, order, batch = run(make_cfg, {0: [1], 3: [0, 3], 4: [0, 1, 2]}, 1, 10)
    metrics = trainer.callback_metrics
    assert trainer.global_step == 1
    assert float(metrics["train/sampling_draws"]) == 4
    assert float(metrics["train/informative_groups"]) == 4
    assert float(metrics["train/kept_frac"]) == 0.25
    # the rollout metrics are over every draw: 1 + 0 + 2 + 3 = 6 of the 16 drawn groups have a spread
    assert float(metrics["train/zero_variance_groups"]) == pytest.approx(1 - 6 / 16)
    trained = traces[0].batch
    assert sorted(set(trained.group_ids.tolist())) == [1, 8, 11, 12] and len(trained) == P * N
    expected = [batch(0)[1], batch(3)[0], batch(3)[3], batch(4)[0]]
    assert [m["row"]["id"] for m in trained.metadata[::N]] == ids_of(expected)
    assert order == ids_of(batch(0) + batch(2) + batch(3) + batch(4))
    assert (traces[0].advantages != 0).any()
    # the stream: batches 0-4 handed out, batch 1 still pending for the next step
    assert datamodule.state_dict() == {"next_batch": 5, "pending": [1], "next_group": 16}


def test_the_draw_cap_trains_on_what_was_found_and_the_run_advances(make_cfg):
    # Informative prompts: batch 0 position 1, batch 3 positions 0, 3; max_sampling_draws=2. Step 1: batch 0
    # (prefetch: 1), refill batch 2 -> 1 informative group (batch 0's #1, group id 1) at the cap: trained alone.
    # Step 2: the pending batch 1 (prefetch: 3), refill batch 4 -> none informative at the cap: it trains on
    # batch 1 with every advantage 0, and the run still takes its step. Batch 3 stays pending.
    _, datamodule, trainer, traces, order, batch = run(make_cfg, {0: [1], 3: [0, 3]}, 2, 2)
    assert trainer.global_step == 2 and len(traces) == 2
    first, second = traces
    assert first.batch.group_ids.unique().tolist() == [1] and (first.advantages != 0).any()
    assert [m["row"]["id"] for m in second.batch.metadata[::N]] == ids_of(batch(1))
    assert len(second.batch) == P * N and (second.advantages == 0).all()
    assert order == ids_of(batch(0) + batch(2) + batch(1) + batch(4))  # no prompt batch served twice
    assert datamodule.state_dict() == {"next_batch": 5, "pending": [3], "next_group": 16}
    metrics = trainer.callback_metrics  # the last step's
    assert float(metrics["train/sampling_draws"]) == 2
    assert float(metrics["train/informative_groups"]) == 0 and float(metrics["train/kept_frac"]) == 0


def test_no_informative_group_at_all_still_steps_with_zero_advantages(make_cfg):
    # Every group at zero variance, max_sampling_draws=3: batches 0, 2, 3 drawn, the step trains on batch 0
    # with advantages 0, so DAPO's loss (no KL) is exactly 0; global_step still advances. Two steps: the first
    # has a spread (batch 0, prompt 0) and gives AdamW momentum; the second finds none and must not move the
    # weights (a zero gradient through AdamW would, by its momentum).
    module, datamodule, trainer = build(make_cfg(*RUN, "trainer.max_steps=2", "method.max_sampling_draws=3"))
    datamodule.setup("fit")
    datamodule.experience.reward = PromptReward({datamodule.stream.batch(0)[0]["id"]})
    snapshots = []
    step = module.training_step
    module.training_step = lambda *a: (snapshots.append(copy.deepcopy(module.policy.state_dict())), step(*a))[1]
    trainer.fit(module, datamodule=datamodule)
    moved = lambda a, b: any(not torch.equal(a[k], b[k]) for k in a)  # noqa: E731
    assert trainer.global_step == 2 and len(snapshots) == 2
    assert moved(snapshots[0], snapshots[1])  # step 1 had a group with a spread: an update
    assert not moved(snapshots[1], module.policy.state_dict())  # step 2 had none: the weights stay
    assert float(trainer.callback_metrics["train/informative_groups"]) == 0.0
    _, _, trainer, traces, order, batch = run(make_cfg, {}, 1, 3)
    assert order == ids_of(batch(0) + batch(2) + batch(3))
    assert trainer.global_step == 1
    assert float(trainer.callback_metrics["train/sampling_draws"]) == 3
    assert (traces[0].advantages == 0).all()
    assert float(trainer.callback_metrics["loss/policy"]) == 0.0




def test_cat_batches_right_pads_rows_and_turns():
    a = make_batch(torch.ones(2, 3), torch.tensor([0, 0]), torch.tensor([1.0, 0.0]),
                   turn_scores=torch.ones(2, 1), turn_mask=torch.ones(2, 1, dtype=torch.bool),
                   reward_parts={"x": torch.tensor([1.0, 2.0])}, metadata=[{"i": 0}, {"i": 1}])
    b = make_batch(torch.ones(1, 5), torch.tensor([1]), torch.tensor([0.5]), turn_ids=torch.zeros(1, 5).long(),
                   turn_mask=torch.ones(1, 2, dtype=torch.bool), metadata=[{"i": 2}])
    b.input_ids.fill_(7)
    out = cat_batches([a, b], pad_id=9)
    assert out.input_ids.tolist() == [[0, 0, 0, 9, 9], [0, 0, 0, 9, 9], [7] * 5]
    assert out.attention_mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1] * 5]
    assert out.turn_ids.tolist() == [[-1, -1, -1, -1, -1]] * 2 + [[0] * 5]
    assert out.group_ids.tolist() == [0, 0, 1] and out.scores.tolist() == [1.0, 0.0, 0.5]
    assert out.turn_mask.tolist() == [[True, False], [True, False], [True, True]]
    assert out.turn_scores.tolist() == [[1.0, 0.0], [1.0, 0.0], [0.0, 0.0]]  # b had none: 0
    assert out.reward_parts["x"].tolist() == [1.0, 2.0, 0.0]  # b lacked the part: 0
    assert [m["i"] for m in out.metadata] == [0, 1, 2]


def test_prompt_stream_hands_each_batch_out_once_and_resumes_exactly():
    # 10 rows, batches of 3: 3 batches an epoch (row 10 - 9 = 1 dropped each epoch). Batch k = rows
    # order_e[3i:3i+3], e, i = divmod(k, 3), order_e the (e+1)-th randperm(10) of a generator seeded 7.
    rows = [{"id": i} for i in range(10)]
    generator = torch.Generator().manual_seed(7)
    orders = [torch.randperm(10, generator=generator).tolist() for _ in range(3)]
    expect = [[rows[j] for j in orders[k // 3][3 * (k % 3):3 * (k % 3) + 3]] for k in range(9)]
    stream = PromptStream(rows, 3, seed=7)
    loader = iter(stream)
    assert next(loader) == expect[0] and next(loader) == expect[1]  # step 1's batch and Lightning's prefetch
    stream.position["pending"].pop(0)  # step 1 uses batch 0 (generate_experience does this)
    assert stream.draw() == expect[2]  # a refill: the next fresh batch, never yielded by the loader
    assert stream.draw() == expect[3]  # the next epoch's first
    epoch = [r["id"] for k in range(3) for r in expect[k]]
    assert len(set(epoch)) == 9  # no prompt twice within an epoch
    saved = copy.deepcopy(stream.position)
    assert saved == {"next_batch": 4, "pending": [1]}
    original = [next(loader) for _ in range(3)]  # batches 4, 5, 6 (batch 1 was served already)
    assert original == expect[4:7]
    resumed = iter(PromptStream(rows, 3, seed=7, position=saved))  # a fresh run from the checkpointed position
    assert next(resumed) == expect[1]  # the pending batch first: what the uninterrupted run's step 2 used
    assert [next(resumed) for _ in range(3)] == expect[4:7]
    assert PromptStream(rows, 3, seed=7).batch(8) == expect[8]  # a pure function of (seed, k)


def test_the_draw_cap_must_be_positive(make_cfg):
    from lit_credit.config import ConfigError, check_config

    with pytest.raises(ConfigError, match=r"method.max_sampling_draws=0: dynamic sampling draws at least the step's "
                                          r"own prompt batch; fix: set method.max_sampling_draws=1"):
        check_config(make_cfg("loss=dapo", "method.dynamic_sampling=true", "method.max_sampling_draws=0"))
