"""Token pieces of a conversation, shared by the rollout loop and SFT so both see identical tokens.

A conversation is ``prompt_ids + reply_ids + feedback_ids + reply_ids + ...``: the prompt ends with the
assistant header, every reply ends with the end-of-turn token, and every feedback piece closes the line and
opens the next assistant header.
"""
from __future__ import annotations

from typing import Any


class ChatCodec:
    """Tokenises conversation pieces. ``max_feedback_tokens`` caps the content of each injected message
    (a tool response, verifier feedback) at that many tokens, marked ``...[truncated]``; None: no cap."""

    def __init__(self, tokenizer: Any, max_feedback_tokens: int | None = None) -> None:
        self.tokenizer, self.max_feedback_tokens = tokenizer, max_feedback_tokens
        self.eos_id: int = tokenizer.eos_token_id
        self.pad_id: int = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prompt_ids(self, messages: list[dict[str, str]], tools: list[dict] | None = None) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                  add_generation_prompt=True)
        return self._encode(text)

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
        messages = [{**m, "content": self._truncate(m["content"])} for m in messages]
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self._encode(("" if reply_closed else self.tokenizer.eos_token) + "\n" + text)

    def decode_reply(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
