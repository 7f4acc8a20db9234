"""fp32 master weights under bf16 compute: the policy trains in fp32 whatever the checkpoint's dtype
(``PolicySource.load``), ``trainer.precision=bf16-mixed`` only autocasts (and under FSDP2 all-gathers in bf16,
``PolicyModule.configure_model``), so an update smaller than a bf16 ulp still moves a weight."""
from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra.utils import instantiate
from transformers import LlamaConfig, LlamaForCausalLM

from lit_credit.models import PolicySource
from lit_credit.models.tokenizer import build_tokenizer
from tests.test_scale import STEPS, experience, run  # noqa: F401 (experience: the fixture, for this module too)

HIDDEN, BATCH = 16, 4
# SGD on W = 1 with gradient BATCH: the step is LR * BATCH = 2^-10, below half the bf16 ulp just under 1
# (bf16 has 8 significant bits: its neighbours of 1 are 1 - 2^-8 and 1 + 2^-7), so 1 - 2^-10 rounds back to 1
# in bf16 and is exact in fp32.
LR = 2.0 ** -12
STEP = LR * BATCH


@pytest.fixture
def bf16_checkpoint(tmp_path) -> Path:
    """A tiny Llama saved in bf16 (as HF checkpoints of LLMs are), its LM head all ones."""
    tokenizer = build_tokenizer(["1 + 2 = 3", "the answer is 4"], vocab_size=300)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=HIDDEN, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.fill_(1.0)
    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    tokenizer.save_pretrained(tmp_path / "bf16")
    assert LlamaForCausalLM.from_pretrained(tmp_path / "bf16").config.dtype == torch.bfloat16
    return tmp_path / "bf16"


def test_hf_config_trains_a_bf16_checkpoint_in_fp32(bf16_checkpoint, make_cfg):
    """``model=hf`` (``dtype: bfloat16``) composed through Hydra: the policy's parameters are fp32, the same values
    as the checkpoint's; with LoRA the frozen base stays bf16 and every trainable weight (the adapters) is fp32;
    ``load(trainable=False)`` (a frozen judge) keeps every weight in ``model.dtype``."""
    cfg = make_cfg("model=hf", f"model.path={bf16_checkpoint}", fast_model=False)
    source = instantiate(cfg.model)
    assert source.dtype == "bfloat16" and source.lora is None
    policy = source.load()[0]
    frozen = source.load(trainable=False)[0]
    assert {p.dtype for p in policy.parameters()} == {torch.float32}
    assert {p.dtype for p in frozen.parameters()} == {torch.bfloat16}
    for (name, a), (_, b) in zip(policy.state_dict().items(), frozen.state_dict().items(), strict=True):
        assert torch.equal(a, b.float()), name  # bf16 -> fp32 is exact

    lora = instantiate(make_cfg("model=hf", f"model.path={bf16_checkpoint}", "model/lora=r8", fast_model=False).model)
    params = dict(lora.load()[0].named_parameters())
    trainable = {n for n, p in params.items() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert {params[n].dtype for n in trainable} == {torch.float32}
    assert {p.dtype for n, p in params.items() if n not in trainable} == {torch.bfloat16}
    with pytest.raises(ValueError, match=r"^model\.dtype='bf16': the dtype of the weights that never train .*; use one "
                       r"of \['bfloat16', 'float16', 'float32'\]$"):
        PolicySource(path=str(bf16_checkpoint), dtype="bf16")


class LMHeadStep(L.LightningModule):
    """One SGD step on ``sum(lm_head(x))`` with ``x`` all ones: ``d/dW[v, h] = sum_b x[b, h] = BATCH`` for every
    weight, exact in bf16 too (sums of 1s); the output's dtype shows what the forward computed in."""

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        self.policy, self.out_dtypes = policy, []

    def training_step(self, batch, batch_idx):
        out = self.policy.lm_head(batch)
        self.out_dtypes.append(out.dtype)
        return out.float().sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.policy.lm_head.parameters(), lr=LR)


def train_one_step(policy: torch.nn.Module) -> LMHeadStep:
    module = LMHeadStep(policy)
    trainer = L.Trainer(accelerator="cpu", devices=1, precision="bf16-mixed", max_steps=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, torch.utils.data.DataLoader([torch.ones(BATCH, HIDDEN)], batch_size=None))
    return module


def test_an_update_below_a_bf16_ulp_moves_the_fp32_master_weight(bf16_checkpoint):
    """A real Lightning Trainer, ``precision=bf16-mixed`` on CPU, one SGD step of size 2^-10 on weights equal to 1:
    the policy as ``PolicySource`` loads it (fp32 from the bf16 checkpoint) computes in bf16 under autocast and
    its weights become exactly 1 - 2^-10; the same step on bf16 parameters (what loading in the checkpoint's
    dtype gave before) is rounded away and leaves them at 1."""
    assert torch.tensor(1 - STEP).bfloat16().item() == 1.0 and torch.tensor(1 - STEP).item() == 1 - STEP
    source = PolicySource(path=str(bf16_checkpoint), dtype="bfloat16")
    master = train_one_step(source.load()[0])
    weight = master.policy.lm_head.weight
    assert master.out_dtypes == [torch.bfloat16] and weight.dtype == torch.float32
    assert torch.equal(weight, torch.full_like(weight, 1 - STEP))
    bf16 = train_one_step(source.load(trainable=False)[0])
    assert bf16.out_dtypes == [torch.bfloat16]
    assert torch.equal(bf16.policy.lm_head.weight, torch.ones_like(bf16.policy.lm_head.weight))


