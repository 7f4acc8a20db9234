"""The credit-quality benchmark (issue 20 item 2): its scores by hand, its construction pinned on hand-built
batches (the causal tool family's latent truth and its noisy process measurement; in the mechanism check
GRPO's judge-noise leakage at its analytic value, SLCA's at 0; SLCA ranks a gold tool turn above a
name-corrupted and a malformed one where GRPO does not; the revision process's exact effects; the DPA truth),
and the command on its smallest setting."""
from __future__ import annotations

import json
import math

import pytest
import torch

from benchmarks import credit_quality as cq
from lit_credit import credit
from lit_credit.rewards import SummaryJudge
from lit_credit.tasks.tool_catalog import SCHEMAS
from lit_credit.tasks.toolcall import make_row

# A real single-step row of the tool task's format: gold find_restaurant(city, cuisine), one distractor.
GOLD = [[{"name": "find_restaurant", "arguments": {"city": "Paris", "cuisine": "pizza"}}]]
ROW = make_row("Find a pizza restaurant in Paris.", [SCHEMAS["find_restaurant"], SCHEMAS["get_exchange_rate"]],
               GOLD, "single", "hand")
# HierR's process score (0.10 format + 0.25 name + 0.15 key + 0.20 value + 0.30 parallel) of each kind here:
# gold 1.0; value (city wrong: value 1/2) 1 - 0.2 * 0.5 = 0.9; name (a valid call of the distractor
# get_exchange_rate: format 1, name F1 0, no same-name call so key = value = 0, parallel 1 = 1) 0.1 + 0.3 = 0.4;
# malformed (no valid block: format 0 / 1 tag, no call: name 0, key 0, value 0, parallel 0 != 1) 0.
PROCESS = {"gold": 1.0, "value": 0.9, "name": 0.4, "malformed": 0.0}


class ScriptedJudge(SummaryJudge):
    """Rates the i-th summary it is asked about ``ratings[i]`` (a judge whose noise the test chooses)."""

    def __init__(self, ratings: list[int]) -> None:
        super().__init__()
        self.ratings = iter(ratings)

    def rate(self, question, tool_responses, reply):
        return next(self.ratings)


def credits(probe: cq.Probe, estimator: str, unit: str) -> tuple[torch.Tensor, cq.Units]:
    units = next(u for u in probe.units if u.name == unit)
    return cq.unit_credit(credit.get(estimator)()(probe.batch).advantages, units.of_token, len(units.truth)), units


def test_scores_by_hand():
    # Spearman, per group: g0 credit [.1, .3, .2] vs truth [1, 3, 2]: same order, 1. g1 truth constant: skipped.
    # g2 credit constant [0, 0], truth [0, 1]: 0. g3 credit [1, 1, 2] (ranks 1.5, 1.5, 3) vs truth [1, 2, 3]:
    # centred ranks [-.5, -.5, 1] and [-1, 0, 1], r = 1.5 / sqrt(1.5 * 2) = sqrt(3) / 2. Mean over 3 groups.
    c = torch.tensor([.1, .3, .2, 4., -4., 0., 0., 1., 1., 2.], dtype=torch.float64)
    q = torch.tensor([1., 3., 2., 5., 5., 0., 1., 1., 2., 3.], dtype=torch.float64)
    g = torch.tensor([7, 7, 7, 3, 3, 9, 9, 1, 1, 1])
    rho, groups = cq.within_group_spearman(c, q, g)
    assert groups == 3 and rho == pytest.approx((1 + 0 + math.sqrt(3) / 2) / 3)
    # Sign against the group mean truth: g0 mean 2 -> [-, +, tie]: credit [+, +] agrees once; g1 ties only;
    # g2 mean .5 -> [-, +], zero credit never agrees; g3 mean 2 -> [-, tie, +]: credit [+, +] agrees once.
    kind = torch.tensor([0, 1, 0, 0, 0, 1, 1, 0, 1, 1])
    share, n, per_kind = cq.sign_agreement(c, q, g, kind, 2)
    assert (share, n) == (pytest.approx(2 / 6), 6)
    assert per_kind == [0.0, 0.5]  # kind 0 counted: units 0, 7 (neither agrees); kind 1: 1, 5, 6, 9 (1 and 9)
    # Leakage: one group, e = [1, -1, 0], c = [2, 0, 1] (centred [1, -1, 0]): r = 2 / sqrt(2 * 2) = 1; se 1/sqrt(2).
    leak, se = cq.leakage(torch.tensor([1., -1., 0.]), torch.tensor([2., 0., 1.]), torch.tensor([0, 0, 0]))
    assert leak == pytest.approx(1.0) and se == pytest.approx(1 / math.sqrt(2))
    assert cq.leakage(torch.zeros(3), torch.tensor([2., 0., 1.]), torch.zeros(3, dtype=torch.long))[0] is None


