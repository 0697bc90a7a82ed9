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


def test_numba_imported_first_still_caches_in_the_digest_dir(tmp_path: Path) -> None:
    """A program that imports Numba before llamapy (Numba has read its configuration by then): llamapy's
    kernels are still cached under the digest's directory, not beside their sources."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["LLAMAPY_CACHE"] = str(tmp_path)
    code = (
        "import numba\n"
        "assert not numba.config.CACHE_DIR\n"
        "import numpy as np, llamapy._numba as n\n"
        "from llamapy.ggml.cpu.op_kernels import check_ids\n"
        "check_ids(np.zeros(3, np.int32), 10)\n"
        "print(numba.config.CACHE_DIR); print(n.kernel_sources_digest())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    cache, digest = out.stdout.split()
    assert Path(cache) == tmp_path / "numba" / digest
    assert any(p.name.startswith("op_kernels.check_ids") for p in Path(cache).rglob("*.nbi"))


def test_user_cache_dir_is_kept(tmp_path: Path) -> None:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "mine"))
    code = "import os, llamapy._numba; print(os.environ['NUMBA_CACHE_DIR'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(tmp_path / "mine")


def test_cached_kernels_have_a_stable_index_key() -> None:
    """Numba keys a cached kernel by its signature and a pickle of its closure: a dispatcher or an
    ExternalFunction in the closure pickles differently in each process, so the kernel recompiled in
    every process (blas._attn did: seconds on a server's first prompt). Two processes must agree."""
    code = (
        "import hashlib, llamapy.ggml.cpu.blas as b\n"
        "from numba.core.serialize import dumps\n"
        "ks = [k for k in (b._kernel, b._attn_kernel) if k is not None]\n"
        "print([hashlib.sha256(dumps(tuple(c.cell_contents for c in (k.py_func.__closure__ or ())))).hexdigest()"
        " for k in ks])\n"
    )
    outs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        for _ in range(2)
    ]
    assert outs[0] == outs[1]


def test_numba_blas_probe_skips_scipy_linalg() -> None:
    """Numba's import-time BLAS probe (np.correlate) no longer imports scipy.linalg (0.2-0.3 s of each
    start-up); np.dot in jitted code still works."""
    code = (
        "import sys, numpy as np, llamapy._numba\n"
        "import numba.np.arraymath\n"
        "print('scipy.linalg' in sys.modules)\n"
        "from numba import njit\n"
        "print(njit(lambda a: np.dot(a, a))(np.ones(3)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "3.0"]
