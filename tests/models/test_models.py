"""The embedded tokenizer, the tiny model, its cache, and the SFT encoding of demonstrations."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from lit_credit.models import EmbeddedPolicy, PolicySource, build_tokenizer, chat_template, token_logprobs
from lit_credit.models.chat import with_tools
from lit_credit.models.logprobs import length_buckets, picked_logprobs_
from lit_credit.models.sft import encode_demonstration
from lit_credit.models.smollm2 import SmolLM2
from lit_credit.rollout import ChatCodec
from lit_credit.tasks import ArithTask
from lit_credit.tasks.tool_catalog import TOOL_PROMPT, TOOLS_INSTRUCTION, tool_signature

CORPUS = ["What is 37 + 45?\n82", "<tool_call>{\"name\": \"get_weather\"}</tool_call> sunny"] * 20


def test_tokenizer_is_deterministic_and_spells_digits():
    a, b = build_tokenizer(CORPUS, 300), build_tokenizer(CORPUS, 300)
    assert a.get_vocab() == b.get_vocab()
    ids = a("1234", add_special_tokens=False)["input_ids"]
    assert a.convert_ids_to_tokens(ids) == ["1", "2", "3", "4"]  # one token per digit


def test_tokenizer_without_digit_split_merges_frequent_digit_runs():
    """With split_digits=False a date the corpus repeats becomes word-like tokens: '2026' (20 times in the
    corpus) is one token, so the date is 5 tokens ('2026', '-', '11', '-', '13') instead of 8 digits and 2
    dashes; the digit-split tokenizer of the same corpus still spells it digit by digit."""
    corpus = ['{"city":"Sydney","date":"2026-11-13"}'] * 20
    merged = build_tokenizer(corpus, 300, split_digits=False)
    ids = merged('2026-11-13', add_special_tokens=False)["input_ids"]
    assert merged.convert_ids_to_tokens(ids) == ["2026", "-", "11", "-", "13"]
    split = build_tokenizer(corpus, 300)
    assert len(split("2026-11-13", add_special_tokens=False)["input_ids"]) == 8 + 2


def test_chat_template_is_hermes_and_tool_tags_survive_decoding():
    tok = build_tokenizer(CORPUS, 300)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<tool_call>{}</tool_call>"},
         {"role": "tool", "content": "{\"t\": 1}"}], tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<tool_call>{}</tool_call><|im_end|>\n"
                    "<|im_start|>user\n<tool_response>\n{\"t\": 1}\n</tool_response><|im_end|>\n"
                    "<|im_start|>assistant\n")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    decoded = tok.decode(ids, skip_special_tokens=True)
    assert "<tool_call>{}</tool_call>" in decoded and "<tool_response>" in decoded and "<|im_end|>" not in decoded
    # The tags are single tokens, so the policy emits them in one step.
    assert len(tok("<tool_call>", add_special_tokens=False)["input_ids"]) == 1


def test_chat_template_lists_tools_as_the_signatures_the_corpus_teaches():
    """With the task's tool prompt the embedded template lists the tools as the tool prompt writes them (one
    signature line each, then its instruction); without one it ignores them."""
    tok = build_tokenizer(CORPUS, 300, tool_prompt=TOOL_PROMPT)
    weather = {"type": "function", "function": {"name": "get_weather", "description": "Weather on a date.",
                                                "parameters": {"type": "object", "properties": {
                                                    "city": {"type": "string"}, "days": {"type": "integer"}}}}}
    bare = {"name": "ping", "parameters": {}}  # no description, no properties, not wrapped in "function"
    assert tool_signature(weather) == "get_weather(city: string, days: integer) - Weather on a date."
    assert tool_signature(bare) == "ping()"
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tools=[weather, bare], tokenize=False)
    assert text == ("<|im_start|>system\n<tools>\nget_weather(city: string, days: integer) - Weather on a date.\n"
                    f"ping()\n</tools>\n{TOOLS_INSTRUCTION}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n")
    assert text.startswith(f"<|im_start|>system\n{TOOL_PROMPT.text([weather, bare])}<|im_end|>\n")
    toolless = build_tokenizer(CORPUS, 300)
    assert toolless.apply_chat_template([{"role": "user", "content": "Hi"}], tools=[weather], tokenize=False) == (
        "<|im_start|>user\nHi<|im_end|>\n")


# A plain ChatML template that ignores ``tools`` (as SmolLM2's does) and renders tool turns as ``tool`` turns.
PLAIN_CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
                "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_tools_reach_a_template_without_tool_support_through_the_system_message():
    """One tool protocol, two routes: the embedded template writes the tools itself, and the same tokenizer
    with PLAIN_CHATML gets them through ``with_tools`` as its system message, written by the codec's tool prompt;
    the prompts are the same ids (the embedded template's tool block is ``<|im_start|>system\n`` +
    ``tool_prompt.text(tools)`` + ``<|im_end|>\n``). On the plain template a conversation built piece by piece
    (prompt, reply, tool turn) equals its rendering of the whole conversation with the tools in the system
    message. A codec without a tool prompt refuses tools the template ignores."""
    weather = {"type": "function", "function": {"name": "get_weather", "description": "Weather on a date.",
                                                "parameters": {"type": "object", "properties": {
                                                    "city": {"type": "string"}}}}}
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    embedded_tok = build_tokenizer(CORPUS, 300, tool_prompt=TOOL_PROMPT)
    plain_tok = build_tokenizer(CORPUS, 300)
    plain_tok.chat_template = PLAIN_CHATML
    embedded, plain = ChatCodec(embedded_tok), ChatCodec(plain_tok, tool_prompt=TOOL_PROMPT)
    assert embedded.template_has_tools and not plain.template_has_tools
    assert plain.prompt_ids(messages, [weather]) == embedded.prompt_ids(messages, [weather])
    reply, tool = "<tool_call>{\"name\": \"get_weather\"}</tool_call>", {"role": "tool", "content": "sunny"}
    pieces = plain.prompt_ids(messages, [weather]) + plain.reply_ids(reply) + plain.feedback_ids([tool])
    conversation = with_tools([*messages, {"role": "assistant", "content": reply}, tool], [weather], TOOL_PROMPT)
    whole = plain_tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    assert pieces == plain_tok(whole, add_special_tokens=False)["input_ids"]
    with pytest.raises(ValueError, match=r"tool_prompt=task\.tool_prompt"):
        ChatCodec(plain_tok).prompt_ids(messages, [weather])


def test_smollm2_refuses_unknown_keys_by_name(tmp_path):
    """Recipe keys of the embedded policy are ignored with a warning; anything else is an error naming it."""
    with pytest.raises(TypeError, match=r"remove model\.embedded\.vocab_sise"):
        SmolLM2(str(tmp_path), vocab_sise=1024)


def test_embedded_policy_builds_once_and_reloads_with_from_pretrained(tmp_path):
    task = ArithTask(max_operand=9, num_test=20)
    embedded = EmbeddedPolicy(task, cache_dir=str(tmp_path), hidden_size=128, num_layers=4, sft_steps=0)
    path = embedded.build()
    stamp = (path / "config.json").stat().st_mtime_ns
    assert embedded.build() == path and (path / "config.json").stat().st_mtime_ns == stamp  # reused
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".building")] == []
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.chat_template == chat_template(task.tool_prompt)  # the task's tool prompt ends the tool list
    assert model.config.model_type == "llama"
    assert model.get_input_embeddings().num_embeddings == len(tok)
    n_params = sum(p.numel() for p in model.parameters())
    assert 0.5e6 < n_params < 1.5e6  # "about 1M parameters"
    # Another recipe is another directory; the same recipe under PolicySource loads the same weights.
    assert EmbeddedPolicy(task, cache_dir=str(tmp_path), sft_steps=1).path != path
    loaded, _ = PolicySource(embedded=embedded).load()
    assert torch.equal(loaded.model.embed_tokens.weight, model.model.embed_tokens.weight)


def test_every_task_is_the_warm_starts_demonstrations_in_lightning_cli():
    """EmbeddedPolicy reads its task as a Demonstrations (the warm start needs no task import); LightningCLI's
    parser takes every task's class_path for it (it checks the Protocol's method signatures), and no other class."""
    from jsonargparse import ArgumentParser

    from lit_credit.interfaces import Demonstrations

    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--task", type=Demonstrations)
    for name in ("ArithTask", "CodeReviseTask", "FormTask", "MathReviseTask", "ToolCallTask"):
        assert parser.parse_args(["--task", f"lit_credit.tasks.{name}"]).task.class_path == f"lit_credit.tasks.{name}"
    with pytest.raises(Exception, match="ToolEnvironment"):
        parser.parse_args(["--task", "lit_credit.tasks.ToolEnvironment"])


def test_sft_encoding_masks_only_assistant_turns():
    tok = build_tokenizer(CORPUS, 300)
    codec = ChatCodec(tok)
    demo = {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A1"},
                         {"role": "tool", "content": "R"}, {"role": "assistant", "content": "A2"}]}
    ids, mask = encode_demonstration(codec, demo)
    prompt = codec.prompt_ids(demo["messages"][:1])
    a1, feedback, a2 = codec.reply_ids("A1"), codec.feedback_ids([demo["messages"][2]]), codec.reply_ids("A2")
    assert ids == prompt + a1 + feedback + a2  # the very pieces a rollout is built from
    assert mask == [0] * len(prompt) + [1] * len(a1) + [0] * len(feedback) + [1] * len(a2)
    assert a1[-1] == tok.eos_token_id and a2[-1] == tok.eos_token_id  # the end of turn is learned


def test_token_logprobs_match_a_manual_log_softmax():
    torch.manual_seed(0)
    tok = build_tokenizer(CORPUS, 300)
    from transformers import LlamaConfig, LlamaForCausalLM
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
    ids = torch.tensor([[5, 9, 11, 3]])
    logp, entropy = token_logprobs(model, ids, torch.ones_like(ids))
    logits = model(input_ids=ids).logits[0]
    expected = [0.0] + [logits[t - 1].log_softmax(-1)[ids[0, t]].item() for t in range(1, 4)]
    torch.testing.assert_close(logp[0], torch.tensor(expected), rtol=1e-5, atol=1e-6)
    p = logits[0].softmax(-1)
    torch.testing.assert_close(entropy[0, 1], -(p * p.log()).sum(), rtol=1e-5, atol=1e-6)
    assert entropy[0, 0] == 0


class FixedLogits(torch.nn.Module):
    """A stand-in LM whose logits at every position are ``ln [1, 2, 4]`` (3-token vocabulary)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, input_ids, attention_mask=None, use_cache=None):
        z = torch.tensor([1.0, 2.0, 4.0]).log() * self.scale
        return SimpleNamespace(logits=z.expand(*input_ids.shape, 3).clone())


