from lit_credit.models.chat import ChatCodec
from lit_credit.models.embedded import EmbeddedPolicy
from lit_credit.models.logprobs import token_logprobs
from lit_credit.models.policy import PolicySource
from lit_credit.models.sft import SFTModule
from lit_credit.models.tokenizer import build_tokenizer, chat_template

__all__ = ["ChatCodec", "EmbeddedPolicy", "PolicySource", "SFTModule", "build_tokenizer", "chat_template",
           "token_logprobs"]