class PrecisionProbe(L.Callback):
    """Under FSDP2 with bf16-mixed, per rank: the dtype of a decoder layer's weights inside its forward (the
    all-gathered copies) for the policy and the reference, the sharded parameters' dtypes, the first step's KL;
    at the end a full checkpoint (``save_distributed_checkpoint: false``) is saved, every shard of the policy
    zeroed, and the checkpoint loaded back: whether it held the policy and not the (never saved) reference, and
    whether policy and reference are as before."""

    def __init__(self, out: str) -> None:
        self.out, self.seen, self.kl = Path(out), {}, []

    def on_train_start(self, trainer, pl_module) -> None:
        for name in ("policy", "reference"):
            proj = getattr(pl_module, name).model.layers[0].mlp.down_proj
            proj.register_forward_hook(lambda m, i, o, name=name: self.seen.setdefault(name, str(m.weight.dtype))
                                       and None)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.kl.append(float(trainer.callback_metrics["loss/kl"]))

    def on_train_end(self, trainer, pl_module) -> None:
        from torch.distributed.tensor import DTensor

        def full(model):
            return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu().clone()
                    for k, v in model.state_dict().items()}

        sharded = {name: sorted({str(p.dtype) for p in getattr(pl_module, name).parameters()})
                   for name in ("policy", "reference")}
        before = {name: full(getattr(pl_module, name)) for name in ("policy", "reference")}
        path = self.out / "fsdp.ckpt"
        trainer.save_checkpoint(path)
        trainer.strategy.barrier()
        saved = torch.load(path, weights_only=False)["state_dict"]
        # The policy travels in the checkpoint; the frozen reference never does (rebuilt from the initial weights).
        in_file = all(torch.equal(saved[f"policy.{k}"], v) for k, v in before["policy"].items()) and not any(
            k.startswith("reference.") for k in saved)
        with torch.no_grad():
            for p in pl_module.policy.parameters():
                p.zero_()
        trainer.strategy.load_checkpoint(path, weights_only=False)  # hyperparameters are pickled too
        after = {name: full(getattr(pl_module, name)) for name in ("policy", "reference")}
        restored = all(torch.equal(after[name][k], v) for name in before for k, v in before[name].items())
        (self.out / f"probe{trainer.global_rank}.json").write_text(json.dumps(
            {"forward": self.seen, "sharded": sharded, "kl": self.kl, "in_file": in_file, "restored": restored}))


def test_fsdp2_bf16_mixed_keeps_fp32_shards_and_moves_them_below_a_bf16_ulp(experience, cache_dir):  # noqa: F811
    """2 gloo processes, ``trainer=fsdp2_cpu trainer.precision=bf16-mixed`` (FSDP2's MixedPrecisionPolicy with
    bf16 parameters and fp32 reduction works on gloo): policy and reference compute with bf16 all-gathered
    weights, their shards stay fp32, the first step's KL is exactly 0 (the reference computes as the policy
    does), SGD (lr 1e-4, momentum 0.5, gradients clipped to norm 1 over 117k weights) moves most fp32 weights,
    nearly all of them by less than half a bf16 ulp of each (a bf16 weight would not move; nor do most of the
    bf16 copies the forward computes with until the updates add up), and a full checkpoint holds and restores
    the sharded policy and reference (the optimiser's momentum loads with them)."""
    out = experience.parent / "fsdp2_bf16"
    ranks, state, _ = run("fsdp2_cpu", experience, cache_dir, out, "trainer.precision=bf16-mixed",
                          "method.optimizer.lr=1e-4", "+method.optimizer.momentum=0.5",  # an optimiser state to load
                          "+callbacks.probe._target_=tests.test_precision.PrecisionProbe",
                          f"+callbacks.probe.out={out}")
    assert len(ranks) == 2 and all(r["sharded"] and r["reference_sharded"] for r in ranks)
    probes = [json.loads((out / f"probe{rank}.json").read_text()) for rank in range(2)]
    for probe in probes:
        assert probe["forward"] == {"policy": "torch.bfloat16", "reference": "torch.bfloat16"}
        assert probe["sharded"] == {"policy": ["torch.float32"], "reference": ["torch.float32"]}
        assert len(probe["kl"]) == STEPS and probe["kl"][0] == 0.0
        assert probe["in_file"] and probe["restored"]
    init = torch.load(experience.parent / "init.pt")
    assert {v.dtype for v in state.values()} == {torch.float32}
    moved = below = 0
    for key, before in init.items():
        delta = (state[key] - before).abs()
        half_ulp = torch.exp2(torch.floor(torch.log2(before.abs())) - 8)  # bf16: 8 significant bits
        changed = delta > 0
        moved += int(changed.sum())
        below += int((changed & (delta < half_ulp)).sum())
    total = sum(v.numel() for v in init.values())
    print(f"\nfsdp2 bf16-mixed: {moved} of {total} weights moved, {below} of them by less than half a bf16 ulp")
    assert moved > total // 2 and below > moved * 99 // 100
