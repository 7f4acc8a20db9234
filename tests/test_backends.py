"""Failing backends: retries with backoff, timeouts, failures scored and counted, and a run that goes on."""
from __future__ import annotations

import math
import threading

import pytest
import torch

from lit_credit import backends
from lit_credit.backends import COUNTS, BackendFailure, CountsSince, Retry
from lit_credit.config import ConfigError, check_config
from lit_credit.rollout import HFEngine
from lit_credit.train import build
from lit_credit.types import RewardResult


class Flaky:
    """Fails (raises, or hangs past any timeout) for the first ``fails`` calls, then answers ``value``."""

    def __init__(self, fails: int, value: str = "ok", hang: float = 0.0) -> None:
        self.fails, self.value, self.hang, self.calls = fails, value, hang, 0
        self.release = threading.Event()

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.fails:
            if self.hang:
                self.release.wait(self.hang)
                return "too late"
            raise ConnectionError("backend down")
        return self.value


def changed(counts: CountsSince) -> dict[str, float]:
    """The counts that moved (COUNTS is process-wide: other tests' backends are listed with 0)."""
    return {k: v for k, v in counts.take().items() if v}


@pytest.fixture
def slept(monkeypatch):
    out: list[float] = []
    monkeypatch.setattr(backends, "sleep", out.append)
    return out


def test_retry_backs_off_exponentially_then_succeeds(slept):
    counts = CountsSince()
    fn = Flaky(fails=2)
    assert Retry("t1", max_retries=3, backoff=0.5)(fn) == "ok"
    # attempts 0, 1, 2: retry r sleeps backoff * 2**(r-1) = 0.5, 1.0
    assert fn.calls == 3 and slept == [0.5, 1.0]
    assert counts.take()["backend/t1/retries"] == 2.0
    assert counts.take()["backend/t1/retries"] == 0.0  # since the last take: nothing


def test_retry_gives_up_with_a_named_failure(slept):
    counts = CountsSince()
    with pytest.raises(BackendFailure, match=r"t2: 3 attempts failed; last: ConnectionError\('backend down'\)"):
        Retry("t2", max_retries=2, backoff=0.25)(Flaky(fails=9))
    assert slept == [0.25, 0.5]
    assert changed(counts) == {"backend/t2/retries": 2.0, "backend/t2/failures": 1.0}
    assert COUNTS["backend/t2/calls"] >= 3


def test_refused_results_are_retried(slept):
    answers = iter(["garbage", "", "5"])
    assert Retry("t3", max_retries=2, backoff=0)(lambda: next(answers), accept=str.isdigit) == "5"


def test_a_call_past_its_timeout_is_abandoned_and_counted(slept):
    counts = CountsSince()
    fn = Flaky(fails=1, hang=5.0)
    assert Retry("t4", max_retries=1, backoff=0, timeout=0.2)(fn) == "ok"  # did not wait 5 s for the hung call
    fn.release.set()
    assert changed(counts) == {"backend/t4/retries": 1.0, "backend/t4/timeouts": 1.0}


@pytest.mark.parametrize("bad", [{"max_retries": -1}, {"backoff": -1.0}, {"timeout": 0}])
def test_retry_settings_are_checked(bad):
    with pytest.raises(ValueError, match=r"fix: max_retries >= 0, backoff >= 0, timeout > 0 or null"):
        Retry("t5", **bad)


class DownEngine(HFEngine):
    """The HF engine, down for its first ``down`` generate calls."""

    def __init__(self, down: int) -> None:
        super().__init__()
        self.down = down

    def generate(self, prompts, sampling, seeds=None):
        if self.down > 0:
            self.down -= 1
            raise TimeoutError("engine unreachable")
        return super().generate(prompts, sampling)


def test_engine_down_for_a_whole_step_scores_failures_and_training_goes_on(make_cfg, slept):
    module, datamodule, trainer = build(make_cfg("trainer.max_steps=2", "validate_first=false",
                                                 "trainer.val_check_interval=null", "callbacks=none", "logger=csv",
                                                 "data.prompts_per_step=4", "data.sampling.n=4"))
    datamodule.experience.engine = DownEngine(down=3)  # step 1: attempt 0 and both retries fail; step 2 works
    seen = []
    draw = datamodule.experience.draw
    datamodule.experience.draw = lambda *a, **k: seen.append(draw(*a, **k)) or seen[-1]
    logged = []
    log_dict = module.log_dict
    module.log_dict = lambda d, **k: logged.append(dict(d)) or log_dict(d, **k)
    trainer.fit(module, datamodule=datamodule)

    assert trainer.global_step == 2
    failed, ok = seen
    assert [m["finish"] for m in failed.metadata] == [["error"]] * 16  # empty replies, finish reason "error"
    assert failed.response_mask.sum() == 0 and failed.scores.sum() == 0  # nothing to learn, zero scores
    assert ok.response_mask.sum() > 0
    assert slept == [1.0, 2.0]  # data.engine_retry: backoff 1.0, retries 1 and 2
    assert (logged[0]["backend/engine/failures"], logged[0]["backend/engine/retries"]) == (1.0, 2.0)
    assert (logged[1]["backend/engine/failures"], logged[1]["backend/engine/retries"]) == (0.0, 0.0)
    assert math.isfinite(logged[0]["loss/total"]) and logged[0]["loss/total"] == 0.0  # no token, no loss


