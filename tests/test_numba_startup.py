"""Start-up shortcuts of llamapy._numba: a cached kernel loads without Numba's registry refresh, and the
runtime's (NRT) object code comes from the cache directory instead of being compiled in each process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.util import run_with_numba_cache

KERNEL = """
import numpy as np
from llamapy._numba import njit

@njit(cache=True)
def cumsum_copy(x):
    out = np.empty_like(x)  # an NRT allocation
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i]
        out[i] = s
    return out
"""

CALL = """
import sys, numpy as np
import llamapy._numba
from numba.core.runtime import nrtdynmod
made = []
orig = nrtdynmod.create_nrt_module
nrtdynmod.create_nrt_module = lambda ctx: made.append(1) or orig(ctx)
import kern
print(kern.cumsum_copy(np.arange(5.0)).tolist())
print('cffi' if 'numba.core.typing.cffi_utils' in sys.modules else 'no-cffi')
print('nrt-compiled' if made else 'nrt-cached')
print('scipy' if 'scipy' in sys.modules else 'no-scipy')
from numba import njit
print(njit(lambda n: np.ones(n).sum())(4))  # a fresh compile links against the cached runtime
"""


def _run(tmp: Path, code: str = CALL, **env: str) -> list[str]:
    return run_with_numba_cache(tmp, code, **env)[:5]


def test_cached_kernel_and_runtime_load_without_compiling(tmp_path: Path) -> None:
    (tmp_path / "kern.py").write_text(KERNEL)
    first = _run(tmp_path)  # compiles the kernel and the runtime, writes both to the cache
    assert first[0] == "[0.0, 1.0, 3.0, 6.0, 10.0]" and first[2] == "nrt-compiled"
    assert list((tmp_path / "cache").glob("llamapy-nrt-*.pkl"))
    again = _run(tmp_path)
    assert again == ["[0.0, 1.0, 3.0, 6.0, 10.0]", "no-cffi", "nrt-cached", "no-scipy", "4.0"]


def test_numba_refresh_env_keeps_numba_s_own_path(tmp_path: Path) -> None:
    (tmp_path / "kern.py").write_text(KERNEL)
    _run(tmp_path)
    out = _run(tmp_path, LLAMAPY_NUMBA_PLAIN="1")
    assert out == ["[0.0, 1.0, 3.0, 6.0, 10.0]", "cffi", "nrt-compiled", "scipy", "4.0"]


def test_unreadable_runtime_cache_falls_back_to_compiling(tmp_path: Path) -> None:
    (tmp_path / "kern.py").write_text(KERNEL)
    _run(tmp_path)
    for f in (tmp_path / "cache").glob("llamapy-nrt-*.pkl"):
        f.write_bytes(b"not a pickle")
    out = _run(tmp_path)
    assert out[0] == "[0.0, 1.0, 3.0, 6.0, 10.0]" and out[2] == "nrt-compiled" and out[4] == "4.0"


LINK = """
import sys, numpy as np
import llamapy._numba as ln
import llvmlite.binding as ll
parsed = []
orig = ll.parse_bitcode
ll.parse_bitcode = lambda b: parsed.append(1) or orig(b)
import kern
print(kern.cumsum_copy(np.arange(5.0)).tolist())
print(f'parsed {len(parsed)}')  # the cached kernel's linking bitcode stays unparsed
released = ln.release_compiler_pages()
print('released' if released > 0 or not sys.platform.startswith('linux') else 'kept')
from numba import njit
twice = njit(lambda x: kern.cumsum_copy(x) * 2.0)  # a fresh compile links the cached kernel in
print(twice(np.arange(4.0)).tolist(), 'linked' if parsed else 'not-linked')
print(kern.cumsum_copy(np.ones(3)).tolist())
"""


def test_cached_kernel_links_lazily_and_compiler_pages_come_back(tmp_path: Path) -> None:
    (tmp_path / "kern.py").write_text(KERNEL)
    _run(tmp_path)  # writes the cache
    assert _run(tmp_path, LINK) == [
        "[0.0, 1.0, 3.0, 6.0, 10.0]",
        "parsed 0",
        "released",
        "[0.0, 2.0, 6.0, 12.0] linked",
        "[1.0, 2.0, 3.0]",
    ]


def _mapping(span: str, perms: str, path: str, anonymous: int, flags: bool = True) -> str:
    lines = [f"{span} {perms} 00000000 fe:00 1234                       {path}", "Size:               8 kB"]
    lines += ["Rss:                4 kB", f"Anonymous:          {anonymous} kB", "KSM:                0 kB"]
    if flags:
        lines.append("VmFlags: rd mr mw me ")
    return "\n".join(lines) + "\n"


def test_clean_read_only_spans_of_a_library() -> None:
    """Only the library's own read-only mappings without a copied-on-write page: not a writable one, not
    one holding anonymous pages (relocated data), not another file under a directory of that name, not
    one whose block has no VmFlags line to end it."""
    from llamapy._numba_startup import _clean_read_only_spans

    lib = "/x/llvmlite/binding/libllvmlite.so"
    text = "".join(
        [
            _mapping("7f0000000000-7f0000002000", "r--p", lib, 0),
            _mapping("7f0000002000-7f0000006000", "r-xp", lib, 0),
            _mapping("7f0000006000-7f0000007000", "r--p", lib, 4),  # RELRO: relocated, copied on write
            _mapping("7f0000007000-7f0000008000", "rw-p", lib, 0),
            _mapping("7f0000008000-7f0000009000", "r--p", "/x/libllvmlite/other.so", 0),
            _mapping("7f0000009000-7f000000a000", "r--p", "/x/libc.so.6", 0),
            _mapping("7f000000a000-7f000000b000", "r--p", lib + " (deleted)", 0),
            _mapping("7f000000b000-7f000000c000", "r--p", lib, 0, flags=False),
        ]
    )
    assert _clean_read_only_spans(text, "libllvmlite") == [
        (0x7F0000000000, 0x7F0000002000),
        (0x7F0000002000, 0x7F0000006000),
        (0x7F000000A000, 0x7F000000B000),
    ]
    assert _clean_read_only_spans("", "libllvmlite") == []


def test_cache_loads_without_llvm_lock_callbacks() -> None:
    """While a cached kernel loads, llvmlite's lock runs no callbacks (Numba's timer events); they are
    back afterwards, once, after nested loads too, and a callback added meanwhile stays."""
    import llamapy._numba  # noqa: F401
    from llamapy._numba_startup import _llvm_lock, _quiet_llvm_lock

    lock = _llvm_lock()
    assert lock is not None and lock._cblist  # Numba's two event callbacks
    before = list(lock._cblist)
    with _quiet_llvm_lock():
        assert lock._cblist == []
        with _quiet_llvm_lock():
            assert lock._cblist == []
        assert lock._cblist == []
        extra = (lambda: None, lambda: None)
        lock._cblist.append(extra)
    assert lock._cblist == [*before, extra]
    lock._cblist.remove(extra)
    assert lock._cblist == before


PARALLEL = """
import sys, numpy as np
from llamapy._numba import njit, prange

