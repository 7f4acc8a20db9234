from lit_credit.models.chat import ChatCodec
from lit_credit.models.embedded import EmbeddedPolicy
from lit_credit.models.logprobs import token_logprobs
from lit_credit.models.policy import PolicySource
from lit_credit.models.sft import SFTModule
from lit_credit.models.tokenizer import CHAT_TEMPLATE, build_tokenizer

__all__ = ["CHAT_TEMPLATE", "ChatCodec", "EmbeddedPolicy", "PolicySource", "SFTModule", "build_tokenizer",
           "token_logprobs"]
