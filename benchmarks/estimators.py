"""Wall time of every registered credit estimator vs. a Python-loop reference and the memory-bound floor.

    .venv/bin/python -m benchmarks.estimators [--sizes 256x512,4096x4096] [--repeats 5] [--threads 2]
        [--loop-rows 1024 | --skip-slow-loop] [--estimators grpo,tcpo+cf] [--out benchmarks/results/estimators.json]

For each estimator case and size (B rollouts x T tokens) it reports the median wall time of one call
(after a warm-up call; over ``--repeats`` calls, or at least 3 where those would take over 10 s) against

1. the per-rollout Python-loop reference of ``benchmarks.loop_reference`` (the same formulas read from
   docs/methods.md, a ``for i in range(B)`` loop with per-row tensor ops). Where ``B > --loop-rows`` the
   loop runs on the first ``--loop-rows`` rows (whole groups) and its time is scaled by ``B / rows``
   (marked ``~`` in the table); the loop is linear in B. ``--skip-slow-loop`` skips it there instead.
2. the memory-bound floor: one ``torch.where(batch.response_mask.bool(), x, 0)`` pass over the same
   [B, T] tensors (x a [B, T] float tensor), the cheapest pass that reads and writes a [B, T] float tensor.
   The floor is timed call by call just before each estimator call and the ratio is that of the two
   medians, so both see the same machine load.

Targets: loop / estimator >= 20x at B = 4096, estimator / floor <= 3x. The batches are synthetic
(:func:`synthetic_batch`): groups of 8 (DPA: pairs), K = 4 assistant turns separated by observation
tokens, random prompt and response lengths with right padding, finite random scores. ``input_ids`` and
``attention_mask`` are zero-stride views (no estimator reads them). Output: a markdown table on stdout and
a JSON file with the machine (CPU model, cores, torch version, threads) and every timing.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from benchmarks import loop_reference as loop
from benchmarks.machine import machine, write_results
from lit_credit import credit
from lit_credit.types import RolloutBatch

SIZES = [(256, 512), (256, 4096), (4096, 512), (4096, 4096), (16384, 512), (16384, 4096)]
GROUP_SIZE, TURNS, ALTERNATIVES, TOP_L = 8, 4, 4, 5
LOOP_TARGET, FLOOR_TARGET, TARGET_B = 20.0, 3.0, 4096
LEVELS = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0])  # verifier scores (fraction of tests passed)
APPROVER = torch.tensor([1.0, 1.5, 0.5, 0.0, -0.2, -0.25, -0.3])  # DPA role rewards (docs/methods.md §3)
CHUNK_ROWS = 2048
BUDGET_S = 10.0  # timed seconds per (estimator, size) before the repeats drop (to at least 3)


# --- synthetic batches ------------------------------------------------------------------------------------


def synthetic_batch(
    rollouts: int, tokens: int, *, group_size: int = GROUP_SIZE, turns: int = TURNS, seed: int = 0
) -> RolloutBatch:
    """A right-padded multi-turn batch with every field the estimators read.

    Row i: a prompt of 1..T/8 tokens, then ``n_i`` (1..K) assistant turns separated by ``n_i - 1``
    observation blocks (mask 0), total length uniform in ``[prompt + 2K, T]``, then padding. Block sizes are
    random (at least 1 token). ``turn_ids`` = the turn index on policy tokens, -1 elsewhere. Scores:
    ``turn_scores`` on levels {0, .25, .5, .75, 1} over the reached turns (``turn_mask``); HierR parts
    ``process`` ~ U(0, 1), ``summary`` on the levels, 5% omissions (``should_call_but_no_call = 1``,
    ``score = -0.5``), else ``score = process + summary`` (also ``batch.scores``); the tool turns of
    SLCA x TCPO are every turn but the last (``tool_scores``, ``tool_turn_mask``). Groups: ``group_size``
    consecutive rows share an id.

    Shape:
        every [B, T] field, [B] scores and group ids, [B, K] turn scores / masks.
    """
    b, n_tok, k = rollouts, tokens, turns
    if n_tok < max(2, n_tok // 8) + 2 * k:
        raise ValueError(f"T={n_tok} is too short for {k} turns")
    g = torch.Generator().manual_seed(seed)
    n_turns = torch.randint(1, k + 1, (b,), generator=g)
    prompt = torch.randint(1, max(2, n_tok // 8) + 1, (b,), generator=g)
    low = prompt + 2 * k
    length = low + (torch.rand(b, generator=g) * (n_tok - low + 1)).long().clamp_max(n_tok - low)
    n_blocks = 2 * n_turns - 1  # turns and the observations between them
    used = torch.arange(2 * k - 1) < n_blocks[:, None]
    weight = (0.5 + torch.rand(b, 2 * k - 1, generator=g)) * used
    free = (length - prompt - n_blocks).to(weight.dtype)
    sizes = used.long() + (weight / weight.sum(1, keepdim=True) * free[:, None]).floor().long()
    sizes[torch.arange(b), n_blocks - 1] += length - prompt - sizes.sum(1)
    ends = prompt[:, None] + sizes.cumsum(1)  # [B, 2K - 1], non-decreasing
    response_mask = torch.empty(b, n_tok)
    turn_ids = torch.empty(b, n_tok, dtype=torch.long)
    logprobs = torch.empty(b, n_tok)
    for start in range(0, b, CHUNK_ROWS):  # bounded temporaries at B = 16384
        rows = slice(start, start + CHUNK_ROWS)
        pos = torch.arange(n_tok).expand(len(ends[rows]), n_tok).contiguous()
        block = torch.searchsorted(ends[rows], pos, right=True)
        policy = (pos >= prompt[rows, None]) & (pos < length[rows, None]) & (block % 2 == 0)
        response_mask[rows] = policy
        turn_ids[rows] = torch.where(policy, block // 2, -1)
        logprobs[rows] = torch.where(policy, -3 * torch.rand(pos.shape, generator=g), 0)
    turn_mask = torch.arange(k) < n_turns[:, None]
    turn_scores = torch.where(turn_mask, LEVELS[torch.randint(len(LEVELS), (b, k), generator=g)], 0)
    tool_turn_mask = torch.arange(k) < n_turns[:, None] - 1
    tool_scores = torch.where(tool_turn_mask, torch.rand(b, k, generator=g), 0)
    process = torch.rand(b, generator=g)
    summary = LEVELS[torch.randint(len(LEVELS), (b,), generator=g)]
    omitted = torch.rand(b, generator=g) < 0.05
    score = torch.where(omitted, -0.5, process + summary)
    zeros = torch.zeros((), dtype=torch.long).expand(b, n_tok)
    return RolloutBatch(
        input_ids=zeros,
        attention_mask=zeros,
        response_mask=response_mask,
        turn_ids=turn_ids,
        group_ids=1000 + torch.arange(b) // group_size,
        behaviour_logprobs=logprobs,
        scores=score,
        reward_parts={
            "score": score,
            "process": process,
            "summary": summary,
            "should_call_but_no_call": omitted.float(),
        },
        turn_parts={"tool_scores": tool_scores, "tool_turn_mask": tool_turn_mask.float()},
        turn_scores=turn_scores,
        turn_mask=turn_mask,
    )


def with_counterfactual(batch: RolloutBatch, turn_mask_key: str | None = None, *, seed: int = 1) -> RolloutBatch:
    """Add TCPO's counterfactual inputs: ``cf_mask`` = the top-L (L = 5) turns per group by surprisal
    among the reached turns (``batch.turn_mask``, or ``turn_parts[turn_mask_key]``), ``alt_scores``
    [B, K, M = 4] verifier scores of the alternatives there, NaN elsewhere (both in ``batch.extras``)."""
    g = torch.Generator().manual_seed(seed)
    mask = (batch.turn_parts[turn_mask_key] if turn_mask_key else batch.turn_mask).bool()
    surprisal = torch.rand(mask.shape, generator=g)
    cf_mask = credit.select_counterfactual_turns(surprisal, mask, batch.group_ids, top_l=TOP_L)
    alt = LEVELS[torch.randint(len(LEVELS), (*mask.shape, ALTERNATIVES), generator=g)]
    alt = torch.where(cf_mask[..., None], alt, float("nan"))
    return replace(batch, extras={**batch.extras, "alt_scores": alt, "cf_mask": cf_mask})


def dpa_pairs(batch: RolloutBatch, *, seed: int = 2) -> RolloutBatch:
    """DPA's paired groups: rows 2n, 2n + 1 are the two canonical actions of decision n, with role rewards."""
    g = torch.Generator().manual_seed(seed)
    scores = APPROVER[torch.randint(len(APPROVER), (len(batch),), generator=g)]
    return replace(batch, group_ids=torch.arange(len(batch)) // 2, scores=scores)


@dataclass(frozen=True)
class Case:
    """One timed configuration: registered ``estimator`` name, its constructor kwargs, the batch it runs on
    (``prepare`` of the base batch) and the loop reference with the same settings."""

    name: str
    estimator: str
    kwargs: dict
    prepare: Callable[[RolloutBatch], RolloutBatch] = lambda batch: batch

    def make(self) -> credit.CreditEstimator:
        return credit.get(self.estimator)(**self.kwargs)

    def reference(self, batch: RolloutBatch) -> torch.Tensor | None:
        """The loop reference's advantages on ``batch``; None for an estimator registered without one."""
        fn = loop.reference_of(self.estimator)
        return None if fn is None else fn(batch, **self.kwargs)


def _tool_cf(batch: RolloutBatch) -> RolloutBatch:
    return with_counterfactual(batch, "tool_turn_mask")


def toolpo_parts(batch: RolloutBatch, *, seed: int = 3) -> RolloutBatch:
    """ToolPO's reward parts: the binary outcome ``solved`` (0 on omissions) and the strict correct-call ratio
    ``toolpo_correct_ratio`` on the levels {0, .25, .5, .75, 1}."""
    g = torch.Generator().manual_seed(seed)
    kept = 1 - batch.reward_parts["should_call_but_no_call"]
    solved = (torch.rand(len(batch), generator=g) < 0.5).float() * kept
    ratio = LEVELS[torch.randint(len(LEVELS), (len(batch),), generator=g)] * kept
    return replace(batch, reward_parts={**batch.reward_parts, "solved": solved, "toolpo_correct_ratio": ratio})


SHIPPED_CASES = [
    Case("dpa", "dpa", {}, dpa_pairs),
    Case("toolpo", "toolpo", {}, toolpo_parts),
    Case("tcpo", "tcpo", {"preset": "retro_hindsight"}),  # = preset tcpo without counterfactuals (cf = 0)
    Case("tcpo+cf", "tcpo", {"preset": "tcpo"}, with_counterfactual),
    Case("slca_tcpo", "slca_tcpo", {}),  # default preset retro_hindsight
    Case("slca_tcpo+cf", "slca_tcpo", {"preset": "tcpo"}, _tool_cf),
]


def cases() -> list[Case]:
    """Every registered estimator's benchmark cases: those of :data:`SHIPPED_CASES` (estimators that need other
    inputs than :func:`synthetic_batch`, or more than their defaults), and one case with its defaults on the
    synthetic batch for each other registered estimator, a new one included, in registry order."""
    listed = {case.estimator for case in SHIPPED_CASES}
    defaults = [Case(name, name, {}) for name in credit.available() if name not in listed]
    return sorted(defaults + SHIPPED_CASES, key=lambda case: (case.estimator, case.name))


# --- timing -------------------------------------------------------------------------------------------


def median_time(
    fn: Callable[[], object], repeats: int, warmup: int = 1, budget_s: float | None = None
) -> tuple[float, float, int]:
    """(median, min, calls): wall seconds of ``fn()`` over ``repeats`` calls after ``warmup`` calls; with
    ``budget_s``, fewer calls (at least 3) where ``repeats`` times the warm-up call would exceed it."""
    times = paired_times(fn, None, repeats, warmup, budget_s)[0]
    return statistics.median(times), min(times), len(times)


def paired_times(
    fn: Callable[[], object],
    floor: Callable[[], object] | None,
    repeats: int,
    warmup: int = 1,
    budget_s: float | None = None,
) -> tuple[list[float], list[float]]:
    """Wall seconds of ``fn()`` and, call by call just before it, of ``floor()`` (none when None): a ratio
    of the two lists' medians compares the pair under the same machine load, which on a shared machine
    drifts by tens of percent between minutes. Repeats as in :func:`median_time`."""
    for _ in range(warmup):
        start = time.perf_counter()
        fn()
        if budget_s is not None:
            repeats = max(min(repeats, 3), min(repeats, int(budget_s / (time.perf_counter() - start))))
    times, floors = [], []
    for _ in range(repeats):
        if floor is not None:
            start = time.perf_counter()
            floor()
            floors.append(time.perf_counter() - start)
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times, floors


def loop_rows_for(rollouts: int, limit: int, group_size: int) -> int:
    """Rows the loop reference runs on: all, or the first ``limit`` rounded down to whole groups."""
    if limit <= 0 or rollouts <= limit:
        return rollouts
    return max(group_size, limit // group_size * group_size)


def run(
    sizes: list[tuple[int, int]],
    cases: list[Case],
    *,
    repeats: int,
    loop_rows: int,
    skip_slow_loop: bool,
    log: Callable[[str], None],
) -> list[dict]:
    results = []
    for b, n_tok in sizes:
        base = synthetic_batch(b, n_tok)
        x = base.behaviour_logprobs

        def floor(base: RolloutBatch = base, x: torch.Tensor = x) -> torch.Tensor:
            return torch.where(base.response_mask.bool(), x, 0)

        floor()
        rows = loop_rows_for(b, loop_rows, GROUP_SIZE)
        for case in cases:
            batch, estimator = case.prepare(base), case.make()
            times, floors = paired_times(lambda batch=batch, estimator=estimator: estimator(batch), floor,
                                         repeats, budget_s=BUDGET_S)
            est, fl = statistics.median(times), statistics.median(floors)
            row = {"estimator": case.name, "registered": case.estimator, "kwargs": case.kwargs, "B": b,
                   "T": n_tok, "estimator_s": est, "estimator_min_s": min(times), "calls": len(times),
                   "floor_s": fl, "floor_min_s": min(floors), "floor_ratio": est / fl,
                   "floor_ratio_of_mins": min(times) / min(floors), "loop_s": None, "loop_rows": None,
                   "loop_scaled": False, "loop_ratio": None, "loop_floor_ratio": None, "loop_max_abs_diff": None}
            if not (skip_slow_loop and rows < b) and loop.reference_of(case.estimator) is not None:
                sub = batch if rows == b else batch.select(torch.arange(rows))
                ref = case.reference(sub)
                row["loop_max_abs_diff"] = (ref - estimator(sub).advantages).abs().max().item()
                loop_s, _, _ = median_time(lambda sub=sub, case=case: case.reference(sub), min(repeats, 3),
                                           warmup=0)
                loop_s *= b / rows
                row.update(loop_s=loop_s, loop_rows=rows, loop_scaled=rows < b, loop_ratio=loop_s / est,
                           loop_floor_ratio=loop_s / fl)
            results.append(row)
            log(f"  {case.name:<13} {est * 1e3:9.2f} ms  floor {fl * 1e3:8.2f} ms" + (
                f"  loop {row['loop_s'] * 1e3:10.1f} ms" if row["loop_s"] is not None else ""))
            del batch
        del base, x
        gc.collect()
    return results


# --- report -------------------------------------------------------------------------------------------


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1e3
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def _ratio(value: float | None, ok: bool | None = None) -> str:
    if value is None:
        return "-"
    text = f"{value:.1f}x" if value < 100 else f"{value:.0f}x"
    return text + ("" if ok is None else (" ok" if ok else " MISS"))


def markdown(results: list[dict]) -> str:
    lines = [
        "| estimator | B | T | estimator ms | loop ms | floor ms | loop / est | est / floor | loop / floor |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        loop_ms = _ms(r["loop_s"])
        if r["loop_scaled"]:
            loop_ms = f"~{loop_ms} ({r['loop_rows']} rows)"
        loop_ok = r["loop_ratio"] >= LOOP_TARGET if r["B"] == TARGET_B and r["loop_ratio"] is not None else None
        lines.append(
            f"| {r['estimator']} | {r['B']} | {r['T']} | {_ms(r['estimator_s'])} | {loop_ms} | {_ms(r['floor_s'])} "
            f"| {_ratio(r['loop_ratio'], loop_ok)} | {_ratio(r['floor_ratio'], r['floor_ratio'] <= FLOOR_TARGET)} "
            f"| {_ratio(r.get('loop_floor_ratio'))} |"
        )
    return "\n".join(lines)


def parse_sizes(text: str) -> list[tuple[int, int]]:
    sizes = []
    for item in text.split(","):
        b, _, n_tok = item.strip().lower().partition("x")
        sizes.append((int(b), int(n_tok)))
    return sizes


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.estimators", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=parse_sizes, default=SIZES,
                        help="comma-separated BxT, e.g. 256x512,4096x4096 (default: B in 256, 4096, 16384 x "
                             "T in 512, 4096)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per estimator (median reported)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch.set_num_threads (default: $OMP_NUM_THREADS, else torch's default)")
    parser.add_argument("--estimators", default=None,
                        help=f"comma-separated subset of: {', '.join(c.name for c in cases())}")
    parser.add_argument("--loop-rows", type=int, default=1024,
                        help="time the loop reference on at most this many rows and scale linearly to B "
                             "(0: always the full batch)")
    parser.add_argument("--skip-slow-loop", action="store_true",
                        help="skip the loop reference where B > --loop-rows instead of scaling")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/estimators.json"))
    args = parser.parse_args(argv)

    threads = args.threads or int(os.environ.get("OMP_NUM_THREADS", 0)) or torch.get_num_threads()
    torch.set_num_threads(threads)
    chosen = cases()
    if args.estimators:
        wanted = args.estimators.split(",")
        unknown = sorted(set(wanted) - {c.name for c in chosen})
        if unknown:
            parser.error(f"unknown estimators {unknown}; valid: {', '.join(c.name for c in chosen)}")
        chosen = [c for c in chosen if c.name in wanted]

    info = machine()
    print(f"# credit estimators: {info['cpu_model']}, {info['cores']} cores, torch {info['torch']}, "
          f"torch.set_num_threads({info['torch_threads']})")
    print(f"median of {args.repeats} calls after 1 warm-up (at least 3 where {args.repeats} would take over "
          f"{BUDGET_S:.0f} s), each after one floor call (est / floor = ratio of the medians); loop reference: median of {min(args.repeats, 3)} "
          + (f"calls on at most {args.loop_rows} rows (whole groups), '~' = scaled linearly to B"
             if args.loop_rows > 0 else "calls on all rows")
          + ("; skipped where that would be needed" if args.skip_slow_loop else ""))
    start = time.perf_counter()
    results = run(args.sizes, chosen, repeats=args.repeats, loop_rows=args.loop_rows,
                  skip_slow_loop=args.skip_slow_loop, log=lambda s: print(s, file=sys.stderr, flush=True))
    elapsed = time.perf_counter() - start
    print()
    print(markdown(results))
    print()
    print(f"targets: loop / estimator >= {LOOP_TARGET:.0f}x at B = {TARGET_B}; estimator / floor <= "
          f"{FLOOR_TARGET:.0f}x (floor = one torch.where(response_mask.bool(), x, 0) pass over [B, T]). "
          f"Total {elapsed:.0f} s.")
    report = {
        "settings": {"repeats": args.repeats, "warmup": 1, "loop_repeats": min(args.repeats, 3),
                     "budget_s": BUDGET_S, "loop_rows": args.loop_rows, "skip_slow_loop": args.skip_slow_loop,
                     "group_size": GROUP_SIZE, "turns": TURNS, "alternatives": ALTERNATIVES, "top_l": TOP_L,
                     "dtype": "float32", "sizes": args.sizes, "targets": {"loop_ratio_min": LOOP_TARGET,
                     "loop_ratio_at_B": TARGET_B, "floor_ratio_max": FLOOR_TARGET}},
        "elapsed_s": elapsed,
        "results": results,
    }
    write_results(args.out, report)
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