def test_grpo_leaks_the_judge_noise_at_its_analytic_value_and_slca_not_at_all():
    # One group of four: kinds gold, gold, name, name (process p = [1, 1, .4, .4]), true rating 3 for all (clean
    # summary .5), the noisy judge says [4, 2, 4, 2] (summary [.75, .25, .75, .25]): e = [.25, -.25, .25, -.25],
    # orthogonal to p - mean p = [.3, .3, -.3, -.3]. GRPO's tool credit is Norm(p + .5 + e), affine in s = p + e
    # (centred [.55, .05, -.05, -.55]), so leak = sum e s / sqrt(sum e^2 sum s^2) = .25 / sqrt(.25 * .61)
    # = sqrt(.25 / .61). SLCA's is Norm(p) = [a, a, -a, -a]: sum e * c = .25 (a - a - a + a) = 0 exactly.
    specs = [cq.ToolSpec(0, (k,), 3) for k in ("gold", "gold", "name", "name")]
    (probe,) = cq.tool_probes([ROW], specs, {0.5: ScriptedJudge([4, 2, 4, 2])})
    tool = next(u for u in probe.units if u.name == "tool")
    assert tool.truth.tolist() == pytest.approx([1.0, 1.0, 0.4, 0.4])
    assert tool.noise.tolist() == [0.25, -0.25, 0.25, -0.25]
    assert probe.batch.scores.tolist() == pytest.approx([1.75, 1.25, 1.15, 0.65])
    grpo, _ = credits(probe, "grpo", "tool")
    slca, _ = credits(probe, "slca", "tool")
    assert cq.leakage(tool.noise, grpo, tool.group)[0] == pytest.approx(math.sqrt(0.25 / 0.61), abs=1e-6)
    assert cq.leakage(tool.noise, slca, tool.group)[0] == 0.0
    assert cq.score_units(tool, credit.get("slca")()(probe.batch).advantages)["leak"] == 0.0


def test_slca_ranks_a_gold_turn_above_name_corrupted_and_malformed_ones_where_grpo_does_not():
    # Gold call + a poor summary (rating 1: 0), a name-corrupted call + an excellent one (rating 5: 1), a
    # malformed call + rating 5 (no executed call, so no tool response: HierR's summary is 0 unrated).
    # p = [1, .4, 0], summary [0, 1, 0], score [1, 1.4, 0].
    # SLCA's tool credit Norm(p): mean .4667, centred [.5333, -.0667, -.4667], std sqrt(.5067 / 2) = .5033,
    # so [1.060, -.132, -.927]: gold > name > malformed. GRPO's Norm(score): mean .8, centred [.2, .6, -.8], std
    # sqrt(1.04 / 2) = .7211, so [.277, .832, -1.109]: the name-corrupted call above the gold one.
    specs = [cq.ToolSpec(0, ("gold",), 1), cq.ToolSpec(0, ("name",), 5), cq.ToolSpec(0, ("malformed",), 5)]
    (probe,) = cq.tool_probes([ROW], specs, {0.0: cq.KnownQualityJudge()})
    assert probe.batch.reward_parts["process"].tolist() == pytest.approx([PROCESS[k] for k in ("gold", "name",
                                                                                               "malformed")])
    assert probe.batch.reward_parts["summary"].tolist() == [0.0, 1.0, 0.0]
    assert probe.batch.reward_parts["no_tool_response"].tolist() == [0.0, 0.0, 1.0]

    def norm(x: list[float]) -> list[float]:  # (x - mean) / (unbiased std), eps 1e-6 negligible
        t = torch.tensor(x, dtype=torch.float64)
        return ((t - t.mean()) / t.std()).tolist()

    slca, units = credits(probe, "slca", "tool_turn")
    grpo, _ = credits(probe, "grpo", "tool_turn")
    assert slca.tolist() == pytest.approx(norm([1.0, 0.4, 0.0]), abs=1e-5)
    assert slca.tolist() == pytest.approx([1.0596, -0.1325, -0.9272], abs=1e-4)
    assert grpo.tolist() == pytest.approx([0.2774, 0.8321, -1.1094], abs=1e-4)
    assert slca[0] > slca[1] > slca[2] and grpo[1] > grpo[0]
    assert units.kind.tolist() == [0, 2, 3]
    assert cq.within_group_spearman(slca, units.truth, units.group) == (pytest.approx(1.0), 1)
    assert cq.within_group_spearman(grpo, units.truth, units.group)[0] == pytest.approx(0.5)  # ranks [2,3,1]