def test_a_raising_reward_or_environment_and_nonfinite_rewards_are_zeroed_and_counted(make_cfg):
    module, datamodule, _ = build(make_cfg("data.prompts_per_step=2", "data.sampling.n=2", "callbacks=none"))
    datamodule.setup()
    experience = datamodule.experience
    experience.bind(module.policy, module.tokenizer)
    rows = [datamodule.train_set[i] for i in range(2)]
    calls = iter([ValueError("bug"), RewardResult(float("nan"), {"correct": 1.0}),
                  RewardResult(1.0, {"correct": math.inf}), RewardResult(0.5, {"correct": 0.0})])

    def reward(row, replies, **kw):
        out = next(calls)
        if isinstance(out, Exception):
            raise out
        return out

    experience.reward = reward
    counts = CountsSince()
    batch = experience.draw(rows)
    # rollout 0: the reward raised -> score 0, part missing -> 0; 1: NaN score -> 0; 2: inf part -> 0
    assert batch.scores.tolist() == [0.0, 0.0, 1.0, 0.5]
    assert batch.reward_parts["correct"].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert changed(counts) == {"backend/reward/errors": 1.0, "backend/reward/nonfinite": 2.0}

    class Broken(type(experience.env)):
        def step(self, row, turn, text):
            raise KeyError("env bug")

    experience.env = Broken()
    experience.reward = lambda row, replies, **kw: RewardResult(1.0)
    batch = experience.draw(rows)
    assert batch.scores.tolist() == [1.0] * 4 and torch.isfinite(batch.behaviour_logprobs).all()
    assert changed(counts) == {"backend/environment/errors": 4.0}


@pytest.mark.parametrize(("overrides", "message"), [
    (["data.sampling.n=1"], "data.sampling.n=1: GRPO normalises within a group of rollouts per prompt, so it needs "
                            "at least 2; fix: set data.sampling.n=2 or more (8 is usual)"),
    (["method.num_minibatches=3", "data.prompts_per_step=4", "data.sampling.n=4"],
     "method.num_minibatches=3: does not split the 16 rollouts of a step (data.prompts_per_step=4 x "
     "data.sampling.n=4) into equal minibatches; fix: use a divisor of 16, e.g. 2"),
    (["method.ppo_epochs=0"], "method.ppo_epochs=0: must be >= 1; fix: set method.ppo_epochs=1"),
    (["data.prompts_per_step=0"], "data.prompts_per_step=0: a step needs at least one prompt"),
    (["data.sampling.temperature=0"], "data.sampling.temperature=0: must be > 0 when sampling; fix: set a positive "
                                      "temperature, or data.sampling.greedy=true"),
    (["data.sampling.top_p=1.5"], "data.sampling.top_p=1.5: must be in (0, 1]"),
    (["data.sampling.max_new_tokens=0"], "data.sampling.max_new_tokens=0: must be >= 1"),
    (["data.max_turns=0"], "data.max_turns=0: must be >= 1 or null"),
    (["rollout=vllm", "rollout.max_model_len=64", "data.sampling.max_new_tokens=32", "data.max_turns=2"],
     "data.sampling.max_new_tokens=32: x 2 turn(s) does not fit the engine's context rollout.max_model_len=64 "
     "(the prompt needs room too); fix: lower data.sampling.max_new_tokens or data.max_turns, or raise "
     "rollout.max_model_len"),
    (["trainer.max_steps=-1"], "trainer.max_steps=-1: lit-credit counts training steps (GRPO family: one per "
                                "rollout batch"),
    (["data.val_prompts=0"], "data.val_prompts=0: validation is on but has no prompts"),
    (["loss.surrogate.clip_low=1.5"], "loss.surrogate.clip_low=1.5: the PPO ratio clip must be in (0, 1); fix: set "
                                      "0.2"),
    (["loss.kl_coef=-0.1"], "loss.kl_coef=-0.1: a KL penalty cannot be negative"),
    (["loss.surrogate.clip_ratio_c=1.0"], "loss.surrogate.clip_ratio_c=1.0: dual-clip bounds a negative-advantage "
     "token's loss at c |A|, which needs c > 1 (verl asserts it); fix: set 3.0 (verl's) or null"),
    (["loss.length_normalize=true"], "loss.length_normalize=True: takes each row's mean over its tokens, which needs "
     "the per-row sums of loss.aggregation=seq-mean-token-sum, not token-mean; fix: set "
     "loss.aggregation=seq-mean-token-sum, or loss.length_normalize=false"),
])
def test_impossible_settings_fail_in_one_line_naming_the_key_and_the_fix(overrides, message, make_cfg):
    with pytest.raises(ConfigError) as err:
        check_config(make_cfg(*overrides))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_shipped_experiments_pass_the_checks(make_cfg):
    for experiment in ["grpo_arith", "slca_toolcall", "tcpo_math", "dpa_form", "dpa_form_e68b47", "slca_tcpo_toolcall",
                       "dapo_form"]:
        check_config(make_cfg(f"experiment={experiment}", fast_model=False, fast_task=False))


@pytest.mark.parametrize(("group", "valid"), [("method", "dpa_grpo"), ("loss", "dr_grpo"), ("credit", "slca_tcpo"),
                                             ("augment", "counterfactual_tool"), ("task", "toolcall"),
                                             ("rollout", "vllm")])
def test_unknown_names_list_the_valid_ones(group, valid, make_cfg):
    from hydra.errors import MissingConfigException

    with pytest.raises(MissingConfigException) as err:
        make_cfg(f"{group}=nope")
    text = str(err.value)
    assert f"Could not find '{group}/nope'" in text and f"Available options in '{group}'" in text and valid in text


def test_unknown_credit_name_in_python_lists_the_registry():
    from lit_credit.credit import get

    with pytest.raises(KeyError, match="slca_tcpo"):
        get("nope")
