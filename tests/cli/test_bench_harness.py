"""The benchmark harness (``benchmarks/harness.py``), the shaped files' dimensions (``benchmarks/shaped.py``) and
``llamapy bench --profile``'s per-type kernel rates: cheap checks, no benchmark is run."""

from __future__ import annotations

import sys
import time
import urllib.request
from pathlib import Path

import pytest

from benchmarks import harness as H
from benchmarks import shaped
from llamapy.cli.bench import kernel_rates, weight_bytes_by_type
from llamapy.ggml.types import GGMLType
from tests.model.tiny import tiny_llama


def test_machine_line_and_rounds():
    line = H.machine_line(load_avg=True, python=True)
    assert f"; {__import__('os').cpu_count()} cores; flags: " in line and "load average" in line
    assert list(H.interleave(3, ("a", "b"))) == [(0, "a"), (0, "b"), (1, "b"), (1, "a"), (2, "a"), (2, "b")]
    assert H.median([3.0, 1.0, 2.0]) == 2.0 and H.median([]) != H.median([])  # nan when empty


def test_llamacpp_bin(monkeypatch, tmp_path):
    monkeypatch.delenv("LLAMACPP_BIN", raising=False)
    monkeypatch.delenv("LLAMACPP_ARCH", raising=False)
    assert H.llamacpp_bin().name == "bin" and H.llamacpp_bin().parent.name == "build"
    assert H.llamacpp_bin("avx2").parent.name == "build-avx2"
    monkeypatch.setenv("LLAMACPP_BIN", str(tmp_path))
    assert H.llamacpp_bin("avx2") == tmp_path and H.llamacpp_tool("llama-bench") is None
    with pytest.raises(SystemExit, match="llama-bench not found in .*build_llamacpp.sh"):
        H.require_tool("llama-bench")


def test_run_timed_peak_rss():
    m = H.run_timed([sys.executable, "-c", "b = bytearray(80 << 20); b[::4096] = b'x' * len(b[::4096])"])
    assert m["rc"] == 0 and m["rss_mb"] > 80 and 0 < m["seconds"] < 60
    assert H.run_timed([sys.executable, "-c", "raise SystemExit(3)"])["rc"] == 3
    if Path("/usr/bin/time").exists():  # the child's own peak, not this (larger) process's
        big = bytearray(300 << 20)
        big[::4096] = b"x" * len(big[::4096])
        assert H.run_timed([sys.executable, "-c", "pass"])["rss_mb"] < 150


HEALTH = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): sys.stderr.write("request\\n"); sys.stderr.flush()
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_server_started_and_stopped(tmp_path):
    port = H.free_port()
    with H.Server([sys.executable, "-c", HEALTH, str(port)], port, timeout=30, log=tmp_path / "s.log") as srv:
        assert srv.base == f"http://127.0.0.1:{port}" and srv.seconds < 30 and srv.proc.poll() is None
        assert (
            urllib.request.urlopen(srv.base + "/health", timeout=10).read() == b"ok"
        )  # logged before it ends
    assert srv.proc.poll() is not None and "request" in (tmp_path / "s.log").read_text()
    t0 = time.monotonic()  # a server that dies at once: a clear error with its stderr, not a wait
    with pytest.raises(RuntimeError, match="exited .*no such model"):
        H.Server([sys.executable, "-c", "import sys; sys.exit('no such model')"], H.free_port(), timeout=60)
    assert time.monotonic() - t0 < 20
    assert H.server_cmd("llamapy", "m.gguf", ["-c", "64"], 8080)[-6:] == [
        "m.gguf", "--host", "127.0.0.1", "--port", "8080", "-c", "64"][-6:]  # fmt: skip


def test_write_results(tmp_path):
    md, js = H.write_results("x", "# t", {"a": 1}, out_dir=tmp_path)
    assert md.read_text() == "# t\n" and js is not None and '"a": 1' in js.read_text()


@pytest.mark.parametrize(
    "shape, params",
    [("qwen2.5-0.5b", 0.494e9), ("qwen2.5-1.5b", 1.54e9), ("llama-3.2-3b", 3.21e9), ("qwen2.5-7b", 7.62e9),
     ("llama-3.1-8b", 8.03e9)],
)  # fmt: skip
def test_shaped_dims_are_the_models(shape, params):
    n = shaped.f16_bytes(shape)  # F16 matrices, F32 norms and biases: ~2 bytes a parameter
    assert abs(n / 2 - params) / params < 0.01


