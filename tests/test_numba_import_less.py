"""llamapy._numba's cache loads without Numba's library imports: a cached kernel's environment of a Numba
module not yet imported is filled when the module is imported, arrays type as Numba types them without
importing numpy.ma, and a later compile or a MaskedArray argument behaves as in plain Numba."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

KERNEL = """
import numpy as np
from llamapy._numba import njit

@njit(cache=True)
def scaled(x, s):
    out = np.empty_like(x)  # helpers inlined from numba.np.arrayobj: their environments are cached
    for i in range(x.shape[0]):
        out[i] = x[i] * s
    return out
"""

CHECK = """
import sys, numpy as np
import llamapy._numba
import numba
import kern
print(kern.scaled(np.arange(4.0), 2.0).tolist())
print(sorted(m for m in ('numba.np.arrayobj', 'numpy.ma') if m in sys.modules))
from numba.core.environment import Environment
lazy = [e for e in list(Environment._memo.values()) if e.globals.get('__name__') == 'numba.np.arrayobj']
print(len(lazy) > 0 and all(len(e.globals) == 1 for e in lazy))
a = np.zeros((3, 4), dtype=np.float32)
ro = np.zeros(5)
ro.flags.writeable = False
cases = [a, a.T, a[:, ::2], ro, np.zeros((2, 2, 2), dtype=np.int8)]
before = [numba.typeof(x) for x in cases]
import numba.np.arrayobj as ao
print(all(e.globals['make_array'] is ao.make_array for e in lazy))
import numpy.ma
print(before == [numba.typeof(x) for x in cases], [str(t) for t in before[:2]])
try:
    kern.scaled(np.ma.masked_array(np.arange(3.0)), 1.0)
    print('masked accepted')
except numba.core.errors.TypingError:
    print('masked refused')
print(kern.scaled(np.arange(3, dtype=np.int64), 3).tolist())  # a new signature: a compile
"""


def _run(tmp: Path, **env: str) -> list[str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("LLAMAPY_NUMBA")}
    e.update(NUMBA_CACHE_DIR=str(tmp / "cache"), PYTHONPATH=os.pathsep.join([str(tmp), *sys.path]), **env)
    out = subprocess.run([sys.executable, "-c", CHECK], env=e, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_cache_load_defers_numba_library_imports(tmp_path: Path) -> None:
    (tmp_path / "kern.py").write_text(KERNEL)
    _run(tmp_path)  # compiles and writes the cache
    assert _run(tmp_path) == [
        "[0.0, 2.0, 4.0, 6.0]",
        "[]",  # neither numba.np.arrayobj nor numpy.ma
        "True",  # the environments wait for their module
        "True",  # and hold its globals once it is imported
        "True ['array(float32, 2d, C)', 'array(float32, 2d, F)']",
        "masked accepted",  # as plain Numba (its dispatcher types an ndarray subclass by its C typecode)
        "[0, 3, 6]",
    ]


def test_plain_numba_imports_as_before(tmp_path: Path) -> None:
    (tmp_path / "kern.py").write_text(KERNEL)
    _run(tmp_path)
    out = _run(tmp_path, LLAMAPY_NUMBA_PLAIN="1")
    assert out[:2] == ["[0.0, 2.0, 4.0, 6.0]", "['numba.np.arrayobj', 'numpy.ma']"]
    assert out[-2:] == ["masked accepted", "[0, 3, 6]"]
