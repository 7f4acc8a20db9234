"""The closed-loop credit-learning benchmark (issue 35 item 4): the table policy's sampling, gather and clipping by
hand; each family's exact truth at the uniform start by hand and against Monte Carlo rollouts; the rollout
layout the estimators read; batching seeds changes no seed's gradient; steps-to-threshold censoring; GRPO
learns; an estimator that is GRPO by construction trains identically; the command on its tiny setting."""
from __future__ import annotations

import json
import math

import pytest
import torch

from benchmarks import credit_learning as cl
from lit_credit.rewards.dpa import rarity_weights, revise_share


def test_table_policy_sample_and_gather_by_hand():
    """One seed, a point with 3 valid actions of probs (0.5, 0.3, 0.2) (cdf 0.5, 0.8, 1.0) and a point with 2 valid
    of 3 (third masked). Inverse CDF: a = #{F(a') <= u}: u = 0.1 -> 0, 0.5 -> 1 (F(0) = 0.5 <= 0.5), 0.79 -> 1,
    0.95 -> 2; on the 2-action point u = 0.999 stays below F = 1 but is clamped to the last valid action 1."""
    valid = torch.tensor([[True, True, True], [True, True, False]])
    pol = cl.TablePolicy(1, valid)
    with torch.no_grad():
        pol.theta[0, 0] = torch.tensor([0.5, 0.3, 0.2]).log()
    probs = pol.probs()
    assert probs[0, 1].tolist() == pytest.approx([0.5, 0.5, 0.0])
    a = pol.sample(torch.tensor([[0, 0, 0, 0, 1]]), torch.tensor([[0.1, 0.5, 0.79, 0.95, 0.999]]))
    assert a.tolist() == [[0, 1, 1, 2, 1]]
    table = pol.log_probs().detach()
    lp = cl.TablePolicy.token_logp(table, torch.tensor([0, 0]), torch.tensor([[-1, 0], [1, -1]]),
                                   torch.tensor([[-1, 2], [1, -1]]))
    torch.testing.assert_close(lp, torch.tensor([[0.0, math.log(0.2)], [math.log(0.5), 0.0]]))


def test_clip_per_seed_and_role():
    """Gradients [[3, 4] on role 0, [0, 0.5] on role 1] for seed 0 and [0.3, 0.4], [0, 0] for seed 1, max norm 1:
    seed 0 role 0 has norm 5 -> scaled by 1 / (5 + 1e-6); its role 1 (norm 0.5) and seed 1 (0.5) are untouched."""
    pol = cl.TablePolicy(2, torch.ones(2, 2, dtype=torch.bool), roles=torch.tensor([0, 1]))
    pol.theta.grad = torch.tensor([[[3.0, 4.0], [0.0, 0.5]], [[0.3, 0.4], [0.0, 0.0]]])
    pol.clip_(1.0)
    g = pol.theta.grad
    assert g[0, 0].tolist() == pytest.approx([0.6, 0.8], rel=1e-5)
    assert g[0, 1].tolist() == pytest.approx([0.0, 0.5])
    assert g[1].reshape(-1).tolist() == pytest.approx([0.3, 0.4, 0.0, 0.0])


def test_truths_at_the_uniform_start_by_hand():
    """Uniform tables. Tool (4 tools, 4 summaries q = 0, 1/3, 2/3, 1): pbar = 1/4, E q = 1/2, J = 1/4 (1 + 1/2) / 2
    = 0.1875. Revision, each action 1/5 from (level 0, off): K = 1: only improve scores (0.5): J = 0.1. K = 2 easy:
    after turn 1, (1, off) 1/5, (0, off) 3/5 (maintain, regress, fix with nothing enabled), (0, on) 1/5; turn 2 from
    (1, off): improve 1, maintain .5, regress 0, enable .5, fix .5 -> 0.5; from (0, off): improve .5 -> 0.1; from
    (0, on): improve .5, fix 1 -> 0.3; J = .2 * .5 + .6 * .1 + .2 * .3 = 0.22. Hard: improve from (1, off) stays at 1
    -> 0.4, J = 0.08 + 0.06 + 0.06 = 0.20; half hard 0.21. Decision (modal .6, accuracy b = .8, z = .6): P_c = 1/4,
    SAC = REVISE = 1/2 on either feature, J = .25 (1 - .5 .5 .4) + .75 .5 .5 .6 = 0.3375; proposals alone 0.25."""
    def start(family, setting):
        fam = cl.make_family(family, setting, 3, 0)
        return fam.truth(fam.policy().probs()).tolist()

    assert start("tool", cl.ToolSetting()) == pytest.approx([0.1875] * 3)
    assert start("revision", cl.RevisionSetting(turns=1)) == pytest.approx([0.1] * 3)
    assert start("revision", cl.RevisionSetting(turns=2, hard_share=0.0)) == pytest.approx([0.22] * 3)
    assert start("revision", cl.RevisionSetting(turns=2, hard_share=1.0)) == pytest.approx([0.20] * 3)
    assert start("revision", cl.RevisionSetting(turns=2, hard_share=0.5)) == pytest.approx([0.21] * 3)
    fam = cl.make_family("decision", cl.DecisionSetting(), 3, 0)
    probs = fam.policy().probs()
    assert fam.truth(probs).tolist() == pytest.approx([0.3375] * 3)
    assert fam.truth(probs, game=False).tolist() == pytest.approx([0.25] * 3)


