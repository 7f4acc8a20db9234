"""Data parallelism through the door users use: `lit-credit ... trainer=ddp_cpu` (Lightning's subprocess
launcher re-runs the command for rank 1), its run directory claimed once, each rank sampling its own prompt
groups, resume=auto, a Hydra sweep of 2-process runs, and the claim protocol of torchrun / SLURM ranks."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from lit_credit.analysis.compare import run_scalars
from lit_credit.distributed import CLAIM, RUN_ID, claim_run_dir, launch_rank, share
from tests.conftest import FAST_MODEL, FAST_TASK

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["experiment=grpo_arith", *FAST_TASK, *FAST_MODEL, "trainer=ddp_cpu", "data.prompts_per_step=4",
        "data.sampling.n=2", "data.val_prompts=4", "data.sampling.max_new_tokens=8", "trainer.val_check_interval=2",
        "callbacks.credit_records.every_n_steps=1", "callbacks.hf_export=null", "+trainer.enable_progress_bar=false"]


def lit_credit(cache_dir: Path, *extra: str, multirun: bool = False, args: list[str] = ARGS
               ) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name("lit-credit")
    cmd = [str(script), *(["-m"] if multirun else []), *args, f"paths.cache_dir={cache_dir}", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for key in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", RUN_ID):
        env.pop(key, None)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)


def records(run: Path) -> pd.DataFrame:
    return pd.concat([pd.read_parquet(p) for p in sorted((run / "records").glob("*.parquet"))], ignore_index=True)


@pytest.mark.slow
def test_ddp_cpu_through_lit_credit_shards_prompts_claims_once_and_resumes(tmp_path, cache_dir):
    run = tmp_path / "run"
    done = lit_credit(cache_dir, "trainer.max_steps=2", f"hydra.run.dir={run}")
    assert done.returncode == 0, done.stderr[-4000:]
    assert json.loads((run / CLAIM).read_text())["run_id"]  # one claim, rank 0's
    assert sorted(p.name for p in (run / ".hydra").iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    assert "trainer=ddp_cpu" in (run / ".hydra" / "overrides.yaml").read_text()
    frame = records(run)
    assert set(frame["step"]) == {1, 2}
    for _, step in frame.groupby("step"):
        # 4 prompt groups a step over 2 ranks: ranks 0 and 1 each sampled 2 whole groups (2 rollouts each), disjoint
        by_rank = {r: set(g["group"]) for r, g in step.groupby("rank")}
        assert set(by_rank) == {0, 1} and all(len(g) == 2 for g in by_rank.values())
        assert not by_rank[0] & by_rank[1]
        assert step.groupby("group")["rollout"].nunique().eq(2).all()
    state = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert state["global_step"] == 2 and len(state["rng_states_by_rank"]) == 2
    # the estimator's metrics are the whole step's: credit/adv_abs_max of step k (logged at index k - 1) is
    # the largest |advantage| of a learnable token in both ranks' records (rank 0 alone would hold it by chance)
    logged = run_scalars(run)["credit/adv_abs_max"]
    for step, rows in frame.groupby("step"):
        assert logged[step - 1] == pytest.approx(rows[["advantage_min", "advantage_max"]].abs().to_numpy().max(), rel=1e-5)

    unrelated = lit_credit(cache_dir, "trainer.max_steps=2", f"hydra.run.dir={run}")
    assert unrelated.returncode != 0 and "already holds a run" in unrelated.stderr

    resumed = lit_credit(cache_dir, "trainer.max_steps=3", f"hydra.run.dir={run}", "resume=auto")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    state = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert state["global_step"] == 3
    assert set(records(run)["step"]) == {1, 2, 3}
    # bitwise the uninterrupted 2-process run: the same weights, optimiser moments and records of step 3
    straight = tmp_path / "straight"
    done = lit_credit(cache_dir, "trainer.max_steps=3", f"hydra.run.dir={straight}")
    assert done.returncode == 0, done.stderr[-4000:]
    whole = torch.load(straight / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert state["state_dict"].keys() == whole["state_dict"].keys()
    assert all(torch.equal(v, whole["state_dict"][k]) for k, v in state["state_dict"].items())
    moments = [(a["exp_avg"], b["exp_avg"]) for a, b in zip(state["optimizer_states"][0]["state"].values(),
                                                           whole["optimizer_states"][0]["state"].values())]
    assert moments and all(torch.equal(a, b) for a, b in moments)
    last = [records(r).query("step == 3").sort_values(["group", "rollout", "turn"]).reset_index(drop=True)
            for r in (run, straight)]
    pd.testing.assert_frame_equal(last[0], last[1])


EQUIVALENCE = ["experiment=grpo_arith", *FAST_TASK, *FAST_MODEL, "trainer.max_steps=3", "data.val_prompts=8",
               "trainer.val_check_interval=3", "callbacks.credit_records.every_n_steps=1", "callbacks.hf_export=null",
               "+trainer.enable_progress_bar=false"]


DYNAMIC_SAMPLING = ["loss=dapo", "method.dynamic_sampling=true", "method.max_sampling_draws=3"]
# 2 groups a step, no refill: a step that keeps 1 group leaves rank 1 of 2 without one (weight-0 passes)
FEWER_GROUPS_THAN_RANKS = [*DYNAMIC_SAMPLING[:2], "method.max_sampling_draws=1", "data.prompts_per_step=2"]


@pytest.mark.slow
@pytest.mark.parametrize("method", [[], DYNAMIC_SAMPLING, FEWER_GROUPS_THAN_RANKS],
                         ids=["grpo", "dapo_dynamic_sampling", "dapo_fewer_groups_than_ranks"])
def test_one_process_and_two_processes_are_the_same_run(tmp_path, cache_dir, method):
    """The default job (experiment=grpo_arith: 16 prompt groups of 8 rollouts a step, 4 minibatch updates, AdamW;
    the fast warm start of the tests) for 3 steps on 1 process, on 2 DDP processes and on 2 FSDP2 processes:
    every rollout (its text, token count, score and advantage) and the final weights are the same. Why it can
    hold: a group's rollouts are seeded from (seed, group id) alone, the minibatch split is drawn over the whole
    step's rollouts, and the loss normalisers are the whole minibatch's, so the ranks' averaged gradient is the
    one-process gradient of the same rollouts. What differs is float rounding (other batch shapes in the
    forwards, a gradient summed in two halves), so weights are compared to 1e-5 and advantages to 1e-5; a token
    flipped by rounding would fail the text comparison.

    With DAPO's dynamic sampling (up to 3 draws a step) the records hold the kept groups only, and those too are
    the same: the ranks refill as often (the informative groups counted over both) and keep the one-process
    groups (chosen from both ranks' draws). The run must refill at least once, or this would test nothing. With
    2 groups a step and no refill, a step that keeps 1 group gives rank 1 none; it runs weight-0 passes, and
    the weights must still be the one-process run's (the run must have such a step)."""
    runs = {}
    for trainer in ("cpu", "ddp_cpu", "fsdp2_cpu"):
        runs[trainer] = tmp_path / trainer
        done = lit_credit(cache_dir, f"trainer={trainer}", f"hydra.run.dir={runs[trainer]}",
                          args=[*EQUIVALENCE, *method])
        assert done.returncode == 0, f"trainer={trainer}: " + done.stderr[-4000:]
    frames = {t: records(r).sort_values(["step", "group", "rollout", "turn"]).reset_index(drop=True)
              for t, r in runs.items()}
    weights = {t: {k: v for k, v in torch.load(r / "checkpoints" / "last.ckpt", map_location="cpu",
                                                 weights_only=False)["state_dict"].items() if k.startswith("policy.")}
               for t, r in runs.items()}
    one = frames["cpu"]
    assert set(one["step"]) == {1, 2, 3} and set(one["rank"]) == {0}
    if method:
        scalars = {t: run_scalars(r) for t, r in runs.items()}
        draws, kept = scalars["cpu"]["train/sampling_draws"], scalars["cpu"]["train/informative_groups"]
        if method is DYNAMIC_SAMPLING:
            assert max(draws.values()) > 1, draws  # a refill happened
        else:
            assert 1 in kept.values(), kept  # a step with fewer kept groups than ranks
        prompts = 2 if method is FEWER_GROUPS_THAN_RANKS else 16
        # 8 rollouts of each kept group, no other row (a step with none trains on its first draw, weights still)
        assert len(one) == 8 * sum(k or prompts for k in kept.values())
        for trainer in ("ddp_cpu", "fsdp2_cpu"):
            for tag in ("train/sampling_draws", "train/informative_groups", "train/kept_frac"):
                assert scalars[trainer][tag] == scalars["cpu"][tag], (trainer, tag)
    else:
        assert len(one) == 3 * 16 * 8
    for trainer in ("ddp_cpu", "fsdp2_cpu"):
        many = frames[trainer]
        assert set(many["rank"]) == {0, 1}
        for column in ("step", "group", "rollout", "turn", "excerpt", "tokens"):
            assert many[column].tolist() == one[column].tolist(), (trainer, column)
        for column in ("score", "advantage"):
            torch.testing.assert_close(torch.tensor(many[column].values), torch.tensor(one[column].values),
                                       rtol=0, atol=1e-5, msg=f"{trainer} {column}")
        assert weights[trainer].keys() == weights["cpu"].keys()
        for name, value in weights["cpu"].items():
            torch.testing.assert_close(weights[trainer][name], value, rtol=0, atol=1e-5, msg=f"{trainer} {name}")


TCPO_COUNTERFACTUAL = ["experiment=tcpo_math", "task.max_operand=4", "task.num_test=20", *FAST_MODEL,
                       "trainer.max_steps=2", "data.prompts_per_step=4", "data.sampling.n=4", "data.val_prompts=4",
                       "data.val_samples=0", "trainer.val_check_interval=2", "augment.top_l=2", "augment.samples=2",
                       "callbacks.credit_records.every_n_steps=1", "callbacks.hf_export=null",
                       "+trainer.enable_progress_bar=false"]


@pytest.mark.slow
def test_tcpo_counterfactual_alternatives_are_the_same_on_one_and_two_processes(tmp_path, cache_dir):
    """Full TCPO (credit=tcpo, preset tcpo: the fixed-history counterfactual term, augment=counterfactual) on
    multi-turn math, 2 steps on 1 process and on 2 DDP processes: every rollout and its advantage (which the
    alternatives' verifier scores enter) and the final weights are the same. The alternatives of turn k of
    rollout j of group g are seeded from (seed, g, j, k), not from each rank's generator; the run must sample
    some (tcpo/cf_turns > 0), or this would test nothing."""
    runs = {t: tmp_path / t for t in ("cpu", "ddp_cpu")}
    for trainer, run in runs.items():
        done = lit_credit(cache_dir, f"trainer={trainer}", f"hydra.run.dir={run}", args=TCPO_COUNTERFACTUAL)
        assert done.returncode == 0, f"trainer={trainer}: " + done.stderr[-4000:]
    scalars = {t: run_scalars(r) for t, r in runs.items()}
    assert min(scalars["cpu"]["tcpo/cf_turns"].values()) > 0
    assert scalars["ddp_cpu"]["tcpo/cf_turns"] == scalars["cpu"]["tcpo/cf_turns"]  # summed over the ranks
    frames = {t: records(r).sort_values(["step", "group", "rollout", "turn"]).reset_index(drop=True)
              for t, r in runs.items()}
    one, many = frames["cpu"], frames["ddp_cpu"]
    assert set(many["rank"]) == {0, 1}
    for column in ("step", "group", "rollout", "turn", "excerpt", "tokens"):
        assert many[column].tolist() == one[column].tolist(), column
    for column in ("score", "advantage"):
        torch.testing.assert_close(torch.tensor(many[column].values), torch.tensor(one[column].values),
                                   rtol=0, atol=1e-5, msg=column)
    weights = {t: {k: v for k, v in torch.load(r / "checkpoints" / "last.ckpt", map_location="cpu",
                                                 weights_only=False)["state_dict"].items() if k.startswith("policy.")}
               for t, r in runs.items()}
    for name, value in weights["cpu"].items():
        torch.testing.assert_close(weights["ddp_cpu"][name], value, rtol=0, atol=1e-5, msg=name)


@pytest.mark.slow
def test_a_hydra_sweep_of_two_process_runs(tmp_path, cache_dir):
    """`-m` with trainer=ddp_cpu: each job starts its own rank 1 (a single run of that job's overrides, in the
    job's directory), and the next job starts with the launch variables of the last one removed."""
    sweep = tmp_path / "sweep"
    done = lit_credit(cache_dir, "trainer.max_steps=1", "validate_first=false", "seed=0,1",
                      f"hydra.sweep.dir={sweep}", multirun=True)
    assert done.returncode == 0, done.stderr[-4000:]
    for job, seed in (("0", "seed=0"), ("1", "seed=1")):
        assert seed in (sweep / job / ".hydra" / "overrides.yaml").read_text()
        assert set(records(sweep / job)["rank"]) == {0, 1}
    assert not (sweep / "2").exists()  # rank 1 re-ran one job, not the sweep


@pytest.mark.slow
def test_torchrun_starts_a_two_process_run_through_lit_credit(tmp_path, cache_dir):
    """`torchrun --nproc_per_node=2 lit-credit ... trainer=ddp_cpu`: torchrun starts both ranks (Lightning sees
    TorchElastic and launches nothing), rank 0 claims the directory under the rendezvous id, and each rank samples
    its own prompt groups."""
    run = tmp_path / "run"
    script = Path(sys.executable).with_name("lit-credit")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for key in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", RUN_ID, "TORCHELASTIC_RUN_ID"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--no-python",
           str(script), *ARGS, f"paths.cache_dir={cache_dir}", "trainer.max_steps=2", f"hydra.run.dir={run}"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    assert json.loads((run / CLAIM).read_text())["run_id"].startswith("torchrun-")
    frame = records(run)
    assert set(frame["step"]) == {1, 2}
    for _, step in frame.groupby("step"):
        by_rank = {r: set(g["group"]) for r, g in step.groupby("rank")}
        assert set(by_rank) == {0, 1} and not by_rank[0] & by_rank[1]
    state = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert state["global_step"] == 2 and len(state["rng_states_by_rank"]) == 2


@pytest.mark.slow
def test_lit_credit_cli_starts_a_two_process_run(tmp_path, cache_dir):
    """`lit-credit-cli fit --config conf/cli/grpo_arith.yaml --trainer.devices=2 --trainer.strategy=ddp`: Lightning
    re-runs the CLI command for rank 1, which joins rank 0's directory; both ranks' groups reach the records."""
    script = Path(sys.executable).with_name("lit-credit-cli")
    embedded = "--model.init_args.policy.init_args.embedded.init_args."
    cmd = [str(script), "fit", "--config", str(ROOT / "conf" / "cli" / "grpo_arith.yaml"),
           f"{embedded}cache_dir={cache_dir}", *[f"{embedded}{o.removeprefix('model.embedded.')}" for o in FAST_MODEL],
           "--data.prompts_per_step=4", "--data.sampling.init_args.n=2", "--data.sampling.init_args.max_new_tokens=8",
           "--data.task.init_args.max_operand=9", f"{embedded}task.init_args.max_operand=9", "--trainer.max_steps=2",
           "--trainer.devices=2", "--trainer.strategy=ddp", "--trainer.enable_progress_bar=false",
           "--trainer.callbacks+=callbacks.CreditRecords", "--trainer.callbacks.dirpath=outputs/cli/grpo_arith/records",
           "--trainer.callbacks.every_n_steps=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for key in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", RUN_ID, "TORCHELASTIC_RUN_ID"):
        env.pop(key, None)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    run = tmp_path / "outputs" / "cli" / "grpo_arith"
    assert json.loads((run / CLAIM).read_text())["run_id"]
    frame = records(run)
    for _, step in frame.groupby("step"):
        by_rank = {r: set(g["group"]) for r, g in step.groupby("rank")}
        assert set(by_rank) == {0, 1} and not by_rank[0] & by_rank[1]
    assert torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["global_step"] == 2


def test_the_leader_claims_and_followers_join_only_their_own_launch(tmp_path, monkeypatch):
    for key in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID", RUN_ID,
                "TORCHELASTIC_RUN_ID", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_JOB_ID"):
        monkeypatch.delenv(key, raising=False)
    run = tmp_path / "run"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")  # torchrun: every rank has it
    assert launch_rank() == 0 and claim_run_dir(run, resuming=False) is True
    assert json.loads((run / CLAIM).read_text())["run_id"] == "torchrun-abc"
    with pytest.raises(FileExistsError, match="already holds a run"):  # a second run's leader
        claim_run_dir(run, resuming=False)
    monkeypatch.delenv(RUN_ID)  # as a torchrun rank 1 sees it: only the rendezvous id
    monkeypatch.setenv("RANK", "1")
    assert launch_rank() == 1 and claim_run_dir(run, resuming=False) is False
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "other")  # another launch's rank 1: refused, naming both
    with pytest.raises(FileExistsError, match="launch torchrun-other found the claim of launch torchrun-abc"):
        claim_run_dir(run, resuming=False, timeout_s=0.3)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_PROCID", "2")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    assert launch_rank() == 2
    with pytest.raises(FileExistsError, match="slurm-77"):
        claim_run_dir(run, resuming=False, timeout_s=0.3)
    monkeypatch.setenv("SLURM_PROCID", "0")  # the requeued job's task 0 resumes and re-claims with its job id
    assert claim_run_dir(run, resuming=True) is True
    monkeypatch.delenv(RUN_ID)
    monkeypatch.setenv("SLURM_PROCID", "2")
    assert claim_run_dir(run, resuming=True) is False


