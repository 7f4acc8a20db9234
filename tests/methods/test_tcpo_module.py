"""TCPO end to end: turn bookkeeping, the math_revise task and verifier, and GRPOModule as
TCPO (credit=tcpo augment=counterfactual metrics=turn): its multi-turn metrics, its counterfactual resampling on a
real (tiny) step, the refusal without an augmenter and the augmenter idle for presets that need none."""
from __future__ import annotations

import math

import pytest
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate

from lit_credit.methods import GRPOModule
from lit_credit.rollout.augment import CounterfactualTurns
from lit_credit.train import build
from tests.credit.common import make_batch

MATH_SMALL = ["task.num_train=200", "task.num_test=20", "model.embedded.sft_steps=20"]


def two_turn_batch() -> object:
    # Rollout 0: prompt (2 tokens), turn 0 (2 tokens), feedback (1), turn 1 (3 tokens).
    # Rollout 1: prompt (2), turn 0 (3 tokens), padding (3).
    turn_ids = torch.tensor([[-1, -1, 0, 0, -1, 1, 1, 1], [-1, -1, 0, 0, 0, -1, -1, -1]])
    logp = torch.tensor([[0, 0, -1.0, -3.0, 0, -0.5, -0.5, -2.0], [0, 0, -0.2, -0.4, -0.6, 0, 0, 0]])
    return make_batch((turn_ids >= 0).float(), torch.tensor([0, 0]), torch.tensor([1.0, 0.0]),
                      turn_ids=turn_ids, behaviour_logprobs=logp,
                      turn_scores=torch.tensor([[0.0, 1.0], [0.0, 0.0]]),
                      turn_mask=torch.tensor([[True, True], [True, False]]))


def test_turn_surprisal_and_turn_starts_by_hand():
    batch = two_turn_batch()
    # Surprisal = mean -logp of a turn's tokens: (1 + 3) / 2 = 2, (0.5 + 0.5 + 2) / 3 = 1; (0.2+0.4+0.6)/3 = 0.4.
    assert torch.allclose(batch.turn_surprisal(), torch.tensor([[2.0, 1.0], [0.4, 0.0]]))
    # First token of each turn; T = 8 marks a turn not reached.
    assert batch.turn_starts().tolist() == [[2, 5], [2, 8]]






def test_counterfactual_resampling_uses_exact_histories_and_the_verifier(make_cfg):
    cfg = make_cfg("experiment=tcpo_math", "debug=fdr", *MATH_SMALL, "data.prompts_per_step=2",
                   "data.sampling.n=4", "augment.top_l=2", "augment.samples=3", fast_task=False)
    module, datamodule, trainer = build(cfg)
    assert type(module) is GRPOModule and module.credit.needs == {"alt_scores", "cf_mask"}
    assert isinstance(module.augment, CounterfactualTurns) and module.augment.score == "verifier"
    assert list(module.metric_sets) == ["turn"]
    calls, seen = [], []
    engine = datamodule.experience.engine
    generate = engine.generate
    engine.generate = lambda prompts, sampling, seeds=None: calls.append((prompts, sampling)) or \
        generate(prompts, sampling, seeds)
    augment = module.augment_experience
    module.augment_experience = lambda batch: seen.append(batch) or augment(batch)
    trainer.fit(module, datamodule=datamodule)
    batch = seen[0]
    # tcpo_math continues after success (task.stop_on_success=false): every rollout plays all 3 turns.
    assert batch.turn_mask.shape[1] == 3 and batch.turn_mask.all()
    selected = batch.extras["cf_mask"]
    # top-L = 2 turns per group (every group has >= 2 reached turns: 4 rollouts each).
    assert selected.sum().item() == 2 * 2 and not (selected & ~batch.turn_mask).any()
    cf_calls = [prompts for prompts, sampling in calls if sampling.n == 3]  # rollouts use n=4, validation n=1
    assert len(cf_calls) == 1 and len(cf_calls[0]) == 4
    prompts = cf_calls[0]
    starts = batch.turn_starts()
    expected = [batch.input_ids[i, :starts[i, k]].tolist() for i, k in selected.nonzero().tolist()]
    assert prompts == expected
    alt = batch.extras["alt_scores"]
    assert alt.shape == (*batch.turn_mask.shape, 3)
    assert torch.isnan(alt[~selected]).all() and ((alt[selected] == 0) | (alt[selected] == 1)).all()
    m = {k: float(v) for k, v in trainer.callback_metrics.items()}
    assert m["tcpo/cf_turns"] == 4.0 and 0.0 < m["perf/extra_experience_frac"] < 1.0
    assert "train/pass@turn3" in m and "credit/turn_type/improve/frac" in m
    assert 0.0 <= m["train/regress_after_success"] <= m["train/pass@turn3"]
    if not math.isnan(m["tcpo/cf_alt_mean"]):
        assert m["tcpo/cf_alt_mean"] == pytest.approx(alt[selected].mean().item())