@njit(parallel=True)
def total(x):
    s = 0.0
    for i in prange(x.shape[0]):
        s += x[i]
    return s

print(total(np.arange(1000.0)))
from numba.np.ufunc import parallel
print(type(parallel._backend_init_process_lock).__module__, 'multiprocessing' in sys.modules)
"""


def test_threading_layer_starts_without_multiprocessing(tmp_path: Path) -> None:
    """Numba's threading layer starts under a threading lock: no ``multiprocessing`` import (its semaphore
    would be shared with no other process); LLAMAPY_NUMBA_PLAIN=1 keeps Numba's own lock."""
    assert run_with_numba_cache(tmp_path, PARALLEL)[:2] == ["499500.0", "_thread False"]
    plain = run_with_numba_cache(tmp_path, PARALLEL, LLAMAPY_NUMBA_PLAIN="1")[:2]
    assert plain[0] == "499500.0" and plain[1] != "_thread False"


def test_function_without_a_module_compiles() -> None:
    """A function made by ``exec`` in a namespace without ``__name__`` has ``__module__ = None``: the
    start-up hook that tells llamapy's kernels from anyone else's took its ``startswith`` (AttributeError)."""
    from numba import njit

    import llamapy._numba  # noqa: F401  (installs the start-up hooks)

    ns: dict = {}
    exec("def twice(x):\n    return 2 * x\n", ns)
    assert ns["twice"].__module__ is None
    assert njit(cache=False)(ns["twice"])(21) == 42


