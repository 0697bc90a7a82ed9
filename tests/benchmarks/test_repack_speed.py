"""benchmarks/repack_speed.py, run as a script: a row per type and shape, a positive time, and the hash of
the bytes the layout's ``repack`` writes for that row's input (what two checkouts are compared by)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "repack_speed.py"


def _script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("repack_speed", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rows_times_and_hashes_of_the_repacked_bytes() -> None:
    from llamapy.ggml.types import GGMLType

    types = ("Q4_1", "Q6_K")
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--types", ",".join(types), "--rounds", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith("Q")]
    rs = _script()
    assert [(t, s) for t, s, *_ in rows] == [(t, f"{n}x{k}") for t in types for n, k in rs.SHAPES]
    for name, shape, ms, gbs, digest in rows:
        assert float(ms) > 0 and float(gbs) > 0
        mod, sbytes, qk = rs.TYPES[name]
        n, k = map(int, shape.split("x"))
        A = np.random.default_rng(n + k).integers(0, 256, (n, k // qk * sbytes), dtype=np.uint8)
        R = importlib.import_module("llamapy.ggml.cpu." + mod).repack(A, GGMLType[name])
        assert digest == hashlib.sha256(R.tobytes()).hexdigest()[:16]
