"""What the rest of llamapy reads of the hub without its download code: the cache directories and the
error a failed fetch raises (Numba's kernel cache and the CLI's error handling need these on every start;
:mod:`.known` and :mod:`.hf` pull in ``subprocess``, ``zipfile``, ``tempfile`` and the rest)."""

from __future__ import annotations

import os
from pathlib import Path


class ModelFetchError(RuntimeError):
    """A known model could not be fetched or failed its checksum."""


def cache_dir() -> Path:
    """``$LLAMAPY_CACHE`` or ``$XDG_CACHE_HOME/llamapy`` or ``~/.cache/llamapy``."""
    env = os.environ.get("LLAMAPY_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "llamapy"


def models_dir() -> Path:
    return cache_dir() / "models"