def test_revision_transitions_by_hand():
    """State 2 level + enabled. Easy: improve (1, off) -> (2, off) = 4; hard: stays (1, off) = 2; regress at 0
    stays 0; enable (1, off) -> (1, on) = 3; fix (0, on) -> (2, on) = 5, fix (1, off) -> nothing = 2."""
    nxt = cl.revision_transitions()
    assert nxt[0, 2, cl.IMPROVE] == 4 and nxt[1, 2, cl.IMPROVE] == 2
    assert nxt[0, 0, cl.REGRESS] == 0 and nxt[0, 4, cl.REGRESS] == 2
    assert nxt[0, 2, cl.ENABLE] == 3 and nxt[1, 1, cl.FIX] == 5 and nxt[1, 2, cl.FIX] == 2
    assert nxt[1, 1, cl.IMPROVE] == 3  # the flag survives improve


@pytest.mark.parametrize("family,setting", [("tool", cl.ToolSetting(contexts=2, n=64)),
                                            ("revision", cl.RevisionSetting(contexts=2, turns=3, n=64))])
def test_exact_truth_matches_the_rollouts(family, setting):
    """At a random (non-uniform) table the exact policy truth equals the mean rollout truth: 40 steps of 128
    rollouts per seed, the mean within 4 standard errors (the rollout truth lies in [0, 1], sd <= 0.5)."""
    fam = cl.make_family(family, setting, 2, 0)
    pol = fam.policy()
    with torch.no_grad():
        pol.theta.copy_(torch.randn(pol.theta.shape, generator=torch.Generator().manual_seed(3)))
    exact = fam.truth(pol.probs())
    mc = torch.stack([fam.rollouts(pol, cl._gen(0, t))["truth"].view(2, -1).mean(1) for t in range(40)]).mean(0)
    assert (mc - exact).abs().max() < 4 * 0.5 / math.sqrt(40 * 128)


def test_tool_rollout_layout():
    """K = 2 calls then a summary: tokens [prompt, call 0, feedback, call 1, feedback, summary]; the response mask
    on the three action tokens, turn ids 0, 1, 2 there and -1 elsewhere; one group per (seed, prompt); the tool
    turn mask on the calls only; the behaviour log-probs the uniform table's (log 1/4)."""
    fam = cl.make_family("tool", cl.ToolSetting(contexts=2, calls=2, n=3), 2, 0)
    r = fam.rollouts(fam.policy(), cl._gen(0, 0))
    b = r["batch"]
    assert b.response_mask[0].tolist() == [0, 1, 0, 1, 0, 1]
    assert b.turn_ids[0].tolist() == [-1, 0, -1, 1, -1, 2]
    assert b.group_ids.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert b.turn_parts["tool_turn_mask"][0].tolist() == [1, 1, 0]
    assert b.behaviour_logprobs[0].tolist() == pytest.approx([0, math.log(0.25), 0, math.log(0.25), 0, math.log(0.25)])
    s = fam.s
    expected = s.w_process * b.reward_parts["process"] + s.w_summary * b.reward_parts["summary"]
    assert b.scores.tolist() == pytest.approx(expected.tolist())


@pytest.mark.parametrize("family,setting", [("tool", cl.ToolSetting(contexts=2, n=4)),
                                            ("revision", cl.RevisionSetting(contexts=2, n=4))])
