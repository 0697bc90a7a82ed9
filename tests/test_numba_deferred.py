"""llamapy._numba.njit: a kernel's dispatcher is built on first use (a call, an attribute read, another
kernel's compile typing it), then it is exactly the dispatcher ``numba.njit`` makes, on the same object."""

from __future__ import annotations

import pickle
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from numba.core.registry import CPUDispatcher

from llamapy import _numba
from llamapy._numba import njit
from tests.util import run_with_numba_cache


def _deferred(k: object) -> bool:
    return type(k) is not CPUDispatcher and "_llamapy_defer" in object.__getattribute__(k, "__dict__")


def _fresh() -> tuple[object, object]:
    @njit(inline="always")
    def twice(x):
        return x * 2.0

    @njit(nogil=True)
    def total(a):
        s = 0.0
        for i in range(a.shape[0]):
            s += twice(a[i])
        return s

    return twice, total


def test_built_on_first_call_then_a_plain_dispatcher() -> None:
    twice, total = _fresh()
    assert isinstance(total, CPUDispatcher) and _deferred(total) and _deferred(twice)
    assert total(np.arange(4.0)) == 12.0
    assert type(total) is CPUDispatcher and type(twice) is CPUDispatcher  # twice: typed by total's compile
    assert total.targetoptions["nogil"] is True and twice.targetoptions["inline"] == "always"
    assert total(np.arange(3.0)) == 6.0 and len(total.signatures) == 1


def test_an_attribute_read_or_repr_builds_it() -> None:
    twice, total = _fresh()
    assert total.__name__ == "total" and type(total) is CPUDispatcher
    assert "twice" in repr(twice) and type(twice) is CPUDispatcher
    assert twice.py_func(3.0) == 6.0


def test_class_is_readable_without_building() -> None:
    _, total = _fresh()
    assert issubclass(total.__class__, CPUDispatcher)
    assert _deferred(total)


def test_threads_build_one_dispatcher() -> None:
    _, total = _fresh()
    out: list[float] = []
    errors: list[BaseException] = []
    go = threading.Barrier(8)

    def call() -> None:
        try:
            go.wait()
            out.append(total(np.arange(5.0)))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=call) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors and out == [20.0] * 8
    assert type(total) is CPUDispatcher and len(total.signatures) == 1


def test_callers_wait_for_a_build_in_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread that calls the kernel while another builds it waits for the whole ``__init__`` (the
    C call path on a half-built dispatcher failed: ``_types_active_call`` missing)."""
    _, total = _fresh()
    orig = CPUDispatcher.__init__
    started = threading.Event()

    def slow_init(self: object, *a: object, **k: object) -> None:
        started.set()
        time.sleep(0.2)
        orig(self, *a, **k)

    monkeypatch.setattr(CPUDispatcher, "__init__", slow_init)
    out: list[object] = []

    def call() -> None:
        try:
            out.append(total(np.arange(4.0)))
        except BaseException as e:  # noqa: BLE001 - compared below
            out.append(e)

    first = threading.Thread(target=call)
    first.start()
    started.wait(5)
    rest = [threading.Thread(target=call) for _ in range(4)]
    for t in rest:
        t.start()
    for t in [first, *rest]:
        t.join()
    assert out == [12.0] * 5


def test_a_failed_build_stays_deferred(monkeypatch: pytest.MonkeyPatch) -> None:
    _, total = _fresh()

    def broken(self: object, *a: object, **k: object) -> None:
        raise RuntimeError("no")

    with monkeypatch.context() as m:
        m.setattr(CPUDispatcher, "__init__", broken)
        with pytest.raises(RuntimeError):
            total(np.arange(2.0))
    assert _deferred(total)
    assert total(np.arange(2.0)) == 2.0 and type(total) is CPUDispatcher


def test_signatures_and_other_options_are_numba_s_own() -> None:
    eager = njit("float64(float64)")(lambda x: x + 1.0)
    assert type(eager) is CPUDispatcher and len(eager.signatures) == 1
    with_locals = njit(locals={"y": np.float64})(lambda x: x)
    assert type(with_locals) is CPUDispatcher

    def bare(x):
        return x - 1

    bare_k = njit(bare)
    assert _deferred(bare_k) and bare_k(3) == 2


def test_not_a_function_is_numba_s_error() -> None:
    with pytest.raises(TypeError):
        njit(cache=False)(object())


def test_pickles_as_numba_s_dispatcher() -> None:
    k = pickle.loads(pickle.dumps(_numba_module_kernel))
    assert k(np.arange(3.0)) == 3.0


@njit(cache=False)
def _numba_module_kernel(a):
    return a.sum()


KERNEL = """
import numpy as np
from llamapy._numba import njit

@njit(cache=True, parallel=True)
def scaled(a, out):
    for i in range(a.shape[0]):
        out[i] = 3.0 * a[i]
"""

CALL = """
import numpy as np, kern
from numba.core.registry import CPUDispatcher
print(type(kern.scaled) is CPUDispatcher)
o = np.zeros(3)
kern.scaled(np.arange(3.0), o)
print(o.tolist(), sum(kern.scaled._cache_hits.values()), type(kern.scaled) is CPUDispatcher)
"""


def _run(tmp: Path, **env: str) -> list[str]:
    return run_with_numba_cache(tmp, CALL, **env)[:2]


def test_cached_deferred_kernel_loads_from_the_cache(tmp_path: Path) -> None:
    (tmp_path / "kern.py").write_text(KERNEL)
    assert _run(tmp_path) == ["False", "[0.0, 3.0, 6.0] 0 True"]  # compiled and saved
    assert _run(tmp_path) == ["False", "[0.0, 3.0, 6.0] 1 True"]  # loaded: one cache hit


def test_plain_numba_builds_at_decoration(tmp_path: Path) -> None:
    (tmp_path / "kern.py").write_text(KERNEL)
    assert _run(tmp_path, LLAMAPY_NUMBA_PLAIN="1")[0] == "True"


def test_module_names_njit_and_prange() -> None:
    assert _numba.njit is njit and callable(_numba.prange)
