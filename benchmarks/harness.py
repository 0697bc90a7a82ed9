"""What every benchmark shares: the machine line, llama.cpp's binaries, starting either server, interleaved
rounds with medians, timed child processes (wall time, peak RSS), the measured read bandwidth, the bytes a
generated token reads, and result files (Markdown + JSON under ``benchmarks/results/``).

- ``machine_line()``: ``AMD EPYC 9B14; 2 cores; flags: avx avx2 fma f16c avx512f ...`` (``load=True`` appends
  the load average; ``python=True`` the Python version).
- ``llamacpp_bin(arch)``: the one place that says where llama.cpp's tools are. ``LLAMACPP_BIN`` (a directory)
  wins; else ``~/.cache/llamapy/llamacpp/<LLAMACPP_VERSION>/build[-avx2]/bin`` (``arch="avx2"`` or
  ``LLAMACPP_ARCH=avx2``), as ``benchmarks/build_llamacpp.sh`` builds it. ``llamacpp_tool(name)`` /
  ``require_tool(name)``: one tool, or ``None`` / a clear exit.
- ``start_server(tool, model, args)``: ``llama-server`` or ``llamapy serve`` on a free port, waited for until
  ``/health`` answers 200; a context manager (``.base``, ``.proc``, ``.seconds`` to healthy, ``.stderr_tail()``).
- ``interleave(rounds, tools)``: (round, tool) with the order alternating round to round; ``median``.
- ``run_timed(cmd)``: wall seconds and peak RSS (MiB) of one child process (``os.wait4``'s rusage).
- ``read_bandwidth(threads)``: GB/s of a parallel streaming read (wide accumulators, with/without prefetch; the bandwidth limit's denominator).
- ``bytes_per_token(path)``: weight bytes one generated token reads (MoE experts by ``n_used / n_expert``).
- ``write_results(name, markdown, data)``: ``benchmarks/results/<name>.md`` and ``.json``.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CACHE = Path(
    os.environ.get(
        "LLAMAPY_CACHE", Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "llamapy"
    )
)
MODELS_DIR = CACHE / "models"
BENCH_CACHE = CACHE / "bench"
LLAMACPP_VERSION = os.environ.get("LLAMACPP_VERSION", "0.3.36")
SIMD_FLAGS = re.compile(r"avx|avx2|fma|f16c|avx_vnni|avx512\w*|amx\w*")

# -- the machine ------------------------------------------------------------------------------------


def _cpuinfo() -> tuple[str, list[str]]:
    cpu, flags = "", []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not cpu:
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = line.split(":", 1)[1].split()
            if cpu and flags:
                break
    except OSError:
        pass
    return cpu or platform.processor() or platform.machine(), flags


def cpu_model() -> str:
    return _cpuinfo()[0]


def cpu_flags() -> list[str]:
    """The vector extensions of the CPU (AVX, AVX2, FMA, F16C, AVX-VNNI, AVX-512*, AMX*), in cpuinfo's order."""
    return [f for f in _cpuinfo()[1] if SIMD_FLAGS.fullmatch(f)]


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def machine_line(load_avg: bool = False, python: bool = False) -> str:
    """``<CPU model>; <n> cores; flags: <SIMD flags>`` (+ ``; load average ...``, ``; Python x.y.z``)."""
    line = f"{cpu_model()}; {os.cpu_count()} cores; flags: {' '.join(cpu_flags()) or 'none'}"
    numba_cpu = os.environ.get("NUMBA_CPU_NAME")
    if numba_cpu:
        line += f"; Numba target {numba_cpu}"
    if load_avg:
        line += f"; load average {load()}"
    if python:
        line += f"; Python {platform.python_version()}"
    return line


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


# -- llama.cpp's binaries ------------------------------------------------------------------------------


def llamacpp_bin(arch: str | None = None) -> Path:
    """The directory of llama.cpp's tools: ``$LLAMACPP_BIN``, else the cache build for ``arch`` (``native`` or
    ``avx2``; default ``$LLAMACPP_ARCH`` or native)."""
    env = os.environ.get("LLAMACPP_BIN")
    if env:
        return Path(env)
    arch = arch or os.environ.get("LLAMACPP_ARCH", "native")
    build = "build-avx2" if arch == "avx2" else "build"
    return CACHE / "llamacpp" / LLAMACPP_VERSION / build / "bin"