def test_tool_layout_is_what_slca_and_slca_tcpo_read():
    # A two-step row: every tool turn is a learnable run of its own turn id, the summary the last one.
    row = next(r for r in cq.tool_rows(4, seed=0) if r["subset"] == "multi")
    value = 1 - 0.2 / len(json.loads(row["gold_tool_calls"])[0][0]["arguments"])  # one of its arguments wrong
    (probe,) = cq.tool_probes([row], [cq.ToolSpec(0, ("gold", "malformed"), 4), cq.ToolSpec(0, ("value", "gold"), 2)],
                              {0.0: cq.KnownQualityJudge()})
    batch = probe.batch
    tool, summary = credit.segment_masks(batch.response_mask)
    assert set(batch.turn_ids[tool].tolist()) == {0, 1} and set(batch.turn_ids[summary].tolist()) == {2}
    assert batch.turn_parts["tool_turn_mask"].tolist() == [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]]
    assert batch.turn_parts["tool_scores"][:, :2].tolist() == [[1.0, 0.0], [pytest.approx(value), 1.0]]
    assert batch.reward_weights == {"process": 1.0, "summary": 1.0}
    turns = next(u for u in probe.units if u.name == "tool_turn")
    assert turns.truth.tolist() == pytest.approx([1.0, 0.0, value, 1.0]) and turns.kind.tolist() == [0, 3, 1, 0]
    alt, cf_mask = batch.extras["alt_scores"], batch.extras["cf_mask"]  # the augmenter's, top 5 of 4 tool turns
    assert cf_mask.sum() == 4 and not alt[cf_mask].isnan().any() and alt[~cf_mask].isnan().all()


def test_the_causal_tool_family_truth_is_the_calls_and_a_summary_that_depends_on_them():
    """Skill 5 with both calls right writes rating 5; with one of two right 1 + floor(4 x 0.5 + 0.5) = 3; with
    none 1. Skill 4 with one of two right: 1 + floor(1.5 + 0.5) = 3; skill 2 with one of two: 1 + floor(1) = 2."""
    spec = cq.ToolSpec
    assert [cq.summary_rating(spec(0, k, r)) for k, r in ((("gold", "gold"), 5), (("gold", "value"), 5),
                                                         (("name", "malformed"), 5), (("value", "gold"), 4),
                                                         (("gold", "name"), 2))] == [5, 3, 1, 3, 2]
    row = next(r for r in cq.tool_rows(4, seed=0) if r["subset"] == "multi")
    specs = [spec(0, ("gold", "gold"), 5), spec(0, ("value", "gold"), 5), spec(0, ("value", "value"), 5)]
    (probe,) = cq.tool_probes([row], specs, {0.0: cq.KnownQualityJudge()}, causal=True)
    assert probe.family == "tool"
    units = {u.name: u for u in probe.units}
    assert units["tool_turn"].truth.tolist() == [1.0, 1.0, 0.0, 1.0, 0.0, 0.0]  # right or not, per call
    assert units["tool"].truth.tolist() == [1.0, 0.5, 0.0]
    # true ratings 5, 3, 1 -> the clean judge's (rating - 1) / 4 = 1, .5, 0; the judge measures them (noise 0)
    assert units["summary"].truth.tolist() == [1.0, 0.5, 0.0]
    assert probe.batch.reward_parts["summary"].tolist() == [1.0, 0.5, 0.0]
    # the process score is a partial-credit measure, not the truth: a call with one wrong value of n_k arguments
    # still scores 1 - 0.2 / n_k (value = 1 - 1 / n_k of the 0.20 weight)
    arity = [len(step[0]["arguments"]) for step in json.loads(row["gold_tool_calls"])[:2]]
    assert probe.batch.turn_parts["tool_scores"][2, :2].tolist() == [pytest.approx(1 - 0.2 / n) for n in arity]