@pytest.mark.parametrize("credit", ["credit=grpo", "credit=mt_grpo", "credit=tcpo", "credit.preset=retro"])
def test_baselines_and_method_share_the_module(credit, make_cfg):
    # experiment=tcpo_math keeps augment=counterfactual for every credit; it runs only when the estimator needs
    # its extras (credit=tcpo, preset tcpo): for the others it stays idle, no engine call at n = augment.samples.
    # data.val_samples=0: the sampled validation (n = 8 in tcpo_math) would be one more n in the engine's calls
    cfg = make_cfg("experiment=tcpo_math", credit, "debug=fdr", *MATH_SMALL, "augment.samples=3", "data.val_samples=0",
                   fast_task=False)
    module, datamodule, trainer = build(cfg)
    assert type(module) is GRPOModule and isinstance(module.augment, CounterfactualTurns)
    resamples = credit == "credit=tcpo"
    assert bool(module.credit.needs) == resamples
    seen, calls = [], []
    engine = datamodule.experience.engine
    generate = engine.generate
    engine.generate = lambda prompts, sampling, seeds=None: calls.append(sampling.n) or generate(prompts, sampling, seeds)
    augment = module.augment_experience
    module.augment_experience = lambda batch: seen.append(batch) or augment(batch)
    trainer.fit(module, datamodule=datamodule)
    m = {k: float(v) for k, v in trainer.callback_metrics.items()}
    # rollouts sample n = 2 (debug=fdr) then n = 1 per later turn, validation n = 1: n = 3 only for the alternatives
    assert calls.count(3) == int(resamples) and set(calls) <= {1, 2, 3}
    assert ("perf/extra_experience_frac" in m) == resamples and ("tcpo/cf_turns" in m) == resamples
    assert sorted(seen[0].extras) == (["alt_scores", "cf_mask"] if resamples else [])
    assert 0.0 <= m["train/success"] <= 1.0


def test_tcpo_without_an_augmenter_is_refused_naming_the_fix(make_cfg):
    # preset tcpo reads batch.extras alt_scores / cf_mask, which only an augmenter adds: `~augment` drops
    # tcpo_math's augment=counterfactual, and the module refuses before it loads any policy.
    cfg = make_cfg("experiment=tcpo_math", "~augment", fast_task=False)
    assert cfg.method.augment is None and cfg.credit.preset == "tcpo"
    with pytest.raises(InstantiationException, match=r"needs batch.extras \['alt_scores', 'cf_mask'\].*"
                                                     r"fix: augment=counterfactual"):
        instantiate(cfg.method, policy=None)
    # the same from Python: a ValueError naming the fix
    credit, loss = instantiate(cfg.credit), instantiate(cfg.loss)
    with pytest.raises(ValueError, match="augment=counterfactual"):
        GRPOModule(policy=None, credit=credit, loss=loss)
    # presets that need no counterfactuals (and preset tcpo with w_cf = 0) need no augmenter
    assert instantiate(make_cfg("experiment=tcpo_math", "~augment", "credit.preset=retro", fast_task=False).credit
                       ).needs == frozenset()
    assert instantiate(make_cfg("experiment=tcpo_math", "credit.w_cf=0", fast_task=False).credit).needs == frozenset()


@pytest.mark.parametrize("preset", ["trajectory", "turn", "diff", "retro", "retro_hindsight", "tcpo"])
def test_every_rung_of_the_ladder_composes(preset, make_cfg):
    credit = instantiate(make_cfg("experiment=tcpo_math", f"credit.preset={preset}", fast_task=False).credit)
    assert credit.preset == preset and bool(credit.needs) == (preset == "tcpo")  # resampling only for tcpo
