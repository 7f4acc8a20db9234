"""``model.path`` as transformers resolves a name (lit_credit.models.hub.resolve_model_dir): a local directory first,
else a Hugging Face Hub id from the HF cache (downloaded there when online; only the cache with HF_HUB_OFFLINE=1),
else one error naming both options. Nothing is downloaded here: the hub ids are either absent or placed in a
temporary HF cache laid out as huggingface_hub lays it out."""
from __future__ import annotations

from pathlib import Path

import huggingface_hub
import pytest
import torch
from huggingface_hub import constants
from transformers import LlamaConfig, LlamaForCausalLM

from lit_credit.config import ConfigError, check_config
from lit_credit.models import PolicySource
from lit_credit.models.hub import resolve_model_dir
from lit_credit.models.tokenizer import build_tokenizer
from lit_credit.rollout import TextGenerator

CORPUS = ["What is 37 + 45?\n82", "What is 3 + 4?\n7"] * 20
COMMIT = "0123456789abcdef0123456789abcdef01234567"
MISSING = "lit-credit-tests/no-such-model"  # a hub id no one owns: nothing to download even when online


def save_tiny_model(directory: Path) -> Path:
    tok = build_tokenizer(CORPUS, 300)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, pad_token_id=tok.pad_token_id,
                                 eos_token_id=tok.eos_token_id)).save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


@pytest.fixture
def hub_calls(monkeypatch) -> list:
    """The hub unreachable: each request for a repository's metadata is recorded and fails as a connection that
    cannot be made does; huggingface_hub's own HF_HUB_OFFLINE (read when it was imported) false."""
    from huggingface_hub import _snapshot_download

    calls = []

    def unreachable(self, repo_id, **kwargs):
        calls.append(repo_id)
        raise _snapshot_download.httpx2.ConnectError("no network in tests")

    monkeypatch.setattr(huggingface_hub.HfApi, "repo_info", unreachable)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    return calls


@pytest.fixture
def offline_cache(tmp_path, monkeypatch, hub_calls) -> Path:
    """An empty HF cache and HF_HUB_OFFLINE=1 set now (the resolver reads the environment when it runs)."""
    cache = tmp_path / "hf-hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def cache_tiny_model(cache: Path) -> Path:
    """``lit-credit-tests/tiny`` in the HF cache ``cache``, as huggingface_hub lays it out: its snapshot directory."""
    repo = cache / "models--lit-credit-tests--tiny"
    snapshot = save_tiny_model(repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot


@pytest.fixture
def no_hub(monkeypatch):
    """Any call of snapshot_download fails the test: local paths never reach the hub."""
    def refuse(*args, **kwargs):
        raise AssertionError("snapshot_download was called for a local path")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)


def test_a_local_directory_is_used_as_it_is_and_loads(tmp_path, monkeypatch, no_hub):
    model_dir = save_tiny_model(tmp_path / "model")
    assert resolve_model_dir(str(model_dir)) == str(model_dir)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_model_dir("~/model") == str(model_dir)  # ~ expanded
    source = PolicySource(path=str(model_dir))
    assert source.prepare() == str(model_dir)
    model, tok = source.load()
    assert model.config.hidden_size == 32 and tok.pad_token_id is not None


@pytest.mark.parametrize("path", ["/no/such/model", "./models/qwen", "~/no-such-model-dir", "models/org/name"])
def test_a_path_that_looks_local_and_does_not_exist_is_refused_without_asking_the_hub(path, no_hub):
    with pytest.raises(ConfigError, match=rf"^model\.path={path}: no such directory; fix: .*local HF model "
                                          r"directory.*config\.json.*Hugging Face Hub id"):
        PolicySource(path=path).prepare()


def test_a_directory_without_config_json_or_a_file_is_refused(tmp_path, no_hub):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"holds no config\.json"):
        resolve_model_dir(tmp_path / "empty")
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"is a file, not a directory"):
        resolve_model_dir(tmp_path / "weights.bin")


def test_a_hub_id_offline_and_not_cached_names_both_options(offline_cache):
    with pytest.raises(ConfigError) as raised:
        PolicySource(path=MISSING).prepare()
    message = str(raised.value)
    assert message.startswith(f"model.path={MISSING}: no local directory of that name, and as a hub id: "
                              "HF_HUB_OFFLINE=1 and it is not in the HF cache")
    for option in ("a local HF model directory that exists and holds config.json",
                   "a Hugging Face Hub id", "reachable online with HF_HUB_OFFLINE unset", "already in the HF cache"):
        assert option in message
    assert str(offline_cache) in message
    assert list(offline_cache.iterdir()) == []  # nothing downloaded, nothing written
    with pytest.raises(ConfigError, match=rf"^generate_fn\.path={MISSING}: "):  # a judge's or simulator's model
        TextGenerator(MISSING)


def test_an_invalid_name_is_neither_a_directory_nor_a_hub_id(offline_cache):
    with pytest.raises(ConfigError, match=r"^model\.path=not a model!: neither a local directory nor a valid hub id"):
        resolve_model_dir("not a model!")


def test_a_hub_id_in_the_hf_cache_resolves_offline_to_its_snapshot(offline_cache, hub_calls):
    snapshot = cache_tiny_model(offline_cache)
    assert resolve_model_dir("lit-credit-tests/tiny") == str(snapshot)
    source = PolicySource(path="lit-credit-tests/tiny")
    assert source.prepare() == str(snapshot)
    model, _ = source.load()
    expected = LlamaForCausalLM.from_pretrained(snapshot)
    for (name, a), (_, b) in zip(model.state_dict().items(), expected.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    generator = TextGenerator("lit-credit-tests/tiny", max_new_tokens=2)  # judges and simulators resolve alike
    assert isinstance(generator("What is 3 + 4?"), str)
    assert hub_calls == []  # offline: the hub was never asked


def test_online_with_the_hub_unreachable_the_cache_serves_and_a_miss_names_both_options(tmp_path, monkeypatch,
                                                                                       hub_calls):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-hub"))
    snapshot = cache_tiny_model(tmp_path / "hf-hub")
    assert resolve_model_dir("lit-credit-tests/tiny") == str(snapshot)  # as transformers: the cached snapshot
    with pytest.raises(ConfigError, match=rf"^model\.path={MISSING}: .*the hub could not serve it and it is not in "
                                          r"the HF cache.*ConnectError.*fix: .*local HF model directory.*Hub id"):
        resolve_model_dir(MISSING)
    assert hub_calls == ["lit-credit-tests/tiny", MISSING]


def test_the_run_config_check_accepts_a_hub_id(make_cfg):
    cfg = make_cfg("model=hf", "model.path=Qwen/Qwen2.5-0.5B-Instruct", fast_model=False)
    check_config(cfg)  # a hub id is resolved (and refused, when it cannot be) by the policy source, not here