def test_weight_bytes_and_kernel_rates(tmp_path):
    path = tiny_llama(tmp_path / "t.gguf", ggml_type=GGMLType.Q8_0)
    by = weight_bytes_by_type(str(path))
    assert set(by) <= {"Q8_0", "F32", "F16"} and by["Q8_0"] > 0
    assert H.bytes_per_token(path) == int(sum(by.values()))
    cpu = str(Path("llamapy") / "ggml" / "cpu" / "k.py")
    stats = type(
        "S",
        (),
        {
            "stats": {
                (cpu, 1, "mm_q8_0"): (10, 10, 0.5, 0.5, {}),
                ("x.py", 1, "mm_q8_0"): (1, 1, 9.0, 9.0, {}),
            }
        },
    )()
    table = kernel_rates(str(path), stats, 10)
    row = next(r for r in table.splitlines() if r.startswith("Q8_0"))
    assert "mm_q8_0 (10)" in row and f"{by['Q8_0'] * 10 / 0.5 / 1e9:7.2f}" in row


def test_vs_llamacpp_commands_and_report():
    from benchmarks import vs_llamacpp as V

    tests = [(0, 16, 0), (64, 0, 0), (0, 16, 4096)]
    cmd = V.bench_cmd("llama.cpp", Path("m.gguf"), tests, 2, 3, Path("/b"), 0)
    assert (
        cmd[0] == "/b/llama-bench" and cmd[cmd.index("-p") + 1] == "64" and cmd[cmd.index("-n") + 1] == "16"
    )
    cmd = V.bench_cmd("llamapy", Path("m.gguf"), tests, 2, 3, Path("/b"), 4096)
    assert cmd[1:4] == ["-m", "llamapy", "bench"] and cmd[cmd.index("-p") + 1] == "0" and "4096" in cmd
    assert {i.label for i in V.QUICK} <= {i.label for i in V.FULL}
    data = {
        "machine": "cpu; 2 cores; flags: avx2", "when": "now", "threads": 2, "rounds": 2, "llamacpp_bin": "/b",
        "bandwidth_gbs": 10.0, "load_start": "1", "load_end": "1",
        "files": {
            "A": {"path": "a", "note": "", "bytes_per_token": 1e9, "hello": {},
                  "tests": {"tg16": {"llama.cpp": [2.0, 4.0, 3.0], "llamapy": [3.0, 3.3, 3.6]}}},
            "B": {"path": None, "note": "skipped: no disk", "tests": {}, "hello": {}},
            "C": {"path": "c", "note": "", "bytes_per_token": 1e8, "tests": {},
                  "hello": {"llama.cpp": [{"seconds": s, "rss_mb": 100.0, "pair": i} for i, s in enumerate([1, 4, 2])],
                            "llamapy": [{"seconds": s, "rss_mb": 110.0, "pair": i}
                                        for i, s in enumerate([1.5, 2, 3])]}},
        },
    }  # fmt: skip
    md = V.report(data, "cmd")
    assert "| A | tg16 | 3.00 | 3.30 | 1.10x | 3.3 | 33% |" in md
    # medians 2.00 and 2.00; the pairs' ratios 1.5, 0.5, 1.5: their median 1.50
    assert "| C | 2.00 | 2.00 | 1.00x | 1.50x | 100 | 110 | 1.10x |" in md and "- B: skipped: no disk" in md
    for runs in data["files"]["C"]["hello"].values():  # a result file from before the runs alternated
        for m in runs:
            del m["pair"]
    assert "| C | 2.00 | 2.00 | 1.00x | —x | 100 | 110 | 1.10x |" in V.report(data, "cmd")
    # a probe per round: each round's GB/s against its own probe, the median of those fractions
    data["bandwidth_rounds"] = [10.0, 5.0, 12.0]
    data["files"]["A"]["tests"]["tg16"]["llamapy bandwidth"] = [10.0, 5.0, 12.0]
    md = V.report(data, "cmd")
    assert "| A | tg16 | 3.00 | 3.30 | 1.10x | 3.3 | 30% |" in md  # 30 %, 66 %, 30 %
    assert "10.0, 5.0, 12.0" in md
