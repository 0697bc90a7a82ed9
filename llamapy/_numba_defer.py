"""``njit`` for llamapy's kernels: ``numba.njit`` with the dispatcher built on first use.

Its own module, outside ``_numba.kernel_sources_digest``: how a dispatcher object comes to exist does
not change the code Numba compiles or caches, so editing it keeps the compiled kernels.
"""

from __future__ import annotations

import threading
from typing import Any

import numba

from ._numba_startup import _PLAIN  # LLAMAPY_NUMBA_PLAIN=1: ``numba.njit`` itself

_DEFER_OPTIONS = frozenset({"cache", "parallel", "fastmath", "nogil", "inline", "error_model", "boundscheck"})
_defer_lock = threading.RLock()
_deferred_classes: dict[type, type] = {}


def njit(*args: Any, **options: Any) -> Any:
    """``numba.njit``, the dispatcher built on first use: a run imports ~100 kernels (their modules
    and the inlined helpers), builds a dispatcher for each (signature inspection, a cache locator that
    stats and test-writes its directory: ~0.12 ms each) and calls ~15 of them. A deferred kernel is an
    instance of a subclass of the dispatcher class that holds only its function and options; any
    attribute read, call, ``repr`` or Numba typing (another kernel's compile reads it as a global)
    first turns it into the dispatcher ``numba.njit`` would have made: the dispatcher's ``__init__`` run
    on the same object, then its ``__class__`` set to the dispatcher class (no wrapper, no cost per call
    after). Signatures, other options, ``NUMBA_DISABLE_JIT`` and LLAMAPY_NUMBA_PLAIN=1 get
    ``numba.njit`` itself."""
    if args and callable(args[0]) and len(args) == 1:
        return njit(**options)(args[0])
    wrapper = numba.njit(*args, **options)
    cells = _jit_cells(wrapper) if not args and set(options) <= _DEFER_OPTIONS else None
    if cells is None or _PLAIN or numba.config.DISABLE_JIT or cells["sigs"] is not None:
        return wrapper

    def deco(func: Any) -> Any:
        import inspect

        if not inspect.isfunction(func):
            return wrapper(func)  # Numba's own error
        cls = _deferred_class(cells["dispatcher"])
        obj = cls.__new__(cls)
        object.__getattribute__(obj, "__dict__")["_llamapy_defer"] = (func, cells)
        return obj

    return deco


def _jit_cells(wrapper: Any) -> dict[str, Any] | None:
    """What Numba's ``_jit`` closure would build a dispatcher from (its free variables by name), or
    None where its shape is not the one this module knows."""
    code, closure = getattr(wrapper, "__code__", None), getattr(wrapper, "__closure__", None)
    need = ("cache", "dispatcher", "dispatcher_args", "locals", "sigs", "targetoptions")
    if code is None or closure is None or not set(need) <= set(code.co_freevars):
        return None  # pragma: no cover - Numba's decorator changed
    try:
        cells = {n: c.cell_contents for n, c in zip(code.co_freevars, closure, strict=True)}
    except ValueError:  # pragma: no cover - an empty cell
        return None
    return cells if isinstance(cells["dispatcher"], type) else None


def _deferred_class(base: type) -> type:
    cls = _deferred_classes.get(base)
    if cls is not None:
        return cls

    class Deferred(base):  # type: ignore[misc, valid-type]
        """A kernel whose dispatcher is built on first use (see :func:`njit`)."""

        def __getattribute__(self, name: str) -> Any:
            if name == "__class__":
                return object.__getattribute__(self, name)
            _materialize(self)
            return object.__getattribute__(self, name)

        def __call__(self, *args: Any, **kws: Any) -> Any:
            _materialize(self)
            return base.__call__(self, *args, **kws)

        def __repr__(self) -> str:
            _materialize(self)  # the dispatcher's own repr, also while its __init__ asks (types.Dispatcher)
            return base.__repr__(self).replace(type(self).__name__, base.__name__, 1)

        def __get__(self, obj: Any, objtype: Any = None) -> Any:
            _materialize(self)
            return base.__get__(self, obj, objtype)

    Deferred.__name__ = Deferred.__qualname__ = f"Deferred{base.__name__}"
    Deferred._llamapy_base = base  # type: ignore[attr-defined]
    _deferred_classes[base] = Deferred
    return Deferred


def _materialize(obj: Any) -> None:
    """Make a deferred kernel the dispatcher ``numba.njit`` would have returned: once, under a lock that
    every use of a deferred kernel takes, and with its class changed only after the dispatcher's
    ``__init__`` has finished (another thread calling it meanwhile waits; the C call path never sees a
    half-built object). ``__init__``'s reads of the object's own attributes pass through."""
    cls = type(obj)
    base = cls.__dict__.get("_llamapy_base")
    if base is None:
        return
    state = object.__getattribute__(obj, "__dict__")
    me = threading.get_ident()
    with _defer_lock:
        if type(obj) is not cls or state.get("_llamapy_building") == me:
            return  # built meanwhile, or its own __init__ reading an attribute
        func, cells = state["_llamapy_defer"]
        state["_llamapy_building"] = me
        try:
            base.__init__(
                obj,
                py_func=func,
                locals=cells["locals"],
                targetoptions=cells["targetoptions"],
                **cells["dispatcher_args"],
            )
            if cells["cache"]:
                obj.enable_caching()
        except BaseException:
            for k in [k for k in state if k != "_llamapy_defer"]:
                del state[k]  # deferred as before: the next use tries again (and raises again)
            raise
        del state["_llamapy_building"], state["_llamapy_defer"]
        object.__setattr__(obj, "__class__", base)
