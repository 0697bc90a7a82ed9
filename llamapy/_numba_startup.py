"""Numba's start-up shortcuts for a process that mostly loads cached kernels: the import without the
optional SciPy / PyYAML / ``importlib.metadata`` work, cached kernel loads without the compiler's
registries, the runtime's object code from the cache, lazy linking bitcode, and the pages of LLVM's
library handed back. ``llamapy._numba`` runs them (``import_numba`` before ``import numba``, ``install``
after). None of them changes the code Numba compiles or caches, so this module is outside
``_numba.kernel_sources_digest``: editing it keeps every compiled kernel. LLAMAPY_NUMBA_PLAIN=1 turns
them off.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

#: LLAMAPY_NUMBA_PLAIN=1: Numba as it comes, without these shortcuts (nor ``_numba_defer``'s)
_PLAIN = bool(os.environ.get("LLAMAPY_NUMBA_PLAIN"))


# OMP_WAIT_POLICY is left to the user. GNU OpenMP's default (spin briefly, then sleep; less spinning when
# oversubscribed) measured best on a quiet 2-core machine: SmolLM2 tg 44 t/s with 2 threads, against 22 t/s
# with PASSIVE (every kernel launch then pays a thread wake-up). On a machine busy with other work,
# OMP_WAIT_POLICY=PASSIVE avoids spinning against the other processes.
def import_numba() -> None:
    """``import numba``, without the two optional imports that only its import does: SciPy (a version
    check, ``numba/__init__.py``) and PyYAML (to read a ``.numba_config.yaml``, kept when the current
    directory has one): 15-25 ms of each start-up. Anything importing them later gets them as usual."""
    import sys

    hide = [] if _PLAIN else [m for m in ("scipy", "yaml") if m not in sys.modules]
    if "yaml" in hide and os.path.exists(".numba_config.yaml"):
        hide.remove("yaml")
    for m in hide:
        sys.modules[m] = None  # type: ignore[assignment]  # "import m" raises ImportError
    if not _PLAIN:
        _import_lazily("importlib.metadata")
    try:
        import numba  # noqa: F401
    finally:
        for m in hide:
            if sys.modules.get(m, 0) is None:
                del sys.modules[m]


def _import_lazily(name: str) -> None:
    """Put module ``name`` in ``sys.modules`` as the standard library's lazy module
    (``importlib.util.LazyLoader``): it runs on first attribute access. For ``importlib.metadata``
    (with the ``email`` package it imports: 8-10 ms of each start-up), which ``import numba`` imports
    only for ``entrypoints.init_all``, run before a compile (and skipped for llamapy's own cached
    kernels, see ``_cache_loads_import_less``). Anything that uses the module loads it as usual."""
    import importlib.util
    import sys

    if name in sys.modules:
        return
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # pragma: no cover - not in this Python
        return
    if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
        return  # pragma: no cover - a frozen or built-in module: imported as usual
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], child, module)


def _after_import(name: str, fn: Callable[[Any], None]) -> None:
    """Run ``fn(module)`` once module ``name`` has been imported (now, if it already is): a one-shot
    finder wraps the loader of its spec, so patching a Numba module does not import it early."""
    import importlib.machinery
    import sys

    if name in sys.modules:
        fn(sys.modules[name])
        return

    class _Hook:
        def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            loader = getattr(spec, "loader", None)
            run = getattr(loader, "exec_module", None)
            if run is None:  # pragma: no cover - not a plain source/bytecode module
                return spec

            def exec_module(module: Any) -> None:
                run(module)
                fn(module)

            loader.exec_module = exec_module  # type: ignore[union-attr]
            return spec

    sys.meta_path.insert(0, _Hook())


def _skip_scipy_blas_probe() -> None:
    """Numba's ``numba.np.arraymath`` (imported by Numba's registry refresh before a compile) imports
    ``scipy.linalg`` only to decide whether ``np.correlate``/``np.convolve`` inner products call BLAS:
    0.2-0.3 s of each start-up. No llamapy kernel uses those; answer the probe "no BLAS" instead (the
    loops then run in plain code) and leave every other use of ``ensure_blas`` (np.dot, np.linalg in
    anyone's jitted code) as it was. Applied when ``numba.np.linalg`` is imported (a run that only loads
    cached kernels never imports it: 10-20 ms). Skipped with LLAMAPY_NUMBA_BLAS_PROBE=1 or a newer Numba."""
    import sys

    if os.environ.get("LLAMAPY_NUMBA_BLAS_PROBE") or "numba.np.arraymath" in sys.modules:
        return

    def patch(nl: Any) -> None:
        orig = getattr(nl, "ensure_blas", None)
        if orig is None:  # pragma: no cover - Numba internals moved
            return

        def ensure_blas() -> None:
            if sys._getframe(1).f_globals.get("__name__") != "numba.np.arraymath":
                return orig()
            nl.ensure_blas = orig  # one shot: arraymath's import-time probe
            raise ImportError("llamapy: Numba's BLAS probe for np.correlate skipped")

        nl.ensure_blas = ensure_blas

    _after_import("numba.np.linalg", patch)


def _cache_loads_without_refresh() -> None:
    """A cached kernel's first call in a process runs ``target_context.refresh()`` before loading the
    object code: it imports and installs every typing and lowering registry of Numba (about 250 modules'
    templates, CFFI's C parser among them): 0.1-0.15 s of each start-up, needed only to *compile*.
    Loading machine code from the cache needs only the runtime (NRT) that it links against; a compile
    (a cache miss, a new signature) still refreshes first (``CompilerBase.__init__``), and so does a
    failed function lookup. Kept as it was with LLAMAPY_NUMBA_PLAIN=1 or where Numba's internals moved.
    """
    if _PLAIN:
        return
    try:
        from numba.core import caching
        from numba.core.cpu import CPUContext
        from numba.core.runtime import rtsys

        cache_cls = caching.Cache
        orig = cache_cls.load_overload
        load, guard = cache_cls._load_overload, cache_cls._guard_against_spurious_io_errors
    except (ImportError, AttributeError):  # pragma: no cover - Numba internals moved
        return
    if getattr(orig, "_llamapy", False):
        return

    def load_overload(self, sig, target_context):  # type: ignore[no-untyped-def]
        if not isinstance(target_context, CPUContext):  # e.g. numba-cuda's caches: as Numba does
            return orig(self, sig, target_context)
        rtsys.initialize(target_context)  # idempotent; the NRT helpers cached code calls
        with guard(self), _quiet_llvm_lock():
            return load(self, sig, target_context)
        return None  # the guard swallowed an I/O error: compile instead

    load_overload._llamapy = True  # type: ignore[attr-defined]
    cache_cls.load_overload = load_overload


_quiet_depth = 0
_quiet_saved: list[Any] = []


class _quiet_llvm_lock:  # noqa: N801 - a context manager used like a function
    """Without the callbacks on llvmlite's lock while a cached kernel loads. Numba registers two (a
    ``numba:llvm_lock`` event on every LLVM call, for a compile's timers): ~750 calls for a SmolLM2
    run's 14 loads, 3-5 ms of a 20-30 ms total. The list is changed only while the LLVM lock is held,
    so no other thread is between a call's two callbacks; nested or concurrent loads restore it once,
    when the last one ends. A compile running meanwhile in another thread misses those events (its
    ``llvm_lock`` timer reads short); nothing else uses them."""

    def __enter__(self) -> None:
        global _quiet_depth, _quiet_saved
        lock = _llvm_lock()
        if lock is None:
            return
        with lock._lock:
            if _quiet_depth == 0:
                _quiet_saved = list(lock._cblist)
                lock._cblist.clear()
            _quiet_depth += 1

    def __exit__(self, *exc: object) -> None:
        global _quiet_depth
        lock = _llvm_lock()
        if lock is None:
            return
        with lock._lock:
            _quiet_depth -= 1
            if _quiet_depth == 0:
                lock._cblist[:] = _quiet_saved + [c for c in lock._cblist if c not in _quiet_saved]


def _llvm_lock() -> Any:
    """llvmlite's lock object (with its ``_lock`` and ``_cblist``), or None where that moved."""
    import llvmlite.binding as ll

    lock = getattr(getattr(getattr(ll, "ffi", None), "lib", None), "_lock", None)
    ok = isinstance(getattr(lock, "_cblist", None), list) and hasattr(getattr(lock, "_lock", None), "acquire")
    return lock if ok else None


def _cached_nrt_module() -> None:
    """Numba compiles its runtime's few LLVM functions (atomic incref/decref, meminfo data) from IR in
    every process, through LLVM's whole optimizer and x86 back end: 30-40 ms and about 30 MB of LLVM's
    code paged in, before the first cached kernel can load. Keep their object code in the cache
    directory instead, keyed like Numba's own cache entries (Numba version, target triple, host CPU
    and features), and load it as Numba loads a cached kernel. Any failure compiles as before.
    Off with LLAMAPY_NUMBA_PLAIN=1."""
    if _PLAIN:
        return
    try:
        import numba
        from numba.core.cpu import CPUContext
        from numba.core.runtime import nrtdynmod

        orig = nrtdynmod.compile_nrt_functions
        nrtdynmod.create_nrt_module  # noqa: B018 - present in this Numba
    except (ImportError, AttributeError):  # pragma: no cover - Numba internals moved
        return
    if getattr(orig, "_llamapy", False):
        return

    def compile_nrt_functions(ctx):  # type: ignore[no-untyped-def]
        import pickle

        if not isinstance(ctx, CPUContext):
            return orig(ctx)
        try:
            codegen = ctx.codegen()
            key = hashlib.sha256(repr((numba.__version__, codegen.magic_tuple())).encode()).hexdigest()[:16]
            path = Path(numba.config.CACHE_DIR or os.environ["NUMBA_CACHE_DIR"]) / f"llamapy-nrt-{key}.pkl"
        except Exception:  # pragma: no cover - Numba internals moved
            return orig(ctx)
        try:
            return codegen.unserialize_library(pickle.loads(path.read_bytes()))
        except Exception:  # noqa: S110 - absent or unreadable: compile and write it
            pass
        ir_mod, library = nrtdynmod.create_nrt_module(ctx)
        library.enable_object_caching()
        library.add_ir_module(ir_mod)
        library.finalize()
        try:
            data = pickle.dumps(library.serialize_using_object_code())
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except Exception:  # noqa: S110 - a read-only cache: compile each time, as Numba does
            pass
        return library

    compile_nrt_functions._llamapy = True  # type: ignore[attr-defined]
    nrtdynmod.compile_nrt_functions = compile_nrt_functions


def _elf_defined_symbols(obj: bytes) -> set[str] | None:
    """Names of the functions and data objects an ELF64 little-endian object file defines (its
    ``.symtab``), or None for any other format or a file this reader does not understand."""
    import struct

    if obj[:4] != b"\x7fELF" or obj[4] != 2 or obj[5] != 1:  # ELFCLASS64, ELFDATA2LSB
        return None
    try:
        (shoff,) = struct.unpack_from("<Q", obj, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", obj, 0x3A)
        if shentsize != 64:
            return None
        sections = [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * 64) for i in range(shnum)]
        names: set[str] = set()
        for _, sh_type, _, _, off, size, link, _, _, entsize in sections:
            if sh_type != 2 or entsize != 24:  # SHT_SYMTAB
                continue
            str_off = sections[link][4]
            for k in range(size // 24):
                st_name, st_info, _, st_shndx = struct.unpack_from("<IBBH", obj, off + k * 24)
                # STT_OBJECT (1), STT_FUNC (2); defined (not SHN_UNDEF); named
                if st_shndx and (st_info & 0xF) in (1, 2) and st_name:
                    end = obj.index(b"\0", str_off + st_name)
                    names.add(obj[str_off + st_name : end].decode("utf-8", "surrogateescape"))
        return names or None
    except (struct.error, ValueError, IndexError):
        return None


def _lazy_linking_bitcode() -> None:
    """A cached kernel's library holds its object code and the LLVM bitcode of its module, kept only
    so that a later compile can link (and inline) the kernel into another function. Numba parses
    that bitcode into an LLVM module on every cache load, to list the symbols the library defines:
    1-2 ms and about 0.5 MB resident per kernel (15 ms and 8 MB for Gemma 3's 17 kernels). Take the
    symbol names from the object file's symbol table instead and parse the bitcode only when
    something links against the library, or before any compile in the process (so a compile sees
    exactly Numba's own state). Non-ELF object code is loaded as Numba does. Off with
    LLAMAPY_NUMBA_PLAIN=1."""
    if _PLAIN:
        return
    import weakref

    try:
        from numba.core import codegen as cg
        from numba.core.cpu import CPUContext

        lib_cls = cg.CPUCodeLibrary
        orig_unserialize = lib_cls.__dict__["_unserialize"].__func__
        orig_linking = lib_cls._get_module_for_linking
        orig_refresh = CPUContext.refresh
        import llvmlite.binding as ll
    except (ImportError, AttributeError, KeyError):  # pragma: no cover - Numba internals moved
        return
    if getattr(orig_linking, "_llamapy", False):
        return
    pending: weakref.WeakSet[Any] = weakref.WeakSet()

    def materialize(lib: Any) -> None:
        bitcode = lib.__dict__.pop("_llamapy_bitcode", None)
        if bitcode is not None:
            pending.discard(lib)
            lib._shared_module = ll.parse_bitcode(bitcode)
            lib._codegen._engine._load_defined_symbols(lib._shared_module)

    def _unserialize(cls, codegen, state):  # type: ignore[no-untyped-def]
        name, kind, data = state
        symbols = _elf_defined_symbols(data[0]) if kind == "object" else None
        if symbols is None:
            return orig_unserialize(cls, codegen, state)
        object_code, shared_bitcode = data
        self = codegen.create_library(name)
        self.enable_object_caching()
        self._set_compiled_object(object_code)
        self._llamapy_bitcode = shared_bitcode
        pending.add(self)
        self._finalize_final_module()
        codegen._engine._defined_symbols |= symbols
        return self

    def _get_module_for_linking(self):  # type: ignore[no-untyped-def]
        materialize(self)
        return orig_linking(self)

    def refresh(self):  # type: ignore[no-untyped-def]
        for lib in list(pending):
            materialize(lib)
        return orig_refresh(self)

    _get_module_for_linking._llamapy = True  # type: ignore[attr-defined]
    lib_cls._unserialize = classmethod(_unserialize)
    lib_cls._get_module_for_linking = _get_module_for_linking
    CPUContext.refresh = refresh


def _cache_loads_import_less() -> None:
    """Three imports a run that only loads cached kernels does not need (see startup_run.md):
    - a cached kernel's environment names the module whose globals it had: for helpers Numba inlined
      from its own library that is ``numba.np.arrayobj`` (with ``numba.cpython.charseq``), imported
      only to take its ``__dict__``: 30-40 ms. Nopython code reads no globals at run time (object mode
      does; its modules are imported as before), so a Numba module not yet imported gets a dict that
      is filled with the module's globals when something imports it;
    - typing any array argument asks ``isinstance(a, np.ma.MaskedArray)``, which imports ``numpy.ma``
      (8 ms); no array can be one before ``numpy.ma`` exists, so the question waits for it;
    - every dispatcher's first call runs ``entrypoints.init_all()`` (reads all installed packages'
      entry points: 7 ms) so that extension types can be typed; llamapy's kernels take none, and any
      compile still runs it first (``CPUContext.refresh`` calls it)."""
    if _PLAIN:
        return
    import sys

    try:
        import numpy as np
        from numba.core import entrypoints, environment, errors
        from numba.core.dispatcher import Dispatcher
        from numba.core.typing import typeof as tmod

        orig_env, orig_typeof = environment._rebuild_env, tmod._typeof_ndarray
        orig_hook = Dispatcher._compilation_chain_init_hook
    except (ImportError, AttributeError):  # pragma: no cover - Numba internals moved
        return
    if getattr(orig_env, "_llamapy", False):
        return
    waiting: dict[str, list[dict[str, Any]]] = {}

    def fill(mod: Any) -> None:
        for g in waiting.pop(mod.__name__, []):
            g.update(mod.__dict__)

    def _rebuild_env(modname, consts, env_name):  # type: ignore[no-untyped-def]
        if (
            not isinstance(modname, str)
            or not modname.startswith("numba.")
            or modname in sys.modules
            or environment.lookup_environment(env_name) is not None
        ):
            return orig_env(modname, consts, env_name)
        g: dict[str, Any] = {"__name__": modname}
        if modname not in waiting:
            _after_import(modname, fill)
        waiting.setdefault(modname, []).append(g)
        env = environment.Environment(g)
        env.consts[:] = consts
        env.env_name = env_name
        environment.Environment._memo[env_name] = env
        return env

    def _typeof_ndarray(val, c):  # type: ignore[no-untyped-def]
        if "numpy.ma" not in sys.modules:  # then no MaskedArray exists: Numba's checks without it
            try:
                dtype = tmod.numpy_support.from_dtype(val.dtype)
            except errors.NumbaNotImplementedError:
                raise errors.NumbaValueError(f"Unsupported array dtype: {val.dtype}") from None
            layout = tmod.numpy_support.map_layout(val)
            return tmod.types.Array(dtype, val.ndim, layout, readonly=not val.flags.writeable)
        return orig_typeof(val, c)

    def _compilation_chain_init_hook(self):  # type: ignore[no-untyped-def]
        if not (getattr(self.py_func, "__module__", None) or "").startswith("llamapy."):
            return orig_hook(self)  # anyone else's function (it may take an extension's types)
        return None  # llamapy's kernels take arrays and scalars; a compile's refresh runs init_all

    _rebuild_env._llamapy = True  # type: ignore[attr-defined]
    environment._rebuild_env = _rebuild_env
    tmod.typeof_impl.register(np.ndarray)(_typeof_ndarray)
    if hasattr(entrypoints, "init_all"):
        Dispatcher._compilation_chain_init_hook = _compilation_chain_init_hook


def release_compiler_pages() -> int:
    """Hand back the pages of LLVM's shared library (``libllvmlite``) that this process has touched
    and no longer needs resident: its read-only, never-written mappings (code and constants), most of
    them paged in by LLVM's static initializers at ``import numba``. Running compiled kernels does not
    execute LLVM; a later kernel load or compile pages what it needs back in from the page cache.
    ``madvise(MADV_DONTNEED)`` on a private file mapping without copied-on-write pages only drops
    the process's references (the content stays the file's). Linux only; returns the bytes released
    (0 elsewhere, or with LLAMAPY_NUMBA_PLAIN=1).

    The mappings come from ``/proc/self/maps`` and their pages' kinds from ``/proc/self/pagemap``
    (~1 ms); where pagemap cannot be read, from ``/proc/self/smaps``, whose text costs ~5 ms (the
    kernel walks every mapping's pages to write it)."""
    if _PLAIN or not os.path.exists("/proc/self/maps"):
        return 0
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):  # pragma: no cover - no libc symbol
        return 0
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    try:
        spans = _unwritten_spans("libllvmlite")
    except OSError:  # pragma: no cover - a kernel or sandbox without pagemap
        with open("/proc/self/smaps") as f:
            spans = _clean_read_only_spans(f.read(), "libllvmlite")
    done = 0
    for lo, hi in spans:
        if madvise(lo, hi - lo, 4) == 0:  # MADV_DONTNEED
            done += hi - lo
    return done


def _read_only_spans(maps: str, library: str) -> list[tuple[int, int]]:
    """The address ranges, in ``maps`` (the text of ``/proc/<pid>/maps``), of the mappings of a file
    whose name contains ``library`` that are not writable."""
    return [(lo, hi) for lo, hi, _ in _library_mappings(maps, library)]


def _library_mappings(text: str, library: str) -> Iterator[tuple[int, int, int]]:
    """(start, end, where its first line ends) of each not-writable mapping of a file whose name
    contains ``library``, in the text of ``/proc/<pid>/maps`` or ``smaps``. Only the lines that name
    the library are looked at (a search, not a parse of every line: ~9000 in a llamapy's smaps)."""
    at = text.find(library)
    while at >= 0:
        start = text.rfind("\n", 0, at) + 1
        end = text.find("\n", at)
        end = len(text) if end < 0 else end
        head = text[start:end].split(maxsplit=5)
        at = text.find(library, end)
        if len(head) < 6 or "-" not in head[0] or ":" in head[0] or not head[0][0].isalnum():
            continue  # not a mapping's first line
        if library in os.path.basename(head[5].strip()) and "w" not in head[1]:
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            yield lo, hi, end


def _unwritten_spans(library: str) -> list[tuple[int, int]]:
    """This process's read-only mappings of ``library`` (``_read_only_spans``) none of whose pages is
    anonymous (present and not the file's: relocated data, copied on write before the mapping was
    made read-only) or swapped out, by ``/proc/self/pagemap``: one 64-bit entry a page, bit 63
    present, 62 swapped, 61 a file page. Raises OSError where pagemap cannot be read."""
    import numpy as np

    with open("/proc/self/maps") as f:
        spans = _read_only_spans(f.read(), library)
    if not spans:
        return []
    page = os.sysconf("SC_PAGE_SIZE")
    clean = []
    with open("/proc/self/pagemap", "rb", buffering=0) as pm:
        for lo, hi in spans:
            n = (hi - lo) // page
            pm.seek(lo // page * 8)
            raw = pm.read(n * 8)
            if raw is None or len(raw) != n * 8:
                continue  # not all of it read: not known to be clean
            e = np.frombuffer(raw, np.uint64)
            if not np.any(((e >> 62) & 1) | ((e >> 63) & ~(e >> 61) & 1)):
                clean.append((lo, hi))
    return clean


def _clean_read_only_spans(smaps: str, library: str) -> list[tuple[int, int]]:
    """The address ranges, in ``smaps`` (the text of ``/proc/<pid>/smaps``), of the mappings of a file
    whose name contains ``library`` that are not writable and hold no anonymous (copied-on-write) page:
    the ones whose pages can be dropped and read back from the file."""
    spans = []
    for lo, hi, end in _library_mappings(smaps, library):
        stop = smaps.find("\nVmFlags:", end)  # the mapping's last line (none, before Linux 3.8: skip it)
        anon = smaps.find("\nAnonymous:", end, stop) if stop > 0 else -1
        if anon >= 0 and smaps[anon + 11 : stop].split()[:1] == ["0"]:
            spans.append((lo, hi))
    return spans


def _thread_init_lock_without_multiprocessing() -> None:
    """Numba guards the start of its threading layer with a lock it makes on the first launch: a
    ``multiprocessing`` RLock (a POSIX semaphore) where processes fork, which imports ``multiprocessing``
    and with it ``socket``, ``subprocess`` and ``selectors`` (5-8 ms of each start-up). Made in this process at
    that moment, the semaphore is shared with no other process: only children forked later inherit it, and
    by then the layer has started and the lock is never taken again. A ``threading`` RLock guards the same
    threads of this process. Kept as Numba's with LLAMAPY_NUMBA_PLAIN=1 or where the global moved."""
    if _PLAIN:
        return

    def patch(parallel: Any) -> None:
        import threading

        if getattr(parallel, "_backend_init_process_lock", 0) is None:
            parallel._backend_init_process_lock = threading.RLock()

    _after_import("numba.np.ufunc.parallel", patch)


def install() -> None:
    """The shortcuts that patch Numba, once it is imported."""
    _thread_init_lock_without_multiprocessing()
    _skip_scipy_blas_probe()
    _cache_loads_without_refresh()
    _cached_nrt_module()
    _lazy_linking_bitcode()
    _cache_loads_import_less()
