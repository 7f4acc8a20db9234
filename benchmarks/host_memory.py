"""Peak host memory (RSS) per rank of a 2-rank ``trainer=fsdp2_cpu`` run on a ~0.5 B-parameter policy.

The policy is a randomly initialised Qwen2ForCausalLM of Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads,
2 KV heads, intermediate 4864, vocabulary 151 936, tied embeddings; 494 M parameters), saved in bf16 with the
embedded arithmetic tokenizer (its 512 ids fit the vocabulary) under the cache, once. One training step through
the ``lit-credit`` command (2 prompts x 2 samples a rank, 4 new tokens), a checkpoint at that step and the HF
export at the end, so the load, the sharding, the update, the checkpoint and the export are all in the peak.
A callback (:class:`PeakRSS`) records each rank's ``VmHWM`` (peak RSS) and ``VmRSS`` at each phase; the
run's logged metrics and a hash of the exported weights show whether two code trees trained alike.

    .venv/bin/python -m benchmarks.host_memory [--label after] [--tree DIR] [--checkpoint full|distributed]

``--tree DIR`` runs another checkout's code (``PYTHONPATH=DIR``; this file must be in ``DIR/benchmarks/``): the
``before`` figures were measured so, on the commit before the change. Each label's result is merged into
``benchmarks/results/host_memory.json``. ``before-24l`` did not finish on the 24 GiB machine (the OOM killer took
rank 0 in the checkpoint's gather): its entry holds the kernel's figures at the kill, written by hand.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import lightning as L

ROOT = Path(__file__).resolve().parents[1]
QWEN2_05B = {"vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
             "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 32768,
             "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True}
PHASES = ("setup", "fit_start", "train_batch_end", "save_checkpoint", "train_end", "teardown")


def _status() -> dict[str, float]:
    """This process's ``VmHWM`` (peak resident set) and ``VmRSS`` in MiB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return {key: int(fields[key].split()[0]) / 1024 for key in ("VmHWM", "VmRSS")}


class PeakRSS(L.Callback):
    """Each rank's ``VmHWM`` / ``VmRSS`` at each phase of the fit, written to ``<out>/rank<r>.json`` at teardown.
    ``setup`` comes after the module was built (every rank's load), ``fit_start`` after sharding and the
    optimiser, ``save_checkpoint`` while a checkpoint is being assembled, ``train_end`` after the checkpoint
    and the HF export (callbacks before this one in the list)."""

    def __init__(self, out: str) -> None:
        self.out, self.phases = Path(out), {}

    def _mark(self, phase: str) -> None:
        self.phases.setdefault(phase, _status())

    def setup(self, trainer, pl_module, stage) -> None:
        self._mark("setup")

    def on_fit_start(self, trainer, pl_module) -> None:
        self._mark("fit_start")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._mark("train_batch_end")

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self._mark("save_checkpoint")

    def on_train_end(self, trainer, pl_module) -> None:
        self._mark("train_end")

    def teardown(self, trainer, pl_module, stage) -> None:
        self._mark("teardown")
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(self.phases))


def _oom_first() -> None:
    """Make this process (and the ranks it starts) the OOM killer's first choice."""
    Path("/proc/self/oom_score_adj").write_text("1000")


