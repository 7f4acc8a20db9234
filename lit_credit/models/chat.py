"""Token pieces of a conversation, shared by the rollout loop and SFT so both see identical tokens.

A conversation is ``prompt_ids + reply_ids + feedback_ids + reply_ids + ...``: the prompt ends with the
assistant header, every reply ends with the end-of-turn token, and every feedback piece is what the chat
template writes after that token up to the next assistant header. Concatenated, the pieces are the chat
template's own rendering of the whole conversation (``tests/models/test_smollm2.py`` checks it on a real
template): a template's default system prompt is not repeated at a turn boundary, and a template without
tool support gets the tools in its system message, as the task's tool prompt writes them (:func:`with_tools`).
"""
from __future__ import annotations

from typing import Any

from lit_credit.interfaces import ToolPrompt

_SENTINEL = "\x00reply\x00"  # an assistant content no template writes itself, to find where a reply ends
# A tool to render a probe with: a template has tool support iff passing it changes the rendering.
_PROBE_TOOL = {"type": "function", "function": {"name": "probe", "description": "A probe.", "parameters": {
    "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}


def with_tools(messages: list[dict[str, str]], tools: list[dict], tool_prompt: ToolPrompt) -> list[dict[str, str]]:
    """``messages`` with ``tool_prompt.text(tools)`` as the system message, for a chat template that ignores
    ``tools`` (SmolLM2's ChatML): first, or after an existing system message's content."""
    text = tool_prompt.text(tools)
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": messages[0]["content"] + "\n\n" + text}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


class ChatCodec:
    """Tokenises conversation pieces. ``max_feedback_tokens`` caps the content of each injected message
    (a tool response, verifier feedback) at that many tokens, marked ``...[truncated]``; None: no cap.
    ``tool_prompt`` (the task's :attr:`~lit_credit.tasks.Task.tool_prompt`) writes a prompt's tools into its
    system message where the chat template ignores ``tools`` (:func:`with_tools`); a template that lists tools
    itself (the embedded one) does not need it."""

    def __init__(self, tokenizer: Any, max_feedback_tokens: int | None = None,
                 tool_prompt: ToolPrompt | None = None) -> None:
        self.tokenizer, self.max_feedback_tokens, self.tool_prompt = tokenizer, max_feedback_tokens, tool_prompt
        self.eos_id: int = tokenizer.eos_token_id
        self.pad_id: int = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        probe = [{"role": "user", "content": "u"}]
        self.template_has_tools = self._render(probe, tools=[_PROBE_TOOL]) != self._render(probe)
        self._base = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                      {"role": "assistant", "content": _SENTINEL}]
        head = self._render(self._base)
        self._head, self._base_len = head, len(head)
        self._after_reply = head[head.rindex(_SENTINEL) + len(_SENTINEL):]
        if not self._after_reply.startswith(tokenizer.eos_token):
            raise ValueError(f"the chat template ends an assistant turn with {self._after_reply!r}, not with the "
                             f"tokenizer's eos_token {tokenizer.eos_token!r}: set the tokenizer's eos_token to "
                             "the template's end-of-turn token")

    def _render(self, messages: list[dict[str, str]], generation_prompt: bool = False, tools: Any = None) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                  add_generation_prompt=generation_prompt)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prompt_ids(self, messages: list[dict[str, str]], tools: list[dict] | None = None) -> list[int]:
        if tools and not self.template_has_tools:
            if self.tool_prompt is None:
                raise ValueError("the chat template ignores tools and the codec has no tool prompt to write them "
                                 "with: ChatCodec(tokenizer, tool_prompt=task.tool_prompt)")
            return self._encode(self._render(with_tools(messages, tools, self.tool_prompt), generation_prompt=True))
        return self._encode(self._render(messages, generation_prompt=True, tools=tools))

    def reply_ids(self, text: str) -> list[int]:
        return [*self._encode(text), self.eos_id]

    def line_ids(self, text: str) -> list[int]:
        """``text`` and a newline, no end of turn: a line the reply goes on after (DPA's SAC decision line,
        which its challenge line follows)."""
        return self._encode(text + "\n")

    def _truncate(self, content: str) -> str:
        ids = self._encode(content)
        if self.max_feedback_tokens is None or len(ids) <= self.max_feedback_tokens:
            return content
        return self.tokenizer.decode(ids[: self.max_feedback_tokens]) + "...[truncated]"

    def feedback_ids(self, messages: list[dict[str, str]], reply_closed: bool = True) -> list[int]:
        """What the template writes after a reply, then ``messages`` and the next assistant header: the
        rendering of ``base + messages`` past that of ``base`` (a fixed system, user, assistant exchange), so
        nothing the template writes only at a conversation's start (a default system prompt) comes in. A reply
        that did not end with the end-of-turn token (cut at max_new_tokens) gets it here, unmasked."""
        messages = [{**m, "content": self._truncate(m["content"])} for m in messages]
        full = self._render(self._base + messages, generation_prompt=True)
        if full[: self._base_len] != self._head:
            raise ValueError("the chat template renders the start of a conversation differently once more "
                             "messages follow; the rollout loop needs each turn's text to stay as rendered")
        after = self._after_reply[len(self.tokenizer.eos_token):] if reply_closed else self._after_reply
        return self._encode(after + full[self._base_len:])