def test_token_logprobs_at_a_temperature_by_hand():
    # z = ln [1, 2, 4] at T = 0.5: z / T = ln [1, 4, 16], so pi = [1, 4, 16] / 21 and
    #   logp(token 2) = ln(16/21), logp(token 0) = ln(1/21), logp(token 1) = ln(4/21);
    #   H = -sum pi ln pi = ln 21 - (4 ln 4 + 16 ln 16) / 21 = ln 21 - 72 ln 2 / 21.
    # At T = 1 instead: pi = [1, 2, 4] / 7 (logp(token 2) = ln(4/7)), which the test would see.
    ids, mask = torch.tensor([[1, 2, 0, 1]]), torch.ones(1, 4, dtype=torch.long)
    want = torch.tensor([[0.0, math.log(16 / 21), math.log(1 / 21), math.log(4 / 21)]])
    h = math.log(21) - 72 * math.log(2) / 21
    model = FixedLogits()
    for budget in (None, 2):  # one padded pass, and micro-batches
        logp, entropy = token_logprobs(model, ids, mask, budget, temperature=0.5)  # graph + entropy path
        torch.testing.assert_close(logp, want, rtol=0, atol=1e-6)
        torch.testing.assert_close(entropy, torch.tensor([[0.0, h, h, h]]), rtol=0, atol=1e-6)
        logp.sum().backward()  # the gradient flows through the tempered log-softmax
        assert model.scale.grad is not None and model.scale.grad != 0
        with torch.no_grad():  # reference / old log-probs: divided and consumed in place
            plain, none = token_logprobs(model, ids, mask, budget, entropy=False, temperature=0.5)
        assert none is None
        torch.testing.assert_close(plain, want, rtol=0, atol=1e-6)
    at_one, _ = token_logprobs(model, ids, mask)
    assert abs(at_one[0, 1].item() - math.log(4 / 7)) < 1e-6
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match=r"RolloutBatch\.temperature"):
            token_logprobs(model, ids, mask, temperature=bad)


