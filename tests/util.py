"""Helpers for tests: paths to ../shared (skip outside CI when missing, fail under CI)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
DATA = Path(__file__).resolve().parent / "data"
IN_CI = bool(os.environ.get("CI"))


def shared_path(*parts: str) -> Path:
    """A path under ../shared; skips outside CI when it is missing, fails under CI."""
    p = SHARED.joinpath(*parts)
    if not p.exists():
        if IN_CI:
            pytest.fail(f"{p} is missing (CI must have ../shared)")
        pytest.skip(f"{p} is missing")
    return p
