"""Held-out rows whose content key is also a training row's, per experiment, as validation reads them.

    python scripts/heldout_overlap.py                   # this checkout's splits
    python scripts/heldout_overlap.py --root /tmp/old   # another checkout's splits (e.g. a worktree at an
                                                        # older commit), keyed by this checkout's content keys

Each case is composed through Hydra from ``<root>/conf`` and its task built by ``<root>``'s code (in a
subprocess with ``PYTHONPATH=<root>``); the rows are then keyed with this checkout's ``content_key`` of the
task's module, and the first ``data.val_prompts`` test rows (what ``val/*`` reads) are counted.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

CASES = {  # name: (overrides, the module whose content_key keys it)
    "grpo_arith": (["experiment=grpo_arith"], "arith"),
    "tcpo_math": (["experiment=tcpo_math"], "math_revise"),
    "slca_toolcall": (["experiment=slca_toolcall"], "toolcall"),
    "slca_tcpo_toolcall": (["experiment=slca_tcpo_toolcall"], "toolcall"),
    "task=code_revise": (["task=code_revise"], "code_revise"),
    "dpa_form": (["experiment=dpa_form"], "form"),
}

DUMP = """
import json, sys
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
cases, out = json.loads(sys.argv[1]), {}
with initialize_config_dir(sys.argv[2], version_base=None):
    for name, overrides in cases.items():
        cfg = compose("train", overrides=overrides)
        task = instantiate(cfg.task)
        out[name] = {"val_prompts": cfg.data.val_prompts,
                     **{s: [dict(r) for r in task.dataset(s)] for s in ("train", "test")}}
print(json.dumps(out, default=str))
"""


def splits(root: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root)}
    cases = json.dumps({name: ov for name, (ov, _) in CASES.items()})
    done = subprocess.run([sys.executable, "-c", DUMP, cases, str(root / "conf")], cwd=root, env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the checkout whose configs and split code build the rows (default: this one)")
    root = parser.parse_args().root.resolve()
    import importlib

    print("| experiment | train rows | held-out rows read | of them, a training row's content |")
    print("|---|---:|---:|---:|")
    for name, rows in splits(root).items():
        key = importlib.import_module(f"lit_credit.tasks.{CASES[name][1]}").content_key
        train = {key(r) for r in rows["train"]}
        val = rows["test"][: rows["val_prompts"]]
        print(f"| {name} | {len(rows['train'])} | {len(val)} | {sum(key(r) in train for r in val)} |")


if __name__ == "__main__":
    main()