def test_batching_seeds_gives_each_seed_its_own_gradient(family, setting):
    """The batched loss's gradient on seed s equals the gradient of the loss of seed s's rows alone (scale 1):
    the token mean over seeds with equal rows is (1/S) sum_s L_s and the scale S undoes the 1/S."""
    fam = cl.make_family(family, setting, 3, 0)
    pol = fam.policy()
    with torch.no_grad():
        pol.theta.copy_(0.3 * torch.randn(pol.theta.shape, generator=torch.Generator().manual_seed(1)))
    method = cl.METHODS[family][0]
    (ls,) = fam.sets(pol, cl._gen(0, 0), method, method.make())

    def grad(rows, scale):
        pol.theta.grad = None
        table = pol.log_probs()
        logp = pol.token_logp(table, ls.seed[rows], ls.points[rows], ls.actions[rows])
        ref = pol.token_logp(pol.reference, ls.seed[rows], ls.points[rows], ls.actions[rows])
        loss, _ = ls.loss(logp, ls.batch.behaviour_logprobs[rows], ls.advantages[rows], ls.mask[rows], ref)
        (scale * loss).backward()
        return pol.theta.grad.clone()

    batched = grad(torch.arange(len(ls.seed)), ls.scale)
    assert batched.abs().sum() > 0
    for s in range(3):
        alone = grad(torch.nonzero(ls.seed == s).squeeze(1), 1.0)
        torch.testing.assert_close(batched[s], alone[s], atol=1e-6, rtol=1e-5)


def test_steps_to_threshold_censors_at_the_budget():
    """Curves over t = 0..3 (budget 3): first reaching 0.5 at t = 2; at t = 0; never (counted 3, not reached)."""
    curve = torch.tensor([[0.1, 0.4, 0.6, 0.9], [0.7, 0.2, 0.1, 0.1], [0.1, 0.2, 0.3, 0.4]])
    steps, reached = cl.steps_to(curve, 0.5)
    assert steps.tolist() == [2.0, 0.0, 3.0]
    assert reached.tolist() == [True, True, False]


def test_vectorised_dpa_shaping_matches_the_form_games_functions():
    """Per seed, :func:`revise_shares` is :func:`revise_share` over the challenged decisions and :func:`rarity`
    is :func:`rarity_weights` (merged sub-cases, power 1) over them."""
    g = torch.Generator().manual_seed(0)
    own = torch.rand(4, 10, generator=g) < 0.3
    forced = ~own & (torch.rand(4, 10, generator=g) < 0.4)
    challenged = torch.rand(4, 10, generator=g) < 0.6
    labels = torch.randint(len(cl.CASE_IDS), (4, 10), generator=g)
    for rule in ("all", "unforced"):
        shares = cl.revise_shares(own, forced, challenged, rule)
        for s in range(4):
            on = challenged[s]
            assert shares[s] == pytest.approx(revise_share(own[s][on].tolist(), forced[s][on].tolist(), rule))
    w = cl.rarity(labels, challenged, 1.0)
    for s in range(4):
        on = challenged[s]
        assert w[s][on].tolist() == pytest.approx(rarity_weights(labels[s][on], 1.0, merge_subcases=True).tolist())
        assert w[s][~on].tolist() == pytest.approx([1.0] * int((~on).sum()))


def test_grpo_learns_and_trajectory_tcpo_is_grpo_seed_by_seed():
    """Revision, 16 seeds, 30 steps: GRPO's final truth is above its uniform start (0.308 at K = 3, half hard) on
    every seed; ``tcpo[trajectory]`` (one trajectory-level advantage, the outcome's group z-score) trains
    bitwise as GRPO, so the report marks it identical."""
    train = cl.Train(steps=30, lr=0.05, threshold=0.9)
    cell = cl.run_cell("revision", cl.RevisionSetting(), train, 16, 0,
                       methods=[cl.REVISION_METHODS[0], cl.REVISION_METHODS[2]])
    grpo = cell["results"]["grpo"]["truth"]
    assert grpo[:, 0].tolist() == pytest.approx([0.308] * 16, abs=5e-4)
    assert bool((grpo[:, -1] > grpo[:, 0] + 0.2).all())
    rows = {r["method"]: r for r in cell["rows"]}
    assert rows["tcpo[trajectory]"]["identical_to_baseline"]
    assert rows["tcpo[trajectory]"]["d_final"]["diff"] == 0.0


def test_command_tiny(tmp_path, capsys):
    """``python -m benchmarks.credit_learning --size tiny``: the JSON has every tiny cell with every method of its
    family, the markdown a table per cell, the figure is written."""
    out, fig = tmp_path / "cl.json", tmp_path / "cl.png"
    cl.main(["--size", "tiny", "--out", str(out), "--plot", str(fig)])
    report = json.loads(out.read_text())
    cells = report["cells"]
    assert [(c["family"], c["value"]) for c in cells] == [("tool", 0.0), ("tool", 1.0), ("revision", 3),
                                                         ("decision", 0.2), ("decision", 1.0)]
    for c in cells:
        assert [r["method"] for r in c["rows"]] == [m.name for m in cl.METHODS[c["family"]]]
    assert report["settings"]["seeds"] == 8 and "machine" in report
    text = capsys.readouterr().out
    assert text.count("| method | start | final |") == len(cells)
    assert fig.stat().st_size > 10_000
