"""The cyclic garbage collector paused for the start-up of ``run``/``chat``: the one place that holds
whether it is paused.

Importing NumPy, Numba and llamapy and loading a model allocate long-lived objects, and the collections
they trigger (SmolLM2: ~125, one of them full) freed ~400 objects for 50-80 ms of CPU of a ~0.9 s
``llamapy run``. :func:`pause` (from the ``llamapy`` command's entry, not from ``main`` called in a
process that goes on) turns the collector off; :func:`resume` turns it back on once the model is loaded,
after freezing what start-up made; :func:`end` turns it back on without freezing if start-up ended
early (an error). LLAMAPY_NO_GC_PAUSE=1 keeps the collector on.
"""

from __future__ import annotations

import gc
import os

_paused = False


def pause() -> None:
    """Turn the collector off for start-up (a no-op if it is off already or LLAMAPY_NO_GC_PAUSE is set)."""
    global _paused
    if gc.isenabled() and not os.environ.get("LLAMAPY_NO_GC_PAUSE"):
        gc.disable()
        _paused = True


def resume() -> None:
    """The collector back on after a paused start-up (a no-op otherwise, or when called again). What
    start-up allocated is frozen first (``gc.freeze``): the modules, the model and the kernels live until
    exit, and later collections no longer walk them (a full collection over them costs ~25 ms)."""
    global _paused
    if _paused:
        _paused = False
        gc.freeze()
        gc.enable()


def end() -> None:
    """The collector back on, without freezing, if it is still paused (start-up ended before the model
    loaded)."""
    global _paused
    if _paused:
        _paused = False
        gc.enable()