def llamacpp_tool(name: str, arch: str | None = None) -> Path | None:
    p = llamacpp_bin(arch) / name
    return p if p.is_file() and os.access(p, os.X_OK) else None


def require_tool(name: str, arch: str | None = None) -> Path:
    p = llamacpp_tool(name, arch)
    if p is None:
        a = "LLAMACPP_ARCH=avx2 " if (arch or os.environ.get("LLAMACPP_ARCH")) == "avx2" else ""
        raise SystemExit(
            f"error: {name} not found in {llamacpp_bin(arch)} "
            f"(build it: {a}LLAMACPP_TOOLS={name} benchmarks/build_llamacpp.sh {LLAMACPP_VERSION})"
        )
    return p


def llamapy_cmd(*args: str) -> list[str]:
    """``python -m llamapy ...`` with this interpreter."""
    return [sys.executable, "-m", "llamapy", *args]


# -- servers ------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A running ``llama-server`` or ``llamapy serve``; stop() (or leaving the ``with``) ends it."""

    def __init__(self, cmd: list[str], port: int, env: dict[str, str] | None = None, timeout: float = 300,
                 log: Path | None = None) -> None:  # fmt: skip
        self.cmd, self.base = cmd, f"http://127.0.0.1:{port}"
        self._tail: deque[str] = deque(maxlen=50)
        self._log = open(log, "w") if log else None  # noqa: SIM115 (open for the server's lifetime)
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, errors="replace")  # fmt: skip
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self.proc.poll() is not None:
                    self._reader.join(5)  # its last words
                    self.stop()
                    raise RuntimeError(
                        f"{cmd[0]} exited ({self.proc.returncode}): {self.stderr_tail()[-800:]}"
                    )
                try:
                    with urllib.request.urlopen(self.base + "/health", timeout=2) as resp:
                        if resp.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"the server did not become healthy in {timeout:.0f} s: {' '.join(cmd)}"
                    )
                time.sleep(0.05)
        except BaseException:  # interrupted (Ctrl-C, SIGTERM): no orphaned server
            self.stop()
            raise
        self.seconds = time.perf_counter() - t0  # start until /health said ok

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._tail.append(line)
            if self._log:
                self._log.write(line)
                self._log.flush()

    def stderr_tail(self) -> str:
        return "".join(self._tail)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # the reader writes the pipe's last lines into the log: let it finish before the log closes (a
        # server's final lines were lost, and a write could hit the closed file, when the test host was busy)
        self._reader.join(5)
        if self._log:
            self._log.close()
            self._log = None

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def server_cmd(
    tool: str,
    model: str | Path,
    args: Sequence[str] = (),
    port: int = 0,
    arch: str | None = None,
    bin_dir: Path | None = None,
) -> list[str]:
    """The command line of ``tool`` (``llama.cpp`` or ``llamapy``) serving ``model`` on 127.0.0.1:``port``."""
    common = ["-m", str(model), "--host", "127.0.0.1", "--port", str(port), *args]
    if tool == "llama.cpp":
        exe = bin_dir / "llama-server" if bin_dir else require_tool("llama-server", arch)
        return [str(exe), *common]
    if tool == "llamapy":
        return llamapy_cmd("serve", *common)
    raise ValueError(f"unknown server {tool!r} (llama.cpp or llamapy)")


def start_server(tool: str, model: str | Path, args: Sequence[str] = (), *, env: dict[str, str] | None = None,
                 timeout: float = 300, log: Path | None = None, arch: str | None = None,
                 bin_dir: Path | None = None) -> Server:  # fmt: skip
    """Start ``llama-server`` (``tool="llama.cpp"``; from ``bin_dir``, else ``llamacpp_bin(arch)``) or ``llamapy
    serve`` (``"llamapy"``) on a free port with ``args`` (e.g. ``["-c", "1024", "-t", "2", "-np", "1"]``);
    returns once ``/health`` is 200 (RuntimeError with the server's last stderr lines otherwise)."""
    port = free_port()
    cmd = server_cmd(tool, model, args, port, arch, bin_dir)
    return Server(cmd, port, env=env, timeout=timeout, log=log)


