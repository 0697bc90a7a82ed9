"""``llamapy quantize`` against llama.cpp's ``llama-quantize`` on SmolLM2-135M F16: wall time, CPU time and
whether the output files are byte-identical, per mix, both at the same thread count.

Runs alternate (llama, ours, llama, ours, ...) so that both see the same machine load; the load average
is recorded around every run, and CPU time (user + sys of the child) is reported beside wall time since
it depends less on what else runs. The F16 input is SmolLM2-135M-Instruct Q4_1 (tests/conftest.py's
model) requantized to F16 once; the imatrix for the IQ2 mixes comes from ``llama-imatrix`` on that
model over tests/data/quantize/gpl-3-head.txt (2 chunks of 128).

    python benchmarks/quantize_vs_llamacpp.py [--threads 2] [--reps 3] [--mixes Q8_0,Q4_K_M,...]
        [--out benchmarks/results/quantize_vs_llamacpp.md]

On a tree others are editing, set ``NUMBA_CACHE_DIR`` to a fixed directory: the default cache directory
follows a digest of the kernel sources (llamapy/_numba.py), so an edit elsewhere meanwhile would make a
timed run recompile every kernel.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import datetime  # noqa: E402
import filecmp  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

from benchmarks.harness import llamacpp_bin  # noqa: E402

BIN = llamacpp_bin("avx2")
STORE = Path.home() / ".cache/llamapy"
MIXES = "Q8_0,Q4_K_M,Q5_K_M,Q6_K,Q3_K_S,Q2_K,IQ4_XS,IQ2_XXS+imatrix"


def machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return platform.processor()
    info = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    model = info.get("Model name", "?").strip()
    flags = set(info.get("Flags", "").split())
    simd = " ".join(f for f in ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw") if f in flags)
    return f"{model}, {os.cpu_count()} CPUs, flags: {simd}"


def timed(cmd: list[str]) -> tuple[float, float, float, str]:
    """(wall s, child CPU s, load average at the start, error) of one command."""
    load = os.getloadavg()[0]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    err = "" if p.returncode == 0 else (p.stderr.strip().splitlines() or ["failed"])[-1]
    return wall, cpu, load, err


def inputs(work: Path, binp: Path) -> tuple[Path, Path]:
    """The F16 model and the imatrix, made once and kept in ~/.cache/llamapy/bench."""
    src_q = STORE / "models/SmolLM2-135M-Instruct.Q4_1.gguf"
    f16 = work / "smollm2-135m-f16.gguf"
    imf = work / "smollm2-135m-imatrix.gguf"
    if not f16.exists():
        from llamapy.quantize import quantize_file

        quantize_file(src_q, f16, "F16", allow_requantize=True)
    if not imf.exists():
        text = ROOT / "tests/data/quantize/gpl-3-head.txt"
        cmd = [str(binp / "llama-imatrix"), "-m", str(src_q), "-f", str(text), "-o", str(imf), "--no-ppl"]
        cmd += ["-c", "128", "--chunks", "2", "-b", "256", "-t", "2"]
        subprocess.run(cmd, check=True, capture_output=True)
    return f16, imf


def warm_up() -> None:
    """Compile (or load) every Numba kernel a timed run uses, so no run pays for it."""
    code = (
        "import numpy as np\nfrom llamapy.ggml.quants import quantize\nfrom llamapy.ggml.types import GGMLType as T\n"
        "x = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)\n"
        "w = np.ones(256, np.float32)\n"
        "for t in 'Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS IQ2_XXS IQ2_XS IQ3_XXS'.split():\n"
        "    quantize(x, T[t], w)\n"
        "    quantize(x, T[t]) if t[:2] != 'IQ' or t.startswith('IQ4') else None\n"
        "from llamapy.ggml.quants._rowq import f16_to_f32\n"
        "f16_to_f32(np.zeros((2, 8), np.uint8))\n"
        "f16_to_f32(np.zeros((2, 8), np.uint8), exact_nan=False)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", type=Path, default=BIN, help="llama.cpp's bin directory (llama-quantize)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--mixes", default=MIXES)
    ap.add_argument("--work", type=Path, default=STORE / "bench")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/quantize_vs_llamacpp.md")
    a = ap.parse_args()
    if not (a.bin / "llama-quantize").exists():
        print(
            f"error: no llama-quantize in {a.bin} (benchmarks/build_llamacpp.sh builds it)", file=sys.stderr
        )
        return 1
    a.work.mkdir(parents=True, exist_ok=True)
    f16, imf = inputs(a.work, a.bin)
    warm_up()
    rows = []
    loads = []
    for spec in a.mixes.split(","):
        mix, _, im = spec.partition("+")
        imx = ["--imatrix", str(imf)] if im else []
        ref, ours = a.work / "ref.gguf", a.work / "ours.gguf"
        lw, lc, ow, oc = [], [], [], []
        err = ""
        for _ in range(a.reps):
            ref.unlink(missing_ok=True)
            ours.unlink(missing_ok=True)
            w, c, ld, e1 = timed(
                [str(a.bin / "llama-quantize"), *imx, str(f16), str(ref), mix, str(a.threads)]
            )
            lw.append(w)
            lc.append(c)
            loads.append(ld)
            w, c, ld, e2 = timed(
                [
                    sys.executable,
                    "-m",
                    "llamapy",
                    "quantize",
                    "-q",
                    *imx,
                    str(f16),
                    str(ours),
                    mix,
                    str(a.threads),
                ]
            )
            ow.append(w)
            oc.append(c)
            loads.append(ld)
            err = e1 or e2
            if err:
                break
        same = (
            "error: " + err[:60]
            if err
            else ("identical" if filecmp.cmp(ref, ours, shallow=False) else "DIFFER")
        )
        med = statistics.median
        row = (
            f"| {spec} | {med(lw):.2f} | {med(ow):.2f} | {med(ow) / med(lw):.2f} | {med(lc):.2f} | {med(oc):.2f} "
            f"| {med(oc) / med(lc):.2f} | {same} |"
        )
        print(row, flush=True)
        rows.append(row)
    ref.unlink(missing_ok=True)
    ours.unlink(missing_ok=True)
    loads.append(os.getloadavg()[0])
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = [
        "# llamapy quantize vs llama-quantize (SmolLM2-135M F16)",
        "",
        f"{now}, `python benchmarks/quantize_vs_llamacpp.py --threads {a.threads} --reps {a.reps}`.",
        f"Machine: {machine()}. llama.cpp: {a.bin} (AVX2 build of the 0.3.36 sdist).",
        f"1-minute load average at the start of the runs: min {min(loads):.1f}, median "
        f"{statistics.median(loads):.1f}, max {max(loads):.1f} (other work shared the machine).",
        "",
        f"Median of {a.reps} runs each, alternating llama-quantize / `llamapy quantize` (the command, Python "
        f"start-up included), both with {a.threads} threads. CPU = user + sys of the process. Bytes: the two "
        "output files compared whole.",
        "",
        "| mix | llama-quantize wall s | llamapy wall s | ratio | llama-quantize CPU s | llamapy CPU s | ratio "
        "| bytes |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    a.out.write_text("\n".join(text))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