def test_the_process_measurement_noise():
    """``measured`` at noise 1 redraws every process score, ToolPO ratio, tool score and counterfactual score, and moves the
    total score by w_process x the change; at noise 0 it is the batch itself; the input is never changed."""
    row = next(r for r in cq.tool_rows(4, seed=0) if r["subset"] == "multi")
    specs = [cq.ToolSpec(0, ("gold", "gold"), 5), cq.ToolSpec(0, ("value", "gold"), 3)]
    (probe,) = cq.tool_probes([row], specs, {0.0: cq.KnownQualityJudge()})
    batch = probe.batch
    before = (batch.scores.clone(), batch.reward_parts["process"].clone(), batch.turn_parts["tool_scores"].clone())
    assert cq.measured(batch, {"process": 1.0}, 0.0, seed=0) is batch
    noisy = cq.measured(batch, {"process": 2.0}, 1.0, seed=0)
    assert (noisy.reward_parts["process"] != batch.reward_parts["process"]).all()
    ratio = batch.reward_parts["toolpo_correct_ratio"]  # ToolPO's strict ratio measures the same calls
    assert ratio.tolist() == [1.0, 0.5] and (noisy.reward_parts["toolpo_correct_ratio"] != ratio).all()
    assert ((noisy.turn_parts["tool_scores"] - batch.turn_parts["tool_scores"]).abs() > 0).all()
    cf = batch.extras["cf_mask"]
    assert (noisy.extras["alt_scores"][cf] != batch.extras["alt_scores"][cf]).all()
    torch.testing.assert_close(noisy.scores - batch.scores,
                               2.0 * (noisy.reward_parts["process"] - batch.reward_parts["process"]).float())
    assert ((noisy.reward_parts["process"] >= 0) & (noisy.reward_parts["process"] <= 1)).all()
    assert all(torch.equal(a, b) for a, b in zip(before, (batch.scores, batch.reward_parts["process"],
                                                          batch.turn_parts["tool_scores"])))
    assert torch.equal(cq.measured(batch, {"process": 2.0}, 0.5, seed=3).scores,
                       cq.measured(batch, {"process": 2.0}, 0.5, seed=3).scores)  # seeded


def test_revision_effects_by_hand():
    i, m, r, e, f = (cq.ACTIONS.index(a) for a in cq.ACTIONS)
    actions = torch.tensor([[i, e, r, f, m], [i, i, r, m, i], [i, i, m, m, r]])
    after, before, enabled = cq.simulate(actions)
    assert after.tolist() == [[.5, .5, 0, 1, 1], [.5, 1, .5, .5, 1], [.5, 1, 1, 1, .5]]
    assert enabled[0].tolist() == [False, False, True, True, True] and before[1].tolist() == [0, .5, 1, .5, .5]
    # Row 0: without the improve the fix still ends at 1 (0); without the enable the fix does nothing (1);
    # the regression is repaired by the fix (0); without the fix the episode ends at 0 (1). Row 1: each improve
    # is worth .5, the regression is undone by the last improve (0). Row 2: the final regression costs .5.
    assert cq.true_effects(actions).tolist() == [[0, 1, 0, 1, 0], [.5, .5, 0, 0, .5], [.5, .5, 0, 0, -.5]]


def test_revision_batch_and_its_counterfactuals_follow_the_process():
    probes = cq.revision_probes(2, seed=3, noises=(0.0, 1.0))
    clean = probes[0].batch
    actions = probes[0].units[0].kind.view(-1, cq.TURNS)
    after = cq.simulate(actions)[0]
    assert clean.turn_scores.tolist() == after.float().tolist() and clean.scores.tolist() == after[:, -1].tolist()
    assert clean.turn_mask.all() and (clean.turn_surprisal() > 0).all()
    # Every sampled alternative's verifier score is what some action makes of the turn's state at noise 0.
    _, before, enabled = cq.simulate(actions)
    reachable = torch.stack([cq.revision_step(before, enabled, torch.full_like(actions, a))[0]
                             for a in range(len(cq.ACTIONS))], -1)  # [B, K, 5]
    alt, cf_mask = clean.extras["alt_scores"], clean.extras["cf_mask"]
    assert cf_mask.sum() == 2 * 5  # top 5 turns per group by surprisal
    hit = (alt[..., :, None].double() == reachable[..., None, :]).any(-1)
    assert hit[cf_mask].all() and alt[~cf_mask].isnan().all()
    assert (probes[1].batch.turn_scores != clean.turn_scores).any()  # noise 1: scores redrawn


