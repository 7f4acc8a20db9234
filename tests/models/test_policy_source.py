"""Preparing the policy (the embedded SFT warm start) is a step of its own: loading, and so building a module,
never trains; the entry points prepare first."""
from __future__ import annotations

import copy
import pickle

import pytest
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from transformers import AutoModelForCausalLM

from lit_credit.models import EmbeddedPolicy, PolicySource
from lit_credit.tasks import ArithTask
from lit_credit.train import build

# The smallest recipe worth loading: 2 SFT steps on a 1-layer, 32-wide Llama (seconds on CPU).
TINY = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 1, "sft_steps": 2, "sft_batch_size": 4}
TINY_CFG = [f"model.embedded.{k}={v}" for k, v in TINY.items()]


def tiny_source(cache_dir) -> PolicySource:
    return PolicySource(embedded=EmbeddedPolicy(ArithTask(max_operand=9, num_test=20), cache_dir=str(cache_dir),
                                                **TINY))


def test_load_on_a_cold_cache_raises_the_named_error_and_trains_nothing(tmp_path):
    source = tiny_source(tmp_path / "cache")
    with pytest.raises(ValueError, match=r"model\.embedded: .*not built.*PolicySource\.prepare\(\).*lit-credit"):
        source.load()
    assert not (tmp_path / "cache").exists()  # no cache directory, not even the parent of a temporary build
    assert not source.embedded.built


def test_building_a_module_from_config_on_a_cold_cache_trains_nothing(make_cfg, tmp_path):
    cfg = make_cfg(*TINY_CFG)
    cfg.paths.cache_dir = str(tmp_path / "cold")
    with pytest.raises(InstantiationException) as raised:
        instantiate(cfg.method)  # the module alone: its constructor loads, it does not prepare
    assert isinstance(raised.value.__cause__, ValueError) and "PolicySource.prepare()" in str(raised.value.__cause__)
    assert not (tmp_path / "cold").exists()


def test_prepare_builds_once_then_load_reads_what_it_built(tmp_path):
    source = tiny_source(tmp_path / "cache")
    path = source.prepare()
    assert path == str(source.embedded.path) and source.embedded.built
    stamp = (source.embedded.path / "config.json").stat().st_mtime_ns
    assert source.prepare() == path  # a cache hit: the same directory, not rewritten
    assert (source.embedded.path / "config.json").stat().st_mtime_ns == stamp
    model, tok = source.load()
    reference = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    assert model.config.hidden_size == 32 and tok.pad_token_id is not None
    for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items(), strict=True):
        assert torch.equal(a, b), name  # load() reads exactly the prepared weights


def test_prepare_of_a_local_directory_is_a_no_op(tmp_path):
    built = tiny_source(tmp_path / "cache").prepare()
    before = sorted(p.name for p in tmp_path.rglob("*"))
    source = PolicySource(path=built)
    assert source.prepare() == built
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written
    assert source.load()[0].config.hidden_size == 32


def test_train_build_prepares_a_cold_cache_and_hands_the_module_that_source(make_cfg, tmp_path):
    cfg = make_cfg(*TINY_CFG, "callbacks=none")
    cfg.paths.cache_dir = str(tmp_path / "cold")
    module, _datamodule, _trainer = build(cfg)
    embedded = module.source.embedded
    assert embedded.built and embedded.path.parent == tmp_path / "cold" / "embedded"
    assert [p.name for p in embedded.path.parent.iterdir()] == [embedded.path.name]  # one build, no temp
    # The module's source is the prepared one: the same recipe and cache key as cfg.model's.
    assert embedded.path == instantiate(cfg.model).embedded.path and embedded.recipe["sft_steps"] == 2
    assert module.policy.config.hidden_size == 32


def test_activation_checkpointing_recomputes_each_layer_in_backward_with_the_same_gradients(tmp_path):
    """model.activation_checkpointing=true, in eval mode (as RL runs the policy): the log-prob gradients equal
    the plain model's (same weights, same batch), each decoder layer's MLP is entered twice in a forward + backward
    (forward, then its recompute) against once without, and once under no_grad; the tensors saved for
    backward shrink (one layer's input kept instead of its intermediates); a deep copy (the reference) keeps
    it, and so does a pickled copy; a model without transformers decoder layers is refused by name."""
    from lit_credit.models.logprobs import token_logprobs
    from lit_credit.models.policy import checkpoint_layers

    built = tiny_source(tmp_path / "cache").prepare()
    plain = PolicySource(path=built).load()[0].eval()
    ckpt = PolicySource(path=built, activation_checkpointing=True).load()[0].eval()
    assert type(ckpt.model.layers[0]).__name__ == "CheckpointedLlamaDecoderLayer"
    assert type(copy.deepcopy(ckpt).model.layers[0]) is type(ckpt.model.layers[0])
    assert type(pickle.loads(pickle.dumps(ckpt)).model.layers[0]) is type(ckpt.model.layers[0])
    ids = torch.randint(3, plain.config.vocab_size, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0

    def run(model, grad=True):
        calls, saved = [], []
        hook = model.model.layers[0].mlp.register_forward_pre_hook(lambda *_: calls.append(1))
        with (torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t),
              torch.set_grad_enabled(grad)):
            logp, _ = token_logprobs(model, ids, mask, entropy=False)
            if grad:
                model.zero_grad(set_to_none=True)
                (logp * mask).sum().backward()
        hook.remove()
        return logp.detach(), [p.grad for p in model.parameters()] if grad else None, len(calls), sum(saved)

    logp_plain, grads_plain, calls_plain, saved_plain = run(plain)
    logp_ckpt, grads_ckpt, calls_ckpt, saved_ckpt = run(ckpt)
    torch.testing.assert_close(logp_ckpt, logp_plain, rtol=0, atol=0)
    for a, b in zip(grads_ckpt, grads_plain):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert (calls_plain, calls_ckpt) == (1, 2)
    assert saved_ckpt < saved_plain
    assert run(ckpt, grad=False)[2] == 1
    with pytest.raises(ValueError, match=r"model\.activation_checkpointing"):
        checkpoint_layers(torch.nn.Linear(2, 2))
