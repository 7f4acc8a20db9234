"""SLCA-GRPO segment credit and the ToolPO baseline (docs/methods.md §1)."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lit_credit.credit import (
    SLCACredit,
    ToolPOCredit,
    ToolPOProcessCredit,
    get,
    grpo_advantages,
    segment_masks,
    slca_advantages,
    toolpo_advantages,
    toolpo_process_advantages,
)
from lit_credit.credit.slca import SLCASettings

from .common import (
    DEVICES,
    DTYPES,
    PROPS,
    TOL,
    build_runs,
    ids,
    make_batch,
    ref_group_normalize,
    ref_runs,
    run_layouts,
    t,
)

INV_SQRT2 = 0.2 / (0.08**0.5 + 1e-6)  # Norm([0.8, 0.4]) = +-0.2 / (sqrt(0.08) + 1e-6) = +-0.70710428


def ref_slca(process, summary, mask, gids, score=None, flag=None, w_process=1.0, w_summary=1.0):
    """Loop reference of slca_advantages."""
    b, n_tok = mask.shape
    tool = torch.zeros(b, n_tok, dtype=torch.bool)
    summ = torch.zeros(b, n_tok, dtype=torch.bool)
    s_tool, s_sum = process.tolist(), summary.tolist()
    for i in range(b):
        run, n_runs = ref_runs(mask[i])
        for j in range(n_tok):
            if run[j] >= 0:
                summ[i, j] = run[j] == n_runs - 1
                tool[i, j] = run[j] < n_runs - 1
        if (flag is not None and flag[i]) or (score is not None and score[i] < 0):
            s_tool[i], s_sum[i] = 0.0, float(score[i])
    a_tool = w_process * ref_group_normalize(s_tool, gids, tool.any(1))
    a_sum = w_summary * ref_group_normalize(s_sum, gids, summ.any(1))
    out = torch.zeros(b, n_tok, dtype=torch.float64)
    for i in range(b):
        for j in range(n_tok):
            out[i, j] = a_tool[i] if tool[i, j] else a_sum[i] if summ[i, j] else 0.0
    return out, a_tool, a_sum


# --- hand-computed tables ---------------------------------------------------------------------------


def test_segment_masks_table():
    mask = t(
        [
            [0, 0, 0, 0, 0, 0],  # 0 runs: no segment
            [0, 1, 1, 0, 0, 0],  # 1 run: the summary, no tool segment
            [1, 1, 0, 1, 0, 1],  # 3 runs: {0, 1} and {3} are tool, the last run {5} is the summary
            [0, 1, 0, 0, 1, 1],  # 2 runs: {1} tool, {4, 5} summary
        ],
        torch.float32,
    )
    tool, summ = segment_masks(mask)
    assert tool.dtype == summ.dtype == torch.bool
    assert tool.int().tolist() == [[0] * 6, [0] * 6, [1, 1, 0, 1, 0, 0], [0, 1, 0, 0, 0, 0]]
    assert summ.int().tolist() == [[0] * 6, [0, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 1, 1]]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device", DEVICES)
def test_anchor_example(dtype, device):
    # docs/methods.md anchor: one group of two, both with both segments; process [0.8, 0.4],
    # summary [0.9, 0.5].
    # A_tool = Norm([0.8, 0.4]): mean 0.6, unbiased std sqrt((0.04 + 0.04) / 1) = 0.28284271
    #   -> +-0.2 / (0.28284271 + 1e-6) = +-0.70710428 (1/sqrt(2) up to eps); A_sum: same deviations, same values.
    # tokens: prompt, tool call x2, tool response, summary, pad
    mask = t([[0, 1, 1, 0, 1, 0]] * 2, torch.float32).to(device)
    out = slca_advantages(
        t([0.8, 0.4], dtype).to(device), t([0.9, 0.5], dtype).to(device), mask, ids([0, 0]).to(device)
    )
    a = INV_SQRT2
    assert a == pytest.approx(2**-0.5, abs=5e-6)
    expected = t([[0, a, a, 0, a, 0], [0, -a, -a, 0, -a, 0]], dtype)
    assert out.advantages.dtype == dtype and out.advantages.device.type == device
    torch.testing.assert_close(out.advantages.cpu(), expected, **TOL[dtype])
    torch.testing.assert_close(out.parts["tool"].cpu(), t([a, -a], dtype), **TOL[dtype])
    torch.testing.assert_close(out.parts["summary"].cpu(), t([a, -a], dtype), **TOL[dtype])
    assert out.metrics["credit/tool/adv_mean"] == pytest.approx(0.0, abs=1e-6)
    assert out.metrics["credit/tool_present_frac"] == 1.0


def test_weights_apply_after_normalisation():
    # w_process 2, w_summary 0.5 on the anchor: tool +-2 * 0.70710428, summary +-0.5 * 0.70710428
    # (weights applied before Norm would cancel: Norm(2x) = Norm(x) up to eps)
    mask = t([[1, 0, 1]] * 2, torch.float32)
    out = slca_advantages(t([0.8, 0.4]), t([0.9, 0.5]), mask, ids([0, 0]), SLCASettings(w_process=2.0, w_summary=0.5))
    a = INV_SQRT2
    torch.testing.assert_close(out.advantages, t([[2 * a, 0, 0.5 * a], [-2 * a, 0, -0.5 * a]]))


def test_dr_grpo_variant_only_centres():
    # norm_by_std False on the anchor: tool [0.8, 0.4] - 0.6 = +-0.2, summary [0.9, 0.5] - 0.7 = +-0.2
    out = slca_advantages(t([0.8, 0.4]), t([0.9, 0.5]), t([[1, 0, 1]] * 2), ids([0, 0]), SLCASettings(norm_by_std=False))
    torch.testing.assert_close(out.advantages, t([[0.2, 0, 0.2], [-0.2, 0, -0.2]]))


def test_omission_guard():
    # rollouts 0, 1 call a tool then summarise; rollout 2 should have called but answered directly (one run,
    # read as a summary), score -0.5. s_tool = [0.8, 0.4, 0], s_sum = [0.9, 0.5, -0.5].
    # A_tool over the tool-present {0, 1}: +-0.70710428; rollout 2 has no tool segment -> 0.
    # A_sum over all three: mean 0.3, deviations [0.6, 0.2, -0.8], var (0.36 + 0.04 + 0.64) / 2 = 0.52,
    #   std 0.72111026 -> [0.83204914, 0.27734971, -1.10939885]
    mask = t([[0, 1, 0, 1], [0, 1, 0, 1], [0, 1, 1, 0]], torch.float32)
    process, summary, score = t([0.8, 0.4, 0.9]), t([0.9, 0.5, 0.7]), t([1.7, 0.9, -0.5])
    a = INV_SQRT2
    expected = t([[0, a, 0, 0.83204914], [0, -a, 0, 0.27734971], [0, -1.10939885, -1.10939885, 0]])
    flag = t([0, 0, 1])
    # the guard fires on the flag, and on score < 0 alone
    for kw in (dict(score_total=score, should_call_but_no_call=flag), dict(score_total=score)):
        out = slca_advantages(process, summary, mask, ids([1, 1, 1]), **kw)
        torch.testing.assert_close(out.advantages, expected, rtol=0, atol=1e-7)
        assert out.metrics["credit/omission_frac"] == pytest.approx(1 / 3)
    # the omitted rollout also has a tool-looking segment: s_tool = [0.8, 0.4, 0], mean 0.4, std 0.4
    #   -> [0.4, 0, -0.4] / (0.4 + 1e-6) = [0.9999975, 0, -0.9999975]
    out = slca_advantages(process, summary, t([[0, 1, 0, 1]] * 3), ids([1, 1, 1]), score_total=score)
    b = 0.4 / (0.4 + 1e-6)
    torch.testing.assert_close(out.parts["tool"], t([b, 0, -b]))
    with pytest.raises(ValueError, match="score_total"):
        slca_advantages(process, summary, mask, ids([1, 1, 1]), should_call_but_no_call=flag)


# --- the official CPU test's cases (verl/tests/trainer/ppo/test_slca_grpo_on_cpu.py) ----------------


def test_omission_flag_alone_with_a_positive_total_score():
    # official test_should_no_call_penalty_guard: both rollouts tool + summary ([1, 1, 0, 0, 1, 1, 1, 0, 0, 0]),
    # process [0.9, 0.3], summary [0.8, 0.4], total [0.2, 0.5] (both >= 0), flag [1, 0]: the flag alone fires.
    # s_tool = [0, 0.3]: Norm -> mean 0.15, std sqrt(2 * 0.15**2) = 0.21213203 -> +-0.15 / (0.21213203 + 1e-6)
    # = -+0.70710345; s_sum = [0.2 (the total), 0.4]: mean 0.3, std 0.14142136 -> -+0.1 / (0.14142136 + 1e-6)
    # = -+0.70710178. Rollout 0 (the higher raw process score) gets the negative tool advantage.
    mask = t([[1, 1, 0, 0, 1, 1, 1, 0, 0, 0]] * 2, torch.float32)
    out = slca_advantages(t([0.9, 0.3]), t([0.8, 0.4]), mask, ids([0, 0]), score_total=t([0.2, 0.5]),
                          should_call_but_no_call=t([1, 0]))
    a_tool, a_sum = 0.15 / (0.15 * 2**0.5 + 1e-6), 0.1 / (0.1 * 2**0.5 + 1e-6)
    torch.testing.assert_close(out.parts["tool"], t([-a_tool, a_tool]))
    torch.testing.assert_close(out.parts["summary"], t([-a_sum, a_sum]))
    row0 = [-a_tool, -a_tool, 0, 0, -a_sum, -a_sum, -a_sum, 0, 0, 0]
    torch.testing.assert_close(out.advantages[0], t(row0))
    assert out.metrics["credit/omission_frac"] == 0.5
    # without the flag nothing fires (every total >= 0): Norm([0.9, 0.3]) = +-0.70710560 on the tool tokens
    plain = slca_advantages(t([0.9, 0.3]), t([0.8, 0.4]), mask, ids([0, 0]), score_total=t([0.2, 0.5]))
    torch.testing.assert_close(plain.parts["tool"], t([0.3, -0.3]) / (0.3 * 2**0.5 + 1e-6))


def test_zero_process_weight_silences_the_tool_segment():
    # official test_zero_process_weight_silences_the_process_segment: the two-segment mask, process [0.8, 0.4],
    # summary [0.9, 0.5], w_process 0: A_tool = 0 * (+-0.70710428) = 0 on every tool token; A_sum = +-0.70710428
    mask = t([[0, 1, 1, 0, 0, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0, 1, 1, 1, 0]], torch.float32)
    out = slca_advantages(t([0.8, 0.4]), t([0.9, 0.5]), mask, ids([0, 0]), SLCASettings(w_process=0.0))
    a = INV_SQRT2
    assert out.parts["tool"].tolist() == [0.0, 0.0]
    expected = t([[0, 0, 0, 0, 0, a, a, a, 0, 0], [0, 0, 0, 0, 0, 0, -a, -a, -a, 0]])
    torch.testing.assert_close(out.advantages, expected)


def test_all_ones_response_mask_is_one_summary_run():
    # official test_all_ones (one run spanning the row): no tool segment, every token is summary.
    # A_tool: nothing present -> 0; A_sum = Norm([0.9, 0.5]) = +-0.70710428 on all 4 tokens
    mask = t([[1, 1, 1, 1]] * 2, torch.float32)
    tool, summ = segment_masks(mask)
    assert not tool.any() and summ.all()
    out = slca_advantages(t([0.8, 0.4]), t([0.9, 0.5]), mask, ids([0, 0]))
    a = INV_SQRT2
    torch.testing.assert_close(out.advantages, t([[a] * 4, [-a] * 4]))
    assert out.parts["tool"].tolist() == [0.0, 0.0] and out.metrics["credit/tool_present_frac"] == 0.0


def test_none_present_gives_zero_for_that_segment():
    # official test_nothing_present / test_summary_only: every rollout is one run, so no tool segment is
    # present anywhere: A_tool = 0 though the process scores differ (1.0 vs 0.5); the summaries normalise
    # (Norm([0.8, 0.6]) = +-0.1 / (0.14142136 + 1e-6) = +-0.70710178)
    mask = t([[0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1]], torch.float32)
    out = slca_advantages(t([1.0, 0.5]), t([0.8, 0.6]), mask, ids([0, 0]))
    a = 0.1 / (0.1 * 2**0.5 + 1e-6)
    assert out.parts["tool"].tolist() == [0.0, 0.0]
    torch.testing.assert_close(out.advantages, t([[0, 0, a, a, a, 0], [0, 0, 0, -a, -a, -a]]))


def test_all_zero_response_mask_gives_zero_everywhere():
    # official test_no_learnable_tokens: no run anywhere -> neither segment is present in any rollout, so both
    # advantages are 0 (no fallback to raw scores), the token advantages too, and the guard still applies
    mask = torch.zeros(2, 10)
    out = slca_advantages(t([0.5, 0.9]), t([0.5, 0.1]), mask, ids([0, 0]), score_total=t([-0.5, 1.0]))
    assert out.advantages.abs().sum().item() == 0.0 and out.advantages.shape == (2, 10)
    assert out.parts["tool"].tolist() == [0.0, 0.0] and out.parts["summary"].tolist() == [0.0, 0.0]
    assert out.metrics["credit/tool_present_frac"] == 0.0


def test_presence_guard_single_tool_segment():
    # only rollout 0 has a tool segment -> A_tool = 0 for the whole group; summaries still normalised:
    # Norm([0.9, 0.5]) = +-0.70710428
    mask = t([[1, 0, 1], [0, 0, 1]], torch.float32)
    out = slca_advantages(t([0.8, 0.4]), t([0.9, 0.5]), mask, ids([0, 0]))
    a = INV_SQRT2
    torch.testing.assert_close(out.advantages, t([[0, 0, a], [0, 0, -a]]))
    assert out.parts["tool"].tolist() == [0, 0]


def test_summary_change_moves_grpo_tool_credit_but_not_slca():
    # 3 rollouts, tool call then summary. GRPO on the total score (process + summary) moves tool-token credit
    # when only a summary score changes; SLCA does not.
    mask = t([[1, 0, 1]] * 3, torch.float32)
    process, gids = t([0.8, 0.4, 0.6]), ids([0, 0, 0])
    before, after = t([0.9, 0.5, 0.2]), t([0.9, 0.5, 0.9])
    slca = [slca_advantages(process, s, mask, gids).advantages[:, 0] for s in (before, after)]
    grpo = [grpo_advantages(process + s, mask, gids).advantages[:, 0] for s in (before, after)]
    torch.testing.assert_close(slca[0], slca[1], rtol=0, atol=0)
    assert (grpo[0] - grpo[1]).abs().max() > 0.1


def test_toolpo_as_the_official_code_computes_it():
    # compute_toolpo_grpo_advantage: A_global = Norm(solved) over the whole group, A_tool = Norm of the strict
    # correct-call ratio over the rollouts with a tool segment, tool tokens A_global + lam * A_tool.
    # One group of three: r0 and r1 call a tool then summarise (tool [1], summary [3]); r2 answers directly
    # (one run: summary only, no tool segment).
    #   solved [1, 0, 0]: mean 1/3, deviations [2/3, -1/3, -1/3], unbiased var (4 + 1 + 1) / 9 / 2 = 1/3
    #     -> A_global = [2/3, -1/3, -1/3] / (sqrt(1/3) + eps) = [1.1547, -0.5774, -0.5774];
    #   correct ratio [1, 0.5, 0] over r0, r1 only (r2 absent): mean 0.75, std sqrt(2 * 0.0625) = 0.35355
    #     -> A_tool = [+0.25, -0.25, 0] / (0.35355 + eps) = [0.7071, -0.7071, 0].
    mask = t([[0, 1, 0, 1], [0, 1, 0, 1], [0, 1, 1, 0]], torch.float32)
    sd, sa = math.sqrt(1 / 3) + 1e-6, math.sqrt(0.125) + 1e-6
    g0, g1, a = (2 / 3) / sd, (1 / 3) / sd, 0.25 / sa
    for lam in (1.0, 0.5):
        out = toolpo_advantages(t([1.0, 0.5, 0.0]), t([1.0, 0.0, 0.0]), mask, ids([3, 3, 3]), lam=lam)
        torch.testing.assert_close(out.advantages, t([[0, g0 + lam * a, 0, g0], [0, -g1 - lam * a, 0, -g1],
                                                      [0, -g1, -g1, 0]]))
        torch.testing.assert_close(out.parts["rollout"], t([g0, -g1, -g1]))
        torch.testing.assert_close(out.parts["tool"], t([a, -a, 0.0]))
    # the registered estimator reads reward_parts solved / toolpo_correct_ratio, and nothing else: no omission
    # guard (r1 flagged, and a HierR score that says otherwise, change nothing)
    parts = {"solved": t([1.0, 0.0, 0.0]), "toolpo_correct_ratio": t([1.0, 0.5, 0.0])}
    batch = make_batch(mask, ids([3, 3, 3]), t([0.2, 1.9, -0.5]), reward_parts={
        **parts, "process": t([0.1, 0.9, 0.0]), "score": t([0.2, -0.5, 1.0]),
        "should_call_but_no_call": t([0.0, 1.0, 0.0])})
    torch.testing.assert_close(get("toolpo")()(batch).advantages,
                               toolpo_advantages(parts["toolpo_correct_ratio"], parts["solved"], mask,
                                                 ids([3, 3, 3])).advantages)
    assert isinstance(get("toolpo")(), ToolPOCredit)
    with pytest.raises(ValueError, match=r"credit=toolpo needs batch\.reward_parts\['solved'\], "
                                         r"batch\.reward_parts\['toolpo_correct_ratio'\].*credit=toolpo_process"):
        ToolPOCredit()(make_batch(mask, ids([3, 3, 3]), t([1.0, 0.0, 0.0]), reward_parts={"process": t([1.0] * 3)}))


def test_toolpo_process():
    # HierR's form of ToolPO (credit=toolpo_process, not the official computation):
    # process [0.8, 0.4] -> A_tool +-0.70710428; total [1.7, 0.9]: mean 1.3, std sqrt(0.32) = 0.56568542
    #   -> A_global = +-0.4 / (0.56568542 + 1e-6) = +-0.70710553.
    # tool tokens A_global + lam * A_tool, summary tokens A_global.
    mask = t([[0, 1, 0, 1]] * 2, torch.float32)
    g, a = 0.4 / (0.32**0.5 + 1e-6), INV_SQRT2
    for lam in (1.0, 0.5):
        out = toolpo_process_advantages(t([0.8, 0.4]), t([1.7, 0.9]), mask, ids([2, 2]), lam=lam)
        torch.testing.assert_close(out.advantages, t([[0, g + lam * a, 0, g], [0, -g - lam * a, 0, -g]]))
        torch.testing.assert_close(out.parts["rollout"], t([g, -g]))
    # omission: rollout 1 flagged -> s_tool = 0: still +-Norm([0.8, 0]) = +-0.4 / (0.56568542 + 1e-6)
    out = toolpo_process_advantages(
        t([0.8, 0.4]), t([1.7, -0.5]), mask, ids([2, 2]), should_call_but_no_call=t([0, 1])
    )
    torch.testing.assert_close(out.parts["tool"], t([g, -g]))
    assert out.metrics["credit/omission_frac"] == 0.5


def _batch(process, summary, mask, gids, **parts):
    return make_batch(
        mask, gids, process + summary, reward_parts={"process": process, "summary": summary, **parts}
    )


def test_registered_classes_read_reward_parts():
    mask = t([[0, 1, 0, 1], [0, 1, 0, 1], [0, 1, 1, 0]], torch.float32)
    process, summary = t([0.8, 0.4, 0.9]), t([0.9, 0.5, 0.7])
    batch = _batch(process, summary, mask, ids([1, 1, 1]), score=t([1.7, 0.9, -0.5]))
    want = slca_advantages(
        process, summary, mask, ids([1, 1, 1]), SLCASettings(w_summary=2.0), score_total=t([1.7, 0.9, -0.5])
    )
    torch.testing.assert_close(SLCACredit(w_summary=2.0)(batch).advantages, want.advantages)
    # without reward_parts["score"] the omission guard reads batch.scores (here process + summary, all >= 0)
    del batch.reward_parts["score"]
    torch.testing.assert_close(
        SLCACredit()(batch).advantages, slca_advantages(process, summary, mask, ids([1] * 3)).advantages
    )
    want = toolpo_process_advantages(process, process + summary, mask, ids([1, 1, 1]), lam=0.3)
    torch.testing.assert_close(ToolPOProcessCredit(lam=0.3)(batch).advantages, want.advantages)


def test_segment_weights_none_follow_the_reward_weights():
    # The anchor (tool [0.8, 0.4], summary [0.9, 0.5], one group): Norm = +-0.2 / (std + eps), std =
    # sqrt(0.08) (unbiased, two rollouts) -> a = 0.2 / (0.28284271 + 1e-6) = 0.70710428. The reward weighs
    # process 2 and summary 0.5 (batch.reward_weights, HierR's part_weights); w_process = w_summary = None
    # reads them: tool +-2a, summary +-0.5a. A set weight wins: w_summary = 3 -> summary +-3a, tool still +-2a.
    mask = t([[1, 0, 1]] * 2, torch.float32)
    batch = _batch(t([0.8, 0.4]), t([0.9, 0.5]), mask, ids([0, 0]))
    a = 0.2 / (math.sqrt(0.08) + 1e-6)
    assert SLCACredit().w_process is None and SLCACredit().w_summary is None
    # a reward without part weights: 1 and 1
    torch.testing.assert_close(SLCACredit()(batch).advantages, t([[a, 0, a], [-a, 0, -a]]), rtol=0, atol=1e-6)
    batch.reward_weights = {"process": 2.0, "summary": 0.5}
    torch.testing.assert_close(SLCACredit()(batch).advantages,
                               t([[2 * a, 0, 0.5 * a], [-2 * a, 0, -0.5 * a]]), rtol=0, atol=1e-6)
    torch.testing.assert_close(SLCACredit(w_summary=3.0)(batch).advantages,
                               t([[2 * a, 0, 3 * a], [-2 * a, 0, -3 * a]]), rtol=0, atol=1e-6)
    # the function resolves them the same way from the reward's weights it is given
    direct = slca_advantages(t([0.8, 0.4]), t([0.9, 0.5]), mask, ids([0, 0]), SLCASettings(w_summary=3.0),
                             score_total=batch.scores, reward_weights=batch.reward_weights)
    torch.testing.assert_close(direct.advantages, SLCACredit(w_summary=3.0)(batch).advantages, rtol=0, atol=0)


# --- loop reference vs vectorised ---------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_matches_loop_reference(seed):
    g = torch.Generator().manual_seed(seed)
    b, n_tok = 24, 12
    mask = (torch.rand(b, n_tok, generator=g) < 0.6).float()
    process, summary = (
        torch.rand(b, generator=g, dtype=torch.float64),
        torch.rand(b, generator=g, dtype=torch.float64),
    )
    gids = torch.randint(0, 6, (b,), generator=g) * 5
    flag = torch.rand(b, generator=g) < 0.2
    score = torch.where(flag, -0.5, process + summary)
    out = slca_advantages(
        process, summary, mask, gids, SLCASettings(w_process=0.7), score_total=score, should_call_but_no_call=flag
    )
    adv, a_tool, a_sum = ref_slca(process, summary, mask, gids, score, flag, w_process=0.7)
    torch.testing.assert_close(out.advantages, adv)
    torch.testing.assert_close(out.parts["tool"], a_tool)
    torch.testing.assert_close(out.parts["summary"], a_sum)


# --- properties ------------------------------------------------------------------------------------------


@st.composite
def slca_inputs(draw):
    gids, rows = draw(run_layouts())
    b = len(rows)
    grid = st.lists(st.integers(0, 4), min_size=b, max_size=b)
    return gids, rows, [p / 4 for p in draw(grid)], [s / 4 for s in draw(grid)]


@pytest.mark.parametrize("dtype", DTYPES)
@PROPS
@given(data=slca_inputs(), new_summary=st.lists(st.integers(0, 4), min_size=8, max_size=8))
def test_property_segments_and_summary_independence(dtype, data, new_summary):
    gids, rows, process, summary = data
    mask, _ = build_runs(rows)
    out = slca_advantages(t(process, dtype), t(summary, dtype), mask, ids(gids))
    tool, summ = segment_masks(mask)
    assert not (tool & summ).any() and torch.equal(tool | summ, mask.bool())
    assert (out.advantages[mask == 0] == 0).all()
    changed = slca_advantages(t(process, dtype), t(new_summary[: len(rows)], dtype) / 4, mask, ids(gids))
    assert torch.equal(changed.advantages[tool], out.advantages[tool])


@pytest.mark.parametrize("dtype", DTYPES)
@PROPS
@given(data=slca_inputs(), seed=st.integers(0, 2**16), labels=st.permutations([11, -4, 2**35]))
def test_property_permutation_and_relabelling(dtype, data, seed, labels):
    gids, rows, process, summary = data
    mask, _ = build_runs(rows)
    p, s, g = t(process, dtype), t(summary, dtype), ids(gids)
    out = slca_advantages(p, s, mask, g).advantages
    perm = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(slca_advantages(p[perm], s[perm], mask[perm], g[perm]).advantages, out[perm])
    torch.testing.assert_close(slca_advantages(p, s, mask, ids(labels)[g]).advantages, out)


@pytest.mark.parametrize("dtype", DTYPES)
@PROPS
@given(data=slca_inputs(), shift=st.lists(st.floats(-5, 5), min_size=6, max_size=6))
def test_property_group_constant_shift(dtype, data, shift):
    gids, rows, process, summary = data
    mask, _ = build_runs(rows)
    g, c = ids(gids), t(shift, dtype)
    out = slca_advantages(t(process, dtype), t(summary, dtype), mask, g).advantages
    moved = slca_advantages(t(process, dtype) + c[:3][g], t(summary, dtype) + c[3:][g], mask, g).advantages
    torch.testing.assert_close(moved, out, rtol=1e-4, atol=1e-4)


@PROPS
@given(
    data=slca_inputs(),
    extra=st.lists(st.lists(st.integers(0, 3), min_size=3, max_size=3), min_size=8, max_size=8),
)
def test_property_longer_observations_change_nothing(data, extra):
    # more environment-injected (mask 0) tokens before any run: the learnable tokens keep their advantages
    gids, rows, process, summary = data
    (mask, _), (wider, _) = build_runs(rows), build_runs(rows, extra)
    out = slca_advantages(t(process), t(summary), mask, ids(gids)).advantages
    more = slca_advantages(t(process), t(summary), wider, ids(gids)).advantages
    assert torch.equal(more[wider.bool()], out[mask.bool()]) and (more[wider == 0] == 0).all()
