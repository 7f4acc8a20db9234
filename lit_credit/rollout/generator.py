"""A frozen model (a local directory or a hub id) as a text function, for LLM summary judges and LLM tool simulators."""
from __future__ import annotations

from lit_credit.models.chat import ChatCodec
from lit_credit.models.hub import resolve_model_dir
from lit_credit.models.policy import PolicySource
from lit_credit.rollout.engine import HFEngine, RolloutEngine
from lit_credit.types import SamplingParams


class TextGenerator:
    """``generator(prompt) -> text``: greedy decoding of a frozen HF causal LM.

    ``path`` (``generate_fn.path``) is a local model directory or a hub id, resolved as ``model.path`` is
    (:func:`~lit_credit.models.hub.resolve_model_dir`: downloaded once into the HF cache, only the cache with
    ``HF_HUB_OFFLINE=1``); ``engine`` any :class:`RolloutEngine`
    (default :class:`HFEngine`; ``VLLMEngine()`` for vLLM). The prompt is sent as one user message through
    the tokenizer's chat template; the reply is cut at ``max_new_tokens``. The model is frozen and never
    receives policy weights.
    """

    def __init__(self, path: str, engine: RolloutEngine | None = None, max_new_tokens: int = 256,
                 dtype: str = "float32") -> None:
        path = resolve_model_dir(path, "generate_fn.path")
        model, tokenizer = PolicySource(path=path, dtype=dtype).load(trainable=False)
        model.eval().requires_grad_(False)
        self.engine = engine if engine is not None else HFEngine()
        self.engine.bind(model, tokenizer)
        self.codec = ChatCodec(tokenizer)
        self.sampling = SamplingParams(n=1, greedy=True, max_new_tokens=max_new_tokens)

    def __call__(self, prompt: str) -> str:
        ids = self.codec.prompt_ids([{"role": "user", "content": prompt}])
        return self.engine.generate([ids], self.sampling)[0][0].text