# -- rounds, medians, timed processes -----------------------------------------------------------------


def exit_on_sigterm() -> None:
    """SIGTERM raises SystemExit, so that the children a benchmark started (servers, subprocess.run) are ended."""
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def interleave(rounds: int, tools: Sequence[str]) -> Iterator[tuple[int, str]]:
    """(round, tool) for ``rounds`` rounds, the tools' order reversed every other round (A B, B A, ...)."""
    for r in range(rounds):
        for tool in tools if r % 2 == 0 else tuple(reversed(tools)):
            yield r, tool


def median(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def run_timed(
    cmd: Sequence[str], env: dict[str, str] | None = None, timeout: float | None = None
) -> dict[str, Any]:
    """Run ``cmd`` (stdin closed, output discarded); ``{"seconds", "rss_mb", "rc"}``: its wall time and peak
    resident memory. The peak comes from GNU time (``/usr/bin/time -f %M``) where present: a child forked from
    this process would otherwise carry this process's own peak in its ``ru_maxrss`` (Linux counts the memory
    image it had before exec); without GNU time, ``wait4``'s rusage, an upper bound."""
    import tempfile

    gnu_time = Path("/usr/bin/time")
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as f:
        full = [str(gnu_time), "-f", "%M", "-o", f.name, *cmd] if gnu_time.exists() else list(cmd)
        t0 = time.perf_counter()
        proc = subprocess.Popen(full, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # fmt: skip
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    proc.kill()
                    pid, status, ru = os.wait4(proc.pid, 0)
                    break
                time.sleep(0.005)
        except BaseException:
            proc.kill()
            raise
        seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        rss_mb = ru.ru_maxrss / 1024
        if gnu_time.exists():
            lines = [x for x in f.read().split() if x.isdigit()]
            rss_mb = int(lines[-1]) / 1024 if lines else float("nan")
    return {"seconds": seconds, "rss_mb": rss_mb, "rc": proc.returncode}


def run_json(cmd: Sequence[str], env: dict[str, str] | None = None, timeout: float | None = None) -> Any:
    """Run ``cmd`` and parse its stdout as JSON (llama-bench / ``llamapy bench -o json``); None on failure."""
    try:
        r = subprocess.run(list(cmd), env=env, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)  # fmt: skip
    except subprocess.TimeoutExpired:
        return None
    if r.returncode != 0:
        sys.stderr.write(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-600:]}\n")
        return None
    try:
        return json.loads(r.stdout)
    except json.JSONDecodeError:
        return None


# -- bandwidth and bytes per token ----------------------------------------------------------------------


def huge_copies(R: Any, total_mb: float) -> tuple[list[Any], list[Any]]:
    """Copies of the array ``R`` in fresh huge-page memory, as ``repack`` allocates a model's weights
    (``max(2, total_mb / size)`` of them: cycled through, past the caches, they are what a decode step
    reads from DRAM): ``(copies, keep)``, ``keep`` the mappings the copies are views of (drop it with the
    copies)."""
    import numpy as np

    from llamapy.ggml.cpu.repack import _huge_mapping, _huge_start

    keep, copies = [], []
    for _ in range(max(2, int(total_mb * 1e6 // R.nbytes))):
        m = _huge_mapping(R.nbytes + (2 << 20))
        if m is None:  # no private anonymous mapping on this platform
            c = np.empty_like(R)
        else:
            keep.append(m)
            c = np.frombuffer(m, np.uint8, count=R.nbytes, offset=_huge_start(m)).reshape(R.shape)
        c[:] = R
        copies.append(c)
    return copies, keep


def q4k_x8_copies(n: int, k: int, total_mb: float, rng: Any) -> tuple[Any, list[Any], list[Any]]:
    """A random ``n`` x ``k`` Q4_K weight repacked eight rows at a time (``q4k_x8_kernels.repack_x8``) and
    its ``huge_copies``: ``(R, copies, keep)``."""
    import numpy as np

    from llamapy.ggml import GGMLType
    from llamapy.ggml.cpu import q4k_x8_kernels as qk
    from llamapy.ggml.quants import quantize

    A = np.ascontiguousarray(quantize(rng.standard_normal((n, k)).astype(np.float32), GGMLType.Q4_K))
    A = A.view(np.uint8).reshape(n, -1)
    R = np.empty((n // 8, A.shape[1] // 144 * qk.X8_BYTES), np.uint8)
    qk.repack_x8(A, R)
    copies, keep = huge_copies(R, total_mb)
    return R, copies, keep


@functools.cache
def read_kernel(ahead: int) -> Any:
    """A compiled parallel streaming read of a ``float32[rows, 64]`` array: 64 independent accumulators per
    thread (8 AVX2 lanes x 8, so the adds never wait on each other), with a software prefetch ``ahead`` rows
    (of 256 B) ahead, none for 0."""
    import numba
    import numpy as np

    from llamapy.ggml.cpu.simd import prefetch

    @numba.njit(parallel=True, fastmath=True, cache=False)
    def _read(a: Any) -> float:  # pragma: no cover - compiled
        n = a.shape[0]
        chunks = 256
        acc = np.zeros((chunks, 64), np.float32)
        step = (n + chunks - 1) // chunks
        flat = a.reshape(-1)
        for c in numba.prange(chunks):
            loc = np.zeros(64, np.float32)
            end = min(n, (c + 1) * step)
            for i in range(c * step, end):
                if ahead:
                    k = min(i + ahead, n - 1) * 64
                    prefetch(flat, k)
                    prefetch(flat, k + 16)
                    prefetch(flat, k + 32)
                    prefetch(flat, k + 48)
                for j in range(64):
                    loc[j] += a[i, j]
            acc[c] = loc
        return acc.sum()

    return _read


def read_bandwidth(threads: int = 2, mib: int = 1024, reps: int = 5) -> float:
    """GB/s (1e9 bytes/s) of a ``threads``-thread read over ``mib`` MiB, best of ``reps``: ``read_kernel``
    with and without a software prefetch 2 KiB ahead (the mat-vec kernels prefetch; a VM's hardware
    prefetcher alone may not reach the limit), the faster of the two. The limit a decode's bytes per token
    is held against, so it must not be a latency-bound loop (a serial sum here gave 12 GB/s where the
    mat-vec kernels read 22-26)."""
    import numpy as np

    from llamapy._numba import set_num_threads

    set_num_threads(threads)
    a = np.ones((mib * 2**20 // 256, 64), dtype=np.float32)
    best = float("inf")
    for fn in (read_kernel(0), read_kernel(8)):  # 8 rows of 256 B: 2 KiB ahead
        fn(a[:64])
        best = min(best, *(_timed(fn, a) for _ in range(reps)))
    return a.nbytes / best / 1e9


def _timed(f: Any, a: Any) -> float:
    t0 = time.perf_counter()
    f(a)
    return time.perf_counter() - t0


def bytes_per_token(path: str | Path) -> int:
    """Weight bytes one generated token reads: every matrix once (the token embedding only if it is also the
    output), MoE expert tensors (``*_exps``) by ``n_expert_used / n_expert``; the KV cache not counted."""
    from llamapy.cli.bench import weight_bytes_by_type

    return int(sum(weight_bytes_by_type(str(path)).values()))


# -- result files --------------------------------------------------------------------------------------


def write_results(
    name: str, markdown: str, data: Any = None, out_dir: Path = RESULTS
) -> tuple[Path, Path | None]:
    """``<out_dir>/<name>.md`` (and ``<name>.json`` when ``data`` is given); returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / f"{name}.md"
    md.write_text(markdown if markdown.endswith("\n") else markdown + "\n")
    js = None
    if data is not None:
        js = out_dir / f"{name}.json"
        js.write_text(json.dumps(data, indent=1, default=str) + "\n")
    return md, js


@contextlib.contextmanager
def env_vars(**kv: str | None) -> Iterator[None]:
    """Set (or with None, unset) environment variables for the block."""
    old = {k: os.environ.get(k) for k in kv}
    try:
        for k, v in kv.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
