"""Launch plans: a reused graph's device split runs without per-node Python work.

A split's step (``backend.CUDABackend.compile_split``) holds one closure per node (``steps.build_step``).
The first run of the split walks those closures with the backend recording: every device launch they
make goes through ``CUDABackend.emit`` and is appended to the split's ``LaunchPlan`` as a ready-to-call
``(launcher, args)`` pair (kernel configured with its grid and block, arguments bound, device pointers
fixed: the graph's arena, the weights and the KV buffers never move). Later runs of the same split of
the same ``Graph`` (the context reuses a graph while the ubatch shape and ``n_kv`` repeat; a new
``n_kv`` is a new graph, so a new plan) only upload inputs, replay the list, and download outputs.

No launch parameter of any step depends on the values of the inputs: grids, shapes, strides and
offsets come from shapes; token ids, positions, row indices, expert ids and masks are read by the
kernels from device memory (see the audit in ``steps``). A step that needed values at launch time would
have to be re-run each time instead of replayed (none does).

On a GPU with CuPy (``Device.can_capture``) the replay is captured once into a CUDA graph on the
device's stream and later runs launch that graph as one call; if the capture raises, the plan logs it
once and keeps replaying launch by launch. Counters in ``CUDABackend.stats`` say which path ran.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

__all__ = ["Launch", "LaunchPlan"]

log = logging.getLogger(__name__)

#: one recorded launch: ``launcher(*args)`` enqueues it (a configured kernel, or a device call)
Launch = tuple[Callable[..., Any], tuple]

_capture_logged = False


class LaunchPlan:
    """The launches of one split of one graph: recorded on the first run, replayed after."""

    __slots__ = ("be", "steps", "launches", "graph", "capture_failed")

    def __init__(self, be: Any, steps: list[Callable[[], None]]) -> None:
        self.be = be
        self.steps: list[Callable[[], None]] | None = steps  # the node closures (dropped once recorded)
        self.launches: list[Launch] = []
        self.graph: Any = None  # the CUDA graph of the replay (GPU with CuPy only)
        self.capture_failed = False

    @property
    def recorded(self) -> bool:
        return self.steps is None

    def run(self) -> None:
        be = self.be
        if self.steps is not None:  # the first run (every run with LLAMAPY_CUDA_REPLAY=0: the node walk)
            self._record()
        elif self.graph is not None:
            be.dev.launch_graph(self.graph)
            be.stats["graph_launches"] += 1
            be.stats["launches"] += len(self.launches)
        elif be.graphs and not self.capture_failed:
            self._capture()
        else:
            self._replay()
            be.stats["replays"] += 1
            be.stats["launches"] += len(self.launches)

    def _record(self) -> None:
        be, rec = self.be, []
        be._rec = rec
        try:
            for f in self.steps or ():
                f()
        finally:
            be._rec = None
        self.launches = rec
        be.stats["records"] += 1
        be.stats["launches"] += len(rec)
        if be.replay:
            self.steps = None

    def _replay(self) -> None:
        for fn, args in self.launches:
            fn(*args)

    # -- CUDA graphs (a GPU with CuPy; the simulator tests drive it through a fake Device API) -----------
    def _capture(self) -> None:
        """Capture the replay into a CUDA graph and launch it; on failure log once, replay plainly."""
        global _capture_logged
        be = self.be
        try:
            self.graph = be.dev.capture(self._replay)
        except Exception as e:
            self.capture_failed = True
            be.stats["capture_failures"] += 1
            if not _capture_logged:
                _capture_logged = True
                log.warning(
                    "CUDA graph capture failed (%s: %s); replaying launches one by one", type(e).__name__, e
                )
            self._replay()  # nothing ran during the failed capture
            be.stats["replays"] += 1
            be.stats["launches"] += len(self.launches)
            return
        be.stats["captures"] += 1
        be.dev.launch_graph(self.graph)
        be.stats["graph_launches"] += 1
        be.stats["launches"] += len(self.launches)