def prepare_model(cache_dir: Path, layers: int = 24) -> tuple[Path, int]:
    """The random Qwen2.5-0.5B-shaped model directory with ``layers`` decoder layers (built once) and its
    parameter count."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from lit_credit.models.tokenizer import build_tokenizer
    from lit_credit.tasks import ArithTask

    target = cache_dir / "host_memory" / f"qwen2-0.5b-random-{layers}l"
    if not (target / "config.json").exists():
        task = ArithTask(max_operand=9, num_test=20, seed=0)
        tokenizer = build_tokenizer(task.corpus(), tool_prompt=task.tool_prompt)
        config = Qwen2Config(**{**QWEN2_05B, "num_hidden_layers": layers}, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                             bos_token_id=None)
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
        tmp = target.with_name(f".{target.name}.tmp")
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.rename(target)
    config = json.loads((target / "config.json").read_text())
    h, n, i, v = config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"], config["vocab_size"]
    kv = h // config["num_attention_heads"] * config["num_key_value_heads"]
    params = v * h + n * (h * h + 2 * h * kv + h + 2 * kv + h * h + 3 * h * i + 2 * h) + h
    return target, params


def weights_digest(hf_dir: Path) -> str:
    """sha256 over the exported tensors (sorted by name; bytes only), so two runs compare without the files."""
    from safetensors import safe_open

    digest = hashlib.sha256()
    tensors = {}
    for shard in sorted(hf_dir.glob("*.safetensors")):
        with safe_open(shard, "pt") as f:
            names = f.keys()
            tensors.update({k: f.get_tensor(k) for k in names})
    for key in sorted(tensors):
        digest.update(key.encode())
        digest.update(tensors[key].contiguous().view(-1).view(dtype=__import__("torch").uint8).numpy().tobytes())
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.host_memory", description=__doc__.split("\n")[0])
    parser.add_argument("--label", default="after", help="the name of this measurement in the results")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose code runs (PYTHONPATH)")
    parser.add_argument("--checkpoint", choices=["full", "distributed"], default="full",
                        help="trainer.strategy.save_distributed_checkpoint false (one file) or true (shards)")
    parser.add_argument("--layers", type=int, default=24,
                        help="decoder layers (24: Qwen2.5-0.5B; fewer where the before code does not fit the host)")
    parser.add_argument("--cache-dir", type=Path, default=ROOT / ".cache" / "lit-credit")
    parser.add_argument("--work", type=Path, default=Path("/tmp/lit-credit-host-memory"))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "host_memory.json")
    args = parser.parse_args(argv)
    from benchmarks.machine import machine, write_results

    tree = args.tree.resolve()
    if not (tree / "benchmarks" / "host_memory.py").exists():
        sys.exit(f"{tree}/benchmarks/host_memory.py is missing: copy this file there first")
    model_dir, params = prepare_model(args.cache_dir, args.layers)
    run_dir = args.work / f"{args.label}-{int(time.time())}"
    overrides = ["model=hf", f"model.path={model_dir}", "task.max_operand=9", "task.num_test=20",
                 "trainer=fsdp2_cpu", "trainer.max_steps=1", "+trainer.enable_progress_bar=false",
                 f"trainer.strategy.save_distributed_checkpoint={args.checkpoint == 'distributed'}",
                 "validate_first=false", "data.prompts_per_step=4", "data.sampling.n=2",
                 "data.sampling.max_new_tokens=4", "data.val_prompts=2", "data.val_samples=0",
                 "callbacks.checkpoint.every_n_train_steps=1", "callbacks.hf_export.every_n_steps=0",
                 "callbacks.credit_records=null", "+callbacks.host_memory._target_=benchmarks.host_memory.PeakRSS",
                 f"+callbacks.host_memory.out={run_dir / 'rss'}", "logger=csv",
                 f"paths.cache_dir={args.cache_dir}", f"hydra.run.dir={run_dir}"]
    command = [str(Path(sys.executable).with_name("lit-credit")), *overrides]
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    # On a shared machine the run, not a neighbour, is what the kernel's OOM killer takes first.
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, preexec_fn=_oom_first)
    seconds = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"the run failed ({done.returncode}):\n{done.stderr[-6000:]}")
    ranks = [json.loads((run_dir / "rss" / f"rank{r}.json").read_text()) for r in range(2)]
    metrics = sorted((run_dir / "csv").rglob("metrics.csv"))
    logged = {}
    if metrics:
        import csv

        for row in csv.DictReader(metrics[-1].open()):
            logged.update({k: float(v) for k, v in row.items() if v and k.startswith(("loss/", "train/reward"))})
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    result = {
        "tree": str(tree), "seconds": round(seconds, 1), "checkpoint": args.checkpoint,
        "checkpoint_is_dir": checkpoint.is_dir(),
        "peak_rss_mib": [round(r["teardown"]["VmHWM"]) for r in ranks],
        "phases_mib": [{p: {k: round(v) for k, v in r[p].items()} for p in PHASES if p in r} for r in ranks],
        "logged_step1": logged, "exported_weights_sha256": weights_digest(run_dir / "checkpoints" / "hf" / "last"),
    }
    report = json.loads(args.out.read_text()) if args.out.exists() else {}
    report.pop("machine", None)
    report.setdefault("runs", {})[args.label] = {
        **result, "layers": args.layers, "params": params, "model_dir": str(model_dir),
        "command": " ".join(["lit-credit", *overrides]), "git_commit": machine()["git_commit"]}
    report["model_config"] = QWEN2_05B
    write_results(args.out, report)
    print(json.dumps({args.label: result}, indent=1))


if __name__ == "__main__":
    main()
