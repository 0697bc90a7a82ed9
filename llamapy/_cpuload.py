"""The default thread count on a shared machine: all cores minus the ones other processes keep busy.

Numba's OpenMP workers spin at the barrier between kernel launches (hundreds per token). When another
process holds a core, a worker waiting for a descheduled sibling spins through its time slices and a
token can take ten times longer than on one thread (measured, SmolLM2 on 2 cores with other jobs
running: 71 ms/token on 2 threads against 21 ms on 1; idle: 5.7 ms against 12). So when the user has
not fixed ``-t``, each decode runs on ``round(cores - cores busy with other work)`` threads (at least
one, at most the cores), with the other work measured over the last ``interval`` seconds from
``/proc/stat`` (all CPU time) minus ``/proc/self/stat`` (this process's, spinning included). Results do
not depend on the thread count (every kernel's reductions are per row), so switching is invisible in
the output. ``LLAMAPY_ADAPTIVE_THREADS=0`` turns it off; without ``/proc`` it does nothing.
"""

from __future__ import annotations

import os
import platform
import time

__all__ = ["ThreadPolicy", "cpu_model", "other_busy_cores"]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_ticks() -> tuple[int, int] | None:
    """(busy ticks of all CPUs, busy ticks of this process) or None without /proc."""
    try:
        with open("/proc/stat", "rb") as f:
            vals = [int(x) for x in f.readline().split()[1:]]
        with open("/proc/self/stat", "rb") as f:
            raw = f.read()
    except (OSError, ValueError):
        return None
    if len(vals) < 4:
        return None
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    busy = sum(vals[:8]) - idle  # user nice system idle iowait irq softirq steal (guest is in user)
    fields = raw[raw.rindex(b")") + 2 :].split()  # after "pid (comm) ": state is field 3
    mine = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return busy, mine


def other_busy_cores(seconds: float = 0.2) -> float | None:
    """Cores kept busy by other processes over the next ``seconds`` (blocks; for scripts and tests)."""
    a = _cpu_ticks()
    t0 = time.monotonic()
    time.sleep(seconds)
    b = _cpu_ticks()
    if a is None or b is None:
        return None
    return max(0.0, ((b[0] - a[0]) - (b[1] - a[1])) / _TICKS / (time.monotonic() - t0))


def _n_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class ThreadPolicy:
    """Threads for the next decode, at most ``n_max``: call :meth:`threads` before each one (cheap:
    ``/proc`` is read at most once per ``interval`` seconds)."""

    def __init__(self, n_max: int, interval: float = 0.25) -> None:
        self.n_max = max(1, int(n_max))
        self.n_cores = _n_cores()
        self.interval = float(interval)
        self.enabled = os.environ.get("LLAMAPY_ADAPTIVE_THREADS", "1") != "0" and self.n_max > 1
        self.current = self.n_max
        self.others = 0.0  # cores busy with other work in the last window
        self._last = _cpu_ticks() if self.enabled else None
        self._t_last = time.monotonic()
        if self._last is None:
            self.enabled = False

    def threads(self) -> int:
        if not self.enabled:
            return self.n_max
        now = time.monotonic()
        dt = now - self._t_last
        if dt < self.interval:
            return self.current
        cur = _cpu_ticks()
        if cur is None:
            return self.current
        busy, mine = cur[0] - self._last[0], cur[1] - self._last[1]
        self._last, self._t_last = cur, now
        self.others = max(0.0, (busy - mine) / _TICKS / dt)
        free = self.n_cores - self.others
        self.current = max(1, min(self.n_max, int(free + 0.5)))
        return self.current

    def apply(self) -> int:
        """Cap the thread count of kernels launched from the calling thread (see
        :func:`llamapy._numba.cap_threads`); returns the cap it replaced. ``Context.decode`` puts that
        back when its decode ends, so the cap covers that decode only."""
        from ._numba import cap_threads

        return cap_threads(self.threads())
