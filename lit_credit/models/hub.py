"""Where ``model.path`` points: a local HF model directory, or a Hugging Face Hub id, as transformers resolves it.

:func:`resolve_model_dir` is the one place a model path is resolved; every loader reads the directory it returns
(:class:`~lit_credit.models.PolicySource`, and through it :class:`~lit_credit.rollout.TextGenerator`'s judges and
simulators). The vLLM engine reads no model path: it is built from the loaded policy's own config and tokenizer
and receives the trainer's weights, so engine and trainer read the same files.
"""
from __future__ import annotations

import os
from pathlib import Path

# The files ``from_pretrained`` reads for a causal LM and its tokenizer, at the repository's root: configs, the
# tokenizer (tokenizer.json, vocab.json, merges.txt, tokenizer.model, chat_template.jinja, ...) and safetensors
# weights; ``*.bin`` weights only where a repository has no safetensors. Subfolders (ONNX, GGUF, ``original/``)
# and other weight formats are not downloaded.
HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja"]
_TRUE = {"1", "ON", "YES", "TRUE"}


def hub_offline() -> bool:
    """Whether the hub is off limits: ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) set true, read now and as
    huggingface_hub read it when imported."""
    from huggingface_hub import constants

    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return constants.HF_HUB_OFFLINE or value.upper() in _TRUE


def _looks_local(path: str) -> bool:
    """A filesystem path rather than a hub id (``name`` or ``namespace/name``)."""
    return path.startswith(("/", ".", "~")) or "\\" in path or path.count("/") > 1


def _both_options(field: str, path: str, problem: str) -> ValueError:
    from lit_credit.config import ConfigError

    return ConfigError(
        f"{field}={path}: {problem}; fix: give either a local HF model directory that exists and holds config.json "
        f"({field}=/path/to/model), or a Hugging Face Hub id ({field}=Qwen/Qwen2.5-0.5B-Instruct) that is reachable "
        "online with HF_HUB_OFFLINE unset (downloaded once into the HF cache, HF_HUB_CACHE) or already in the HF cache "
        "(then HF_HUB_OFFLINE=1 reads it there)")


def resolve_model_dir(path: str | os.PathLike, field: str = "model.path") -> str:
    """The local directory holding ``path``'s model, as transformers resolves a name:

    * a local directory (``~`` expanded) is used as it is, when it holds ``config.json``;
    * otherwise ``path`` is a hub id (``namespace/name``): its snapshot directory in the HF cache
      (``HF_HUB_CACHE``), downloaded there by huggingface_hub first when missing or stale (only :data:`HUB_FILES`),
      unless ``HF_HUB_OFFLINE=1``, where only the cache is read and nothing is downloaded;
    * when neither works (a path that looks local, ``/ . ~``, and does not exist; a hub id that cannot be
      reached and is not cached), a :class:`~lit_credit.config.ConfigError` names ``field`` and both options.

    Several processes: each calls this; huggingface_hub's per-file locks (``HF_HUB_CACHE/.locks``) let one of
    them download a file while the others wait for it and then find it cached, so every file is downloaded once.
    """
    text = str(path)
    local = Path(text).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise _both_options(field, text, f"the directory {local} holds no config.json (not an HF model "
                                "directory)")
        return str(local)
    if local.exists() or _looks_local(text):
        raise _both_options(field, text, "no such directory" if not local.exists() else f"{local} is a file, "
                            "not a directory")
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(text)
    except ValueError as err:
        raise _both_options(field, text, f"neither a local directory nor a valid hub id ({err})") from err
    offline = hub_offline()
    cache = os.environ.get("HF_HUB_CACHE") or None  # read now; None: huggingface_hub's default
    try:
        snapshot = snapshot_download(text, cache_dir=cache, local_files_only=offline, allow_patterns=HUB_FILES,
                                     ignore_patterns=["*/*"])
        if not offline and not any(Path(snapshot).glob("*.safetensors")):
            snapshot = snapshot_download(text, cache_dir=cache, allow_patterns=[*HUB_FILES, "*.bin"],
                                         ignore_patterns=["*/*"])
    except Exception as err:  # every hub failure (offline miss, 404, gated, network) becomes one error
        from huggingface_hub import constants

        why = ("HF_HUB_OFFLINE=1 and it is not in the HF cache" if offline
               else "the hub could not serve it and it is not in the HF cache")
        first = str(err).splitlines()[0] if str(err) else ""
        raise _both_options(field, text, f"no local directory of that name, and as a hub id: {why} "
                            f"({cache or constants.HF_HUB_CACHE}; {type(err).__name__}: {first})") from err
    if not (Path(snapshot) / "config.json").is_file():
        raise _both_options(field, text, f"the hub id's snapshot {snapshot} holds no config.json (not a "
                            "transformers model)")
    return snapshot