def test_shares_are_contiguous_even_and_in_rank_order():
    # 10 items over 4 ranks: 10 = 4 * 2 + 2, so ranks 0 and 1 get 3, ranks 2 and 3 get 2.
    shares = [list(range(10))[share(10, r, 4)] for r in range(4)]
    assert shares == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert [x for s in shares for x in s] == list(range(10))


def test_the_slurm_launcher_follows_the_trainers_devices_and_nodes():
    """One SLURM task per device (Lightning's SLURM check: --ntasks-per-node = trainer.devices), and FSDP2's
    data-parallel size is devices x nodes, without setting either by hand."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from lit_credit.train import CONF_DIR, fill_data_parallel_size

    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        cfg = compose("train", overrides=["hydra/launcher=slurm", "trainer=fsdp", "trainer.devices=4",
                                          "trainer.num_nodes=2"], return_hydra_config=True)
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert (launcher["tasks_per_node"], launcher["gpus_per_node"], launcher["nodes"]) == (4, 4, 2)
    assert launcher["_target_"].endswith("SlurmLauncher")
    fill_data_parallel_size(cfg)
    assert cfg.trainer.strategy.data_parallel_size == 8 and cfg.trainer.strategy.tensor_parallel_size == 1


def test_prompts_that_do_not_divide_over_the_processes_are_refused_by_name(make_cfg):
    from lit_credit.config import ConfigError, check_config

    with pytest.raises(ConfigError, match=r"data.prompts_per_step=3: does not divide over the 2 processes.*"
                                          r"data.prompts_per_step=2"):
        check_config(make_cfg("trainer=ddp_cpu", "data.prompts_per_step=3"))
    check_config(make_cfg("trainer=ddp_cpu", "data.prompts_per_step=4"))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                  "seq-mean-token-sum-norm"])
def test_two_ranks_with_the_whole_minibatchs_normaliser_average_to_the_one_process_loss(mode):
    """Rank 0 holds rows 0-1 (3 and 1 tokens), rank 1 row 2 (2 tokens) and an empty row 3. token-mean: the
    whole minibatch divides by 3 + 1 + 2 = 6 tokens; each rank passes 6 / 2 = 3, so (S_0 / 3 + S_1 / 3) / 2 =
    (S_0 + S_1) / 6, the one-process loss. A rank's own normaliser (4 and 2 tokens) would give
    (S_0 / 4 + S_1 / 2) / 2 instead, which differs."""
    from lit_credit.losses import aggregate, aggregation_denominator

    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [5.0, 6.0, 0.0], [7.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]])
    whole = aggregate(loss, mask, mode)
    shared = (aggregation_denominator(mask[:2], mode) + aggregation_denominator(mask[2:], mode)) / 2
    ranks = [aggregate(loss[:2], mask[:2], mode, denominator=shared),
             aggregate(loss[2:], mask[2:], mode, denominator=shared)]
    assert torch.allclose((ranks[0] + ranks[1]) / 2, whole)
    expected = {"token-mean": 21 / 6, "seq-mean-token-sum": 21 / 4, "seq-mean-token-mean": (2 + 4 + 5.5) / 3,
                "seq-mean-token-sum-norm": 21 / (4 * 3)}[mode]
    assert whole.item() == pytest.approx(expected)
    if mode == "token-mean":
        own = (aggregate(loss[:2], mask[:2], mode) + aggregate(loss[2:], mask[2:], mode)) / 2
        assert own.item() == pytest.approx((10 / 4 + 11 / 2) / 2) and own.item() != pytest.approx(expected)
