"""The default Numba cache directory is keyed by the kernel sources (llamapy._numba)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_default_cache_dir_is_per_kernel_sources(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["LLAMAPY_CACHE"] = str(tmp_path)
    code = "import os, llamapy._numba as n; print(os.environ['NUMBA_CACHE_DIR']); print(n.kernel_sources_digest())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    cache, digest = out.stdout.split()
    assert Path(cache) == tmp_path / "numba" / digest
    assert len(digest) == 16


def test_user_cache_dir_is_kept(tmp_path: Path) -> None:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "mine"))
    code = "import os, llamapy._numba; print(os.environ['NUMBA_CACHE_DIR'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(tmp_path / "mine")
