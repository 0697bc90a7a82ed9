"""Kernel code run in a fresh interpreter compiled for Numba's ``generic`` CPU: no AVX2 or F16C, so the
kernels' generic IR (``isimd``'s widen-multiply-adds, ``x8simd``'s integer half conversion) is what runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_on_generic_target(code: str, timeout: int = 600, cwd: Path | None = None) -> None:
    """Run ``code`` with ``NUMBA_CPU_NAME=generic``; it must exit 0 having printed ``ok``."""
    env = dict(os.environ, NUMBA_CPU_NAME="generic")
    env.pop("NUMBA_CPU_FEATURES", None)  # e.g. haswell's +avx2 would undo "generic"
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
