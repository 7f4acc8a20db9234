"""The embedded tokenizer: byte-level BPE trained locally on the task corpora, with a Hermes chat template."""
from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from lit_credit.interfaces import ToolPrompt

PAD, BOS_TURN, EOS_TURN = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, BOS_TURN, EOS_TURN]
# Structural tags stay in decoded text (skip_special_tokens never removes them), as in Qwen/Hermes.
TAG_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

# Hermes / Qwen2.5 layout. A "tool" message is rendered as a user turn holding a <tool_response> block.
# Tools are listed as one-line signatures (``name(arg: type, ...) - description``), not JSON schemas: a tiny
# policy reads every prompt's tools, and the signature says the same in a third of the tokens.
_TOOL_LIST = (
    "{% if tools %}<|im_start|>system\n<tools>\n"
    "{% for tool in tools %}{% set fn = tool.function if tool.function is defined else tool %}"
    "{{ fn.name }}("
    "{% if fn.parameters is defined and fn.parameters.properties is defined %}"
    "{% for key, spec in fn.parameters.properties.items() %}{{ key }}: {{ spec.type }}"
    "{% if not loop.last %}, {% endif %}{% endfor %}{% endif %})"
    "{% if fn.description %} - {{ fn.description }}{% endif %}{{ '\\n' }}{% endfor %}"
    "</tools>\n"
)
_MESSAGES = (
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ message['content'] }}\n</tool_response><|im_end|>\n"
    "{% else %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chat_template(tool_prompt: ToolPrompt | None) -> str:
    """The embedded chat template (Hermes / Qwen2.5 layout). With ``tool_prompt`` (the task's) a prompt's tools
    are a system message: ``<tools>``, one signature line per tool, ``</tools>``, then
    ``tool_prompt.instruction``, the text the task's ``tool_prompt.text(tools)`` writes; without one the template
    ignores ``tools`` (a :class:`~lit_credit.models.ChatCodec` with a tool prompt then writes them itself)."""
    if tool_prompt is None:
        return _MESSAGES
    return _TOOL_LIST + tool_prompt.instruction + "<|im_end|>\n{% endif %}" + _MESSAGES


def build_tokenizer(corpus: Iterable[str], vocab_size: int = 512, split_digits: bool = True,
                    tool_prompt: ToolPrompt | None = None) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``corpus`` (deterministic for a fixed corpus order), with the embedded chat
    template (:func:`chat_template` of ``tool_prompt``, the task's: the embedded policy passes it).

    With ``split_digits`` numbers are spelled digit by digit (arithmetic); without it frequent digit runs
    merge like words, so a date such as ``2026-11-13`` takes a few tokens instead of ten. Every byte is in the
    alphabet, so no text is ever out of vocabulary.
    """
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                         if split_digits else byte_level)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TURN,
        pad_token=PAD,
        unk_token=None,
        padding_side="left",
        chat_template=chat_template(tool_prompt),
        additional_special_tokens=[BOS_TURN],
    )
    fast.add_tokens(TAG_TOKENS)  # non-special: kept when decoding with skip_special_tokens=True
    return fast