def test_decision_truth_by_hand():
    # Situations: x right z right, x right z wrong, x wrong z right, x wrong z wrong, no parsable revision (x wrong).
    x = torch.tensor([True, True, False, False, False])
    z = torch.tensor([True, False, True, False, True])
    has = torch.tensor([True, True, True, True, False])
    truth = cq.decision_truth(x, z, has)
    assert truth["verifier"].tolist() == [[0, 1], [0, 1], [1, 0], [1, 0], [1, 0]]  # (SAC, NS)
    assert truth["approver"].tolist() == [[1, 1], [1, 0], [0, 1], [0, 0], [0, 0]]  # (KEEP, REVISE)
    assert truth["reviser"].tolist() == [[1, 1], [1, 0], [0, 1], [0, 0], [0, 0]]  # (keep text, revise text)


def test_small_benchmark_command(tmp_path, capsys):
    """The CI setting: the command on ``--size small`` in seconds, its outputs, and values fixed by structure."""
    out, png = tmp_path / "cq.json", tmp_path / "cq.png"
    report = cq.main(["--size", "small", "--out", str(out), "--plot", str(png)])
    assert report["elapsed_s"] < 30 and png.stat().st_size > 0
    saved = json.loads(out.read_text())
    assert saved["results"] == report["results"] and saved["settings"]["size"] == "small" and "machine" in saved
    assert "### (a) tool calling" in capsys.readouterr().out

    rows = {(r["family"], r["unit"], r["estimator"], r["noise"]): r for r in report["results"]}
    na = {(n["family"], n["estimator"]): n["reason"] for n in report["not_applicable"]}
    for family in cq.FAMILIES:  # every registered estimator is scored or reported n/a, on every family
        seen = {e for f, _, e, _ in rows if f == family} | {e for f, e in na if f == family}
        assert set(credit.available()) <= seen
        assert not {e for f, _, e, _ in rows if f == family} & {e for f, e in na if f == family}
    assert len(rows) == len(report["results"])
    assert "turn_scores" in na[("tool", "tcpo")] and "reward_parts['process']" in na[("revision", "slca")]
    assert ("tool", "dpa") in na and ("tool_mechanism", "dpa") in na and ("decision", "dpa") not in na
    mech = "tool_mechanism"
    for p in cq.NOISES:
        assert rows[(mech, "tool", "slca", p)]["spearman"] == 1.0  # the built-in winner: truth = SLCA's input
        assert rows[(mech, "tool", "slca", p)]["sign"] == 1.0
        for family in ("tool", mech):
            for metric in ("spearman", "sign"):  # positive affine maps of each other within a group
                assert rows[(family, "tool", "rloo", p)][metric] == rows[(family, "tool", "grpo", p)][metric]
        for metric in ("spearman", "sign"):
            assert rows[("revision", "turn", "tcpo[trajectory]", p)][metric] == \
                rows[("revision", "turn", "grpo", p)][metric]
    # the causal family has no built-in winner: the partial-credit process score is not the calls' correctness
    assert rows[("tool", "tool", "slca", 0.0)]["spearman"] < 1.0
    assert rows[(mech, "summary", "slca", 0.0)]["spearman"] == 1.0
    assert rows[(mech, "summary", "grpo", 0.0)]["spearman"] < 1.0  # the process score's spread leaks in
    assert rows[(mech, "tool", "grpo", 0.0)]["leak"] is None  # no judge noise, nothing to leak
    assert rows[(mech, "tool", "grpo", 1.0)]["leak"] > 0.3
    for role in ("verifier", "approver", "reviser"):
        assert rows[("decision", role, "dpa", 0.0)]["sign"] == 1.0
        assert rows[("decision", role, "dpa", 0.0)]["spearman"] == 1.0
    assert cq.run("small")["results"] == report["results"]  # seeded: the same numbers again