def test_read_only_spans_of_a_library() -> None:
    """The maps lines of the library's own mappings that are not writable: not another file under a
    directory of that name, not a writable mapping."""
    from llamapy._numba_startup import _read_only_spans

    lib = "/x/llvmlite/binding/libllvmlite.so"
    lines = [
        f"7f0000000000-7f0000002000 r--p 00000000 fe:00 1234   {lib}",
        f"7f0000002000-7f0000006000 r-xp 00002000 fe:00 1234   {lib}",
        f"7f0000007000-7f0000008000 rw-p 00007000 fe:00 1234   {lib}",
        "7f0000008000-7f0000009000 r--p 00000000 fe:00 99   /x/libllvmlite/other.so",
        "7f0000009000-7f000000a000 r--p 00000000 fe:00 98   /x/libc.so.6",
        f"7f000000a000-7f000000b000 r--p 00000000 fe:00 1234   {lib} (deleted)",
    ]
    assert _read_only_spans("\n".join(lines) + "\n", "libllvmlite") == [
        (0x7F0000000000, 0x7F0000002000),
        (0x7F0000002000, 0x7F0000006000),
        (0x7F000000A000, 0x7F000000B000),
    ]
    assert _read_only_spans("", "libllvmlite") == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/pagemap is Linux's")
def test_unwritten_spans_leave_out_a_mapping_with_a_copied_page(tmp_path: Path) -> None:
    """Real mappings of this process: a read-only mapping of a file is clean; a private mapping one of
    whose pages was written (copied on write: anonymous) and then made read-only, as the loader does
    with relocated data, is not, nor is a writable one."""
    import ctypes
    import mmap

    from llamapy._numba_startup import _read_only_spans, _unwritten_spans

    page = mmap.PAGESIZE
    paths = [tmp_path / f"libfakellvm-{k}.so" for k in ("clean", "copied", "writable")]
    for p in paths:
        p.write_bytes(bytes(range(256)) * (page * 4 // 256))
    files = [open(p, "rb" if i == 0 else "r+b") for i, p in enumerate(paths)]
    try:
        clean = mmap.mmap(files[0].fileno(), 0, access=mmap.ACCESS_READ)
        copied = mmap.mmap(files[1].fileno(), 0, access=mmap.ACCESS_COPY)
        writable = mmap.mmap(files[2].fileno(), 0, access=mmap.ACCESS_COPY)
        _ = clean[page * 2], writable[0]  # pages present, from the file
        copied[page + 3] = 7  # this page is now the process's own
        addr = ctypes.addressof(ctypes.c_char.from_buffer(copied))
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        assert libc.mprotect(addr, page * 4, mmap.PROT_READ) == 0
        with open("/proc/self/maps") as f:
            maps = f.read()
        spans = {name: _read_only_spans(maps, name) for name in ("fakellvm-clean", "fakellvm-copied")}
        assert len(spans["fakellvm-clean"]) == 1 and len(spans["fakellvm-copied"]) == 1
        assert _unwritten_spans("fakellvm-clean") == spans["fakellvm-clean"]
        assert _unwritten_spans("fakellvm-copied") == []
        assert _unwritten_spans("fakellvm-writable") == []
        assert libc.mprotect(addr, page * 4, mmap.PROT_READ | mmap.PROT_WRITE) == 0
        del addr
        for m in (clean, copied, writable):
            m.close()
    finally:
        for f in files:
            f.close()