def tiny_llama_batch() -> tuple[LlamaForCausalLM, torch.Tensor, torch.Tensor]:
    """A 1-layer random Llama (vocabulary 50, seed 0) and 3 right-padded rows of lengths 9, 4, 6."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
    mask = (torch.arange(9) < torch.tensor([9, 4, 6])[:, None]).long()
    return model, torch.randint(1, 50, (3, 9)) * mask, mask


def test_token_logprobs_at_a_temperature_match_a_manual_tempered_log_softmax():
    model, ids, mask = tiny_llama_batch()
    with torch.no_grad():
        z = model(input_ids=ids, attention_mask=mask).logits[:, :-1] / 0.5
    # position t holds log softmax(z[t - 1])[ids[t]] on real tokens, 0 at t = 0 and on padding
    want = F.pad(z.log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1), (1, 0)) * mask
    p = z.softmax(-1)
    want_h = F.pad(-(p * p.log()).sum(-1), (1, 0)) * mask
    logp, entropy = token_logprobs(model, ids, mask, token_budget=16, temperature=0.5)
    torch.testing.assert_close(logp.detach(), want, rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy, want_h, rtol=0, atol=1e-5)
    with torch.no_grad():
        plain, _ = token_logprobs(model, ids, mask, token_budget=16, entropy=False, temperature=0.5)
        at_one, _ = token_logprobs(model, ids, mask, token_budget=16, entropy=False)
    torch.testing.assert_close(plain, want, rtol=0, atol=1e-5)
    assert ((at_one - want).abs() * mask).amax() > 0.1  # T = 1 is a different distribution


def test_logprobs_without_gradient_or_entropy_consume_the_logits_in_place_and_agree():
    # reference / old-policy log-probs: no graph, no entropy -> z[token] - logsumexp(z) taken in place
    model, ids, mask = tiny_llama_batch()
    with_grad, entropy = token_logprobs(model, ids, mask, token_budget=16)
    with torch.no_grad():
        plain, none = token_logprobs(model, ids, mask, token_budget=16, entropy=False)
    assert none is None and entropy is not None and not plain.requires_grad
    torch.testing.assert_close(plain, with_grad.detach(), rtol=0, atol=1e-6)
    # the in-place helper runs the same operations as torch.logsumexp: bitwise equal, logits overwritten
    z = torch.randn(2, 3, 50) * 4
    tokens = torch.randint(0, 50, (2, 3))
    want = z.gather(-1, tokens[..., None]).squeeze(-1) - z.logsumexp(-1)
    consumed = z.clone()
    assert torch.equal(picked_logprobs_(consumed, tokens), want) and not torch.equal(consumed, z)


def test_text_generator_is_greedy_decoding_of_a_local_model_and_drives_an_llm_judge(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from lit_credit.rewards import LLMJudge
    from lit_credit.rollout import TextGenerator

    tok = build_tokenizer(CORPUS, 300)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, pad_token_id=tok.pad_token_id,
                                 eos_token_id=tok.eos_token_id)).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    generator = TextGenerator(str(tmp_path), max_new_tokens=6)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}], add_generation_prompt=True,
                                  tokenize=False)
    ids = torch.tensor([tok(ids, add_special_tokens=False)["input_ids"]])
    expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                              pad_token_id=tok.pad_token_id)[0, ids.shape[1]:]
    assert generator("What is 3 + 4?") == tok.decode(expected, skip_special_tokens=True)
    # A random model never writes <rating>N</rating>: every try fails, 1 + max_retries calls, one failure.
    judge = LLMJudge(generator, max_retries=2, backoff=0)
    result = judge("Weather in Oslo?", ['{"temp_c": 3}'], "It is 3 C in Oslo today.")
    assert (result.failed, result.score, judge.calls, judge.failures) == (True, 0.0, 3, 1)


def test_length_buckets_hand_table():
    # lengths 3, 7, 5, 1 (right padding); budget 10 tokens. Sorted longest first: rows 1 (7), 2 (5), 0 (3), 3 (1).
    # Bucket 1 starts at width 7: 10 // 7 = 1 row. Bucket 2 at width 5: 10 // 5 = 2 rows (2, 0).
    # Bucket 3 at width 1: row 3. A row longer than the budget still gets a bucket of its own.
    mask = (torch.arange(8) < torch.tensor([3, 7, 5, 1])[:, None]).long()
    got = [(rows.tolist(), width) for rows, width in length_buckets(mask, 10)]
    assert got == [([1], 7), ([2, 0], 5), ([3], 1)]
    assert [(rows.tolist(), width) for rows, width in length_buckets(mask, 4)] == [([1], 7), ([2], 5), ([0], 3), ([3], 1)]
    # A budget of 100 fits every row, but a bucket of width w takes no row shorter than w / 2: (7, 5), (3), (1).
    assert [(rows.tolist(), width) for rows, width in length_buckets(mask, 100)] == [([1, 2], 7), ([0], 3), ([3], 1)]


def test_padding_free_logprobs_and_gradients_equal_the_padded_pass():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2)
    model = LlamaForCausalLM(config)
    lengths = torch.tensor([5, 40, 12, 3, 40, 21])
    mask = (torch.arange(40) < lengths[:, None]).long()
    ids = torch.randint(1, 50, (6, 40)) * mask
    grads = []
    for budget in (None, 48):  # buckets: (40), (40), (21, 12) at width 21, (5, 3) at width 5 (5 / 2 <= 3)
        model.zero_grad()
        logp, entropy = token_logprobs(model, ids, mask, token_budget=budget)
        (logp * mask).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        if budget is None:
            reference = (logp * mask, entropy * mask)
        else:
            assert torch.allclose(logp, reference[0], atol=1e-5) and torch.allclose(entropy, reference[1], atol=1e-5)
            assert (logp[mask == 0] == 0).all()  # padding stays 0
    assert torch.allclose(grads[0], grads[1], atol=1e-5)
