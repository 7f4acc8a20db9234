"""A second game for DPA-GRPO is one game class and one config: a two-role toy game, defined here.

The proposer answers an arithmetic prompt (the task's rollouts); the critic reads the answer and says AGREE or
DISAGREE. The critic is trained on both canonical actions of every decision (a pair): AGREE scores 1 when the
answer is right, DISAGREE when it is wrong. Its config (:data:`AGREE_YAML`: the game and which adapter plays each
role) is written into a config directory on Hydra's search path and selected with ``game=agree``, on the real
DPAGRPOModule with the embedded tiny policy and LoRA r8, sampling through a scripted engine (the proposer's two
answers per prompt, one right and one wrong; the critic always AGREE), as tests/methods/test_dpa_module.py does
for the form game.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch
from hydra.errors import InstantiationException
from torch import Tensor

from lit_credit.train import build
from lit_credit.types import Action, Completion, GameRecord, RoleActions, RolloutBatch, SamplingParams

QUESTION = "AGREE or DISAGREE?"
AGREE_YAML = """\
_target_: tests.methods.test_second_game.AgreeGame
role_adapters:
  proposer: generator
  critic: verifier
"""


@dataclass
class AgreeRecord(GameRecord):
    """One round: the critic's sampled verdicts, right where they match the answers' correctness."""

    critic_right: Tensor
    headline = "critic/accuracy"

    def metrics(self, stage: str) -> dict[str, float]:
        return {f"{stage}/critic/accuracy": self.critic_right.float().mean().item()}


class AgreeGame:
    """The toy game: per proposal (a decision) the critic's verdict, sampled under its adapter; its training pair
    ``(AGREE, DISAGREE)`` with rewards ``(1[x right], 1[x wrong])``, x right when it scored 1 (exact match)."""

    roles = ("proposer", "critic")

    def __init__(self, role_adapters: dict[str, str] | None = None) -> None:
        self.role_adapters = dict(role_adapters or {"proposer": "generator", "critic": "verifier"})

    def play(self, proposals: RolloutBatch, actor, sampling: SamplingParams, training: bool = True) -> AgreeRecord:
        right = proposals.scores.cpu() >= 1
        messages = [[*m["row"]["prompt"], {"role": "assistant", "content": m["replies"][-1]},
                     {"role": "user", "content": QUESTION}] for m in proposals.metadata]
        prompts, verdicts = actor("critic", messages, replace(sampling, n=1, stop=()))
        agrees = torch.tensor([v[0].text.strip().startswith("AGREE") for v in verdicts])
        n = len(proposals)
        critic = RoleActions("critic", [p for p in prompts for _ in range(2)],
                             [Action("AGREE"), Action("DISAGREE")] * n, [i for i in range(n) for _ in range(2)],
                             torch.stack([right.float(), (~right).float()], 1).flatten(), paired=True)
        return AgreeRecord(actions={"critic": critic}, cases=torch.zeros(n, dtype=torch.long),
                           critic_right=agrees == right)


class AgreeEngine:
    """The proposer's replies per prompt: the right answer, then a wrong one (answer + 1); the critic's: AGREE.
    Records the active adapter of every call."""

    def __init__(self, rows) -> None:
        self.rows, self.calls = rows, []

    def bind(self, model, tokenizer) -> None:
        self.model, self.tok = model, tokenizer

    def update_weights(self, model) -> None:
        pass

    def generate(self, prompts, sampling, seeds=None):
        out = []
        for ids in prompts:
            text = self.tok.decode(ids)
            role = "critic" if QUESTION in text else "proposer"
            self.calls.append((role, self.model.active_adapter))
            if role == "critic":
                replies = ["AGREE"]
            else:
                row = next(r for r in self.rows if r["prompt"][-1]["content"] in text)
                replies = [row["answer"], str(int(row["answer"]) + 1)]
            out.append([Completion(self.tok(r)["input_ids"] + [self.tok.eos_token_id],
                                   [0.0] * (len(self.tok(r)["input_ids"]) + 1), r) for r in replies[:sampling.n]])
        return out


@pytest.fixture
def agree_cfg(make_cfg, tmp_path):
    """The config of DPA-GRPO on the toy game: ``game=agree`` from a config directory on the search path."""
    (tmp_path / "conf" / "game").mkdir(parents=True)
    (tmp_path / "conf" / "game" / "agree.yaml").write_text(AGREE_YAML)

    def make(*overrides: str):
        return make_cfg(f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "experiment=grpo_arith",
                        "method=dpa_grpo", "credit=dpa", "loss=dpa", "model/lora=r8", "game=agree",
                        "model.embedded.sft_steps=0", "data.prompts_per_step=2", "data.sampling.n=2",
                        "data.val_samples=0", "trainer.max_steps=2", "+trainer.limit_val_batches=0",
                        "validate_first=false", "logger=csv", "method.optimizer.lr=0.05", *overrides)

    return make


def test_a_round_of_the_second_game_trains_each_role_on_its_adapter_with_its_estimator(agree_cfg):
    # proposal_weight 1 trains the proposals too; their estimator comes from method.role_credit.proposer, here
    # without the std division (A = r - mean): the config, not the module, decides each role's credit.
    module, datamodule, trainer = build(agree_cfg("method.proposal_weight=1.0",
                                                  "+method.role_credit.proposer.norm_by_std=false"))
    assert type(module.game).__name__ == "AgreeGame"
    assert module.role_adapters == {"proposer": "generator", "critic": "verifier"}
    datamodule.setup("fit")
    engine = datamodule.experience.engine = AgreeEngine([*datamodule.train_set, *datamodule.val_set])
    records, batches = [], []
    play, role_batches = module.game.play, module.role_batches
    module.game.play = lambda *a, **k: records.append(play(*a, **k)) or records[-1]
    module.role_batches = lambda *a: batches.append(role_batches(*a)) or batches[-1]
    before = {n: p.detach().clone() for n, p in module.policy.named_parameters()}
    trainer.fit(module, datamodule=datamodule)
    assert trainer.global_step == 2  # one round: the verifier's optimiser step, then the generator's

    # The critic's set by the game's rule, by hand: 2 prompts x 2 proposals = 4 decisions, the first answer of a
    # prompt right (score 1), the second wrong; rows (AGREE, DISAGREE) per decision, rewards (1, 0) or (0, 1).
    (critic, role), = batches[0].values()
    assert list(batches[0]) == ["critic"] and role == "critic"
    proposals = next(t for t in module.credit_trace if t.source == "proposals").batch
    assert proposals.scores.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert critic.group_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert critic.scores.tolist() == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    codec = module.experience.codec
    actions = [critic.input_ids[i][critic.response_mask[i].bool()].tolist() for i in range(2)]
    assert actions == [codec.reply_ids("AGREE"), codec.reply_ids("DISAGREE")]  # canonical, as the role emits them
    # Credit per role: the critic's pairs by credit=dpa, (r - mean) / (std_pop + 1e-8) = +-1; the proposals' group
    # by method.role_credit.proposer without the std: r - mean = +-0.5.
    def per_row(source):
        trace = next(t for t in module.credit_trace if t.source == source)
        mask = trace.batch.response_mask
        return ((trace.advantages * mask).sum(1) / mask.sum(1)).tolist()

    assert [t.source for t in module.credit_trace] == ["critic", "proposals"]  # the verifier's step first
    assert per_row("critic") == pytest.approx([1.0, -1.0, -1.0, 1.0] * 2, abs=1e-6)
    assert per_row("proposals") == pytest.approx([0.5, -0.5, 0.5, -0.5], abs=1e-6)
    # Each role sampled under its adapter; each adapter got its role's gradient and moved, the base did not.
    assert {role: adapter for role, adapter in engine.calls} == {"proposer": "generator", "critic": "verifier"}
    moved = {n for n, p in module.policy.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert any(".verifier." in n for n in moved) and any(".generator." in n for n in moved)
    assert all("lora_" in n for n in moved)
    # The record's metrics and headline: the critic always AGREEs, right on the right half of the answers.
    assert trainer.callback_metrics["train/critic/accuracy"].item() == pytest.approx(0.5)
    assert trainer.callback_metrics["final"].item() == pytest.approx(0.5)
    for key in ("loss/verifier", "loss/generator", "loss/kl/critic", "loss/kl/proposals"):
        assert torch.isfinite(trainer.callback_metrics[key]), key


@pytest.mark.parametrize(("override", "message"), [
    ("~game.role_adapters.critic", r"game.role_adapters has no adapter for the role 'critic' of AgreeGame.*"
                                   r"fix: game.role_adapters.critic=generator or verifier"),
    ("game.role_adapters.critic=judge", r"game.role_adapters.critic='judge': use one of generator, verifier"),
    ("+game.role_adapters.judge=verifier", r"game.role_adapters.judge: AgreeGame has no role 'judge'"),
    ("+method.role_credit.judge._target_=lit_credit.credit.DPACredit",
     r"method.role_credit.judge: AgreeGame has no role 'judge'"),
])
def test_a_role_without_an_adapter_or_an_unknown_role_is_refused_by_name(agree_cfg, override, message):
    with pytest.raises(InstantiationException, match=message):
        build(agree_cfg(override))
