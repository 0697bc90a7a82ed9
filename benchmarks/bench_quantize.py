"""``llamapy quantize`` against llama.cpp's ``llama-quantize``: the same type for every tensor, the
same bytes, and the wall time side by side.

For each test model (tests/quantize/models.py: dense 16 layers GQA 4, tied 8 layers GQA 3, 8 experts),
each mix, without and with a synthetic imatrix: both tools quantize the same F32 file; the per-tensor
types and the sha256 of every tensor's bytes are compared. ``--write-expectations`` stores
llama-quantize's tables (types + sha256) in tests/data/quantize/ for the CI tests, which then need no
llama.cpp. ``--smollm2`` also times a few mixes on SmolLM2-135M dequantized to F16.

    python benchmarks/bench_quantize.py [--bin DIR] [--threads 2] [--mixes Q4_K_M,Q8_0] [--models dense16]
        [--write-expectations] [--smollm2]
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/tokenize.py would shadow the standard library's tokenize module
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from benchmarks.harness import llamacpp_bin  # noqa: E402

BIN = llamacpp_bin("avx2")
EXPECT = ROOT / "tests/data/quantize"
# every mix of the issue (aliases Q3_K, Q4_K, Q5_K are the _M mixes)
MIXES = (
    "Q2_K Q2_K_S Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 IQ1_S IQ1_M "
    "IQ2_XXS IQ2_XS IQ2_S IQ2_M IQ3_XXS IQ3_XS IQ3_S IQ3_M IQ4_NL IQ4_XS TQ1_0 TQ2_0 MXFP4_MOE F16 BF16 F32 COPY"
).split()


def table(path: Path) -> dict[str, tuple[str, str]]:
    """tensor name -> (type name, sha256 of its bytes) of a GGUF file."""
    from llamapy.gguf.reader import GGUFReader

    with GGUFReader(path) as r:
        return {t.name: (t.ggml_type.name, hashlib.sha256(t.data.tobytes()).hexdigest()) for t in r.tensors}


def have_llama(binp: Path) -> bool:
    return (binp / "llama-quantize").exists() or (binp / "libllama.so").exists()


def run_llama(binp: Path, src: Path, dst: Path, mix: str, im: Path | None, threads: int) -> tuple[float, str]:
    """llama-quantize, or when only the library is built, its ``llama_model_quantize`` through ctypes
    (benchmarks/llama_quantize_ctypes.py; the same quantizer, plus a Python start of ~0.1 s)."""
    if (binp / "llama-quantize").exists():
        cmd = [str(binp / "llama-quantize")]
    else:
        cmd = [sys.executable, str(ROOT / "benchmarks/llama_quantize_ctypes.py"), "--lib", str(binp)]
    cmd += (["--imatrix", str(im)] if im else []) + [str(src), str(dst), mix, str(threads)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    return dt, "" if p.returncode == 0 else (p.stderr.strip().splitlines() or ["failed"])[-1]


_ROW = re.compile(r"^\[\s*\d+/\s*\d+\]\s+(\S+)\s+- \[.*\], type =\s*(\S+),.*size = [^(]*(?:\((\S+)\))?\s*$")


def llama_types(binp: Path, src: Path, mix: str, im: Path | None) -> tuple[dict[str, str] | None, str]:
    """llama-quantize's per-tensor types from its --dry-run table (fast: nothing is quantized)."""
    cmd = [sys.executable, str(ROOT / "benchmarks/llama_quantize_ctypes.py"), "--lib", str(binp), "--dry-run"]
    cmd += (["--imatrix", str(im)] if im else []) + [str(src), str(src) + ".none", mix, "1"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        return None, (p.stderr.strip().splitlines() or ["failed"])[-1]
    out = {}
    for line in p.stderr.splitlines():
        m = _ROW.match(line.strip())
        if m:
            out[m.group(1)] = (m.group(3) or m.group(2)).upper()
    return out, ""


def types_only(models: list[str], mixes: list[str], binp: Path, write: bool) -> int:
    """Types of every mix (dry runs of both tools); ``write`` merges them into the stored expectations."""
    from llamapy.quantize import QuantizeError, quantize_file
    from tests.quantize.models import write_imatrix, write_model

    bad = 0
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        for m in models:
            src = write_model(m, tmp / f"{m}.gguf")
            imf = write_imatrix(m, tmp / f"{m}-imatrix.gguf")
            path = EXPECT / f"{m}.json"
            expect = json.loads(path.read_text()) if path.exists() else {"names": None, "runs": {}}
            n_same = 0
            for mix in mixes:
                for im in (None, imf):
                    key = mix + ("+imatrix" if im else "")
                    ref, err = llama_types(binp, src, mix, im)
                    try:
                        ours = quantize_file(src, None, mix, imatrix=im, dry_run=True).types()
                    except QuantizeError as e:
                        ours = None
                        oerr = str(e)
                    if ref is None:
                        print(f"{m} {key}: llama-quantize refuses: {err[:80]}")
                        continue
                    if ours is None:
                        print(f"{m} {key}: DIFFER: llama ok, ours: {oerr}")
                        bad += 1
                        continue
                    # llama-quantize's dry run does not refuse a missing imatrix; a real run does
                    names = list(ref)
                    diff = [n for n in names if ref[n] != ours.get(n)]
                    if diff or names != list(ours):
                        print(f"{m} {key}: {len(diff)} types differ, e.g. {diff[:3]}")
                        bad += 1
                    else:
                        n_same += 1
                    if write:
                        expect["names"] = expect["names"] or names
                        run = expect["runs"].setdefault(key, {})
                        if "error" not in run:
                            run["types"] = [ref[n] for n in expect["names"]]
            print(f"{m}: {n_same} runs with the same types for every tensor")
            if write:
                EXPECT.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(expect, indent=0) + "\n")
    return bad


def run_ours(
    src: Path, dst: Path, mix: str, im: Path | None, threads: int, subproc: bool
) -> tuple[float, str]:
    if subproc:  # the command a user runs (start-up included)
        cmd = [sys.executable, "-m", "llamapy", "quantize", "-q"] + (["--imatrix", str(im)] if im else [])
        cmd += [str(src), str(dst), mix, str(threads)]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        return time.perf_counter() - t0, "" if p.returncode == 0 else p.stderr.strip().splitlines()[-1]
    from llamapy.quantize import QuantizeError, quantize_file

    t0 = time.perf_counter()
    try:
        quantize_file(src, dst, mix, imatrix=im, nthreads=threads)
    except QuantizeError as e:
        return time.perf_counter() - t0, str(e)
    return time.perf_counter() - t0, ""


def compare(models: list[str], mixes: list[str], binp: Path, threads: int, write: bool, subproc: bool) -> int:
    from tests.quantize.models import write_imatrix, write_model

    bad = 0
    llama_ok = have_llama(binp)
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        for m in models:
            src = write_model(m, tmp / f"{m}.gguf")
            imf = write_imatrix(m, tmp / f"{m}-imatrix.gguf")
            path = EXPECT / f"{m}.json"
            expect: dict = json.loads(path.read_text()) if path.exists() else {"names": None, "runs": {}}
            print(
                f"\n## {m}\n\n| mix | imatrix | llama-quantize s | llamapy s | types | bytes |\n|---|---|---|---|---|---|"
            )
            for mix in mixes:
                for im in (None, imf):
                    key = mix + ("+imatrix" if im else "")
                    lt = ot = float("nan")
                    lerr = oerr = ""
                    ref = ours = None
                    if llama_ok:
                        lp = tmp / "ref.gguf"
                        lp.unlink(missing_ok=True)
                        lt, lerr = run_llama(binp, src, lp, mix, im, threads)
                        ref = None if lerr else table(lp)
                    op = tmp / "ours.gguf"
                    op.unlink(missing_ok=True)
                    ot, oerr = run_ours(src, op, mix, im, threads, subproc)
                    ours = None if oerr else table(op)
                    if ref is None and ours is None:
                        types = bytes_ = (
                            f"both refuse ({oerr[:50]})" if llama_ok and lerr else f"ours: {oerr[:60]}"
                        )
                    elif ref is None or ours is None:
                        types = bytes_ = f"DIFFER: llama {lerr[:40] or 'ok'} / ours {oerr[:40] or 'ok'}"
                        bad += 1
                    else:
                        names = list(ref)
                        td_ = [n for n in names if ref[n][0] != ours.get(n, ("?",))[0]]
                        bd = [n for n in names if ref[n][1] != ours.get(n, ("", ""))[1]]
                        types = (
                            "same"
                            if not td_
                            else f"{len(td_)} differ: {td_[0]} {ref[td_[0]][0]} vs {ours.get(td_[0])}"
                        )
                        bytes_ = (
                            "identical"
                            if not bd
                            else f"{len(bd)}/{len(names)} differ ({', '.join(sorted({ref[n][0] for n in bd}))})"
                        )
                        bad += bool(td_) + bool(bd)
                    if write and llama_ok:
                        if ref is not None:
                            expect["names"] = expect["names"] or list(ref)
                            expect["runs"][key] = {
                                "types": [ref[n][0] for n in expect["names"]],
                                "sha256": [ref[n][1][:16] for n in expect["names"]],
                            }
                        else:
                            expect["runs"][key] = {"error": lerr}
                    print(
                        f"| {mix} | {'yes' if im else 'no'} | {lt:.2f} | {ot:.2f} | {types} | {bytes_} |",
                        flush=True,
                    )
            if write and llama_ok:
                EXPECT.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(expect, indent=0) + "\n")
    return bad


def smollm2(binp: Path, threads: int) -> None:
    """Wall time on a real model: SmolLM2-135M (Q4_1 from the store, dequantized to F16 once)."""
    from llamapy.quantize import quantize_file

    src_q = Path.home() / ".cache/llamapy/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    if not src_q.exists():
        print("SmolLM2 not in the store; skipped")
        return
    with tempfile.TemporaryDirectory() as td:
        f32 = Path(td) / "smollm2-f16.gguf"
        quantize_file(src_q, f32, "F16", allow_requantize=True)
        print(
            f"\n## SmolLM2-135M F16 -> mix, {threads} threads\n\n| mix | llama-quantize s | llamapy s (command) | bytes |"
        )
        print("|---|---|---|---|")
        for mix in ("Q8_0", "Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_XS"):
            lp, op = Path(td) / "ref.gguf", Path(td) / "ours.gguf"
            lp.unlink(missing_ok=True)
            op.unlink(missing_ok=True)
            lt, lerr = (
                run_llama(binp, f32, lp, mix, None, threads) if have_llama(binp) else (float("nan"), "absent")
            )
            ot, oerr = run_ours(f32, op, mix, None, threads, subproc=True)
            same = "-"
            if not lerr and not oerr:
                a, b = table(lp), table(op)
                same = "identical" if a == b else f"{sum(a[n] != b.get(n) for n in a)} tensors differ"
            print(f"| {mix} | {lt:.2f} | {ot:.2f} | {same} |", flush=True)


def imatrix_compare(binp: Path, write: bool, threads: int) -> None:
    """llama-imatrix and llamapy imatrix on SmolLM2-135M Q4_1 over the same text and chunks: the
    relative difference of every value; ``write`` stores a sample of llama-imatrix's entries."""
    import numpy as np

    from llamapy.quantize import load_imatrix

    model = Path.home() / ".cache/llamapy/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    text = ROOT / "tests/data/quantize/gpl-3-head.txt"
    args = ["-c", "128", "--chunks", "2", "-b", "256"]
    with tempfile.TemporaryDirectory() as td:
        ref, ours = Path(td) / "ref.gguf", Path(td) / "ours.gguf"
        t0 = time.perf_counter()
        if (binp / "llama-imatrix").exists():
            cmd = [str(binp / "llama-imatrix")]
        else:  # the library through ctypes (benchmarks/llama_imatrix_ctypes.py: its loop and callback)
            cmd = [sys.executable, str(ROOT / "benchmarks/llama_imatrix_ctypes.py"), "--lib", str(binp)]
        cmd += ["-m", str(model), "-f", str(text), "-o", str(ref), "--no-ppl", "-t", str(threads), *args]
        p = subprocess.run(cmd, capture_output=True, text=True)
        lt = time.perf_counter() - t0
        if p.returncode:
            print("llama-imatrix failed:", p.stderr[-2000:])
            return
        t0 = time.perf_counter()
        q = subprocess.run([sys.executable, "-m", "llamapy", "imatrix", "-m", str(model), "-f", str(text), "-o", str(ours),
                            "-t", str(threads), *args], capture_output=True, text=True, cwd=ROOT)  # fmt: skip
        ot = time.perf_counter() - t0
        if q.returncode:
            print("llamapy imatrix failed:", q.stderr[-2000:])
            return
        a, b = load_imatrix(ref), load_imatrix(ours)
        print(
            f"\n## imatrix, SmolLM2-135M Q4_1, 2 chunks of 128: llama-imatrix {lt:.1f} s, llamapy {ot:.1f} s"
        )
        print(
            f"entries: {len(a.entries)} vs {len(b.entries)}, same names: {set(a.entries) == set(b.entries)}"
        )
        worst, worst_name, rels = 0.0, "", []
        for name, e in a.entries.items():
            f = b.entries.get(name)
            if f is None or f.sums.shape != e.sums.shape or not np.array_equal(f.counts, e.counts):
                print(
                    f"  {name}: differs in shape or counts ({None if f is None else f.counts} vs {e.counts})"
                )
                continue
            rel = np.abs(f.sums.astype(np.float64) - e.sums) / np.maximum(np.abs(e.sums), 1e-30)
            rels.append(rel)
            if rel.max() > worst:
                worst, worst_name = float(rel.max()), name
        allr = np.concatenate(rels)
        print(f"relative difference: max {worst:.2e} ({worst_name}), median {np.median(allr):.2e}, "
              f"99th percentile {np.percentile(allr, 99):.2e}")  # fmt: skip
        if write:
            keep = {}
            for il in (0, 1, 15, 29):
                for w in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
                    name = f"blk.{il}.{w}.weight"
                    keep[name + ".sums"] = a.entries[name].sums
                    keep[name + ".counts"] = a.entries[name].counts
            EXPECT.mkdir(parents=True, exist_ok=True)
            np.savez_compressed(EXPECT / "imatrix_smollm2.npz", n_entries=len(a.entries), **keep)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", type=Path, default=BIN, help="llama.cpp's bin directory")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mixes", default=",".join(MIXES))
    ap.add_argument("--models", default="dense16,tied8,moe8")
    ap.add_argument(
        "--write-expectations", action="store_true", help="store llama-quantize's tables in tests/data"
    )
    ap.add_argument("--subprocess", action="store_true", help="time `llamapy quantize` as a command")
    ap.add_argument("--smollm2", action="store_true", help="also time SmolLM2-135M")
    ap.add_argument("--imatrix", action="store_true", help="also compare llama-imatrix on SmolLM2")
    ap.add_argument("--types-only", action="store_true", help="compare the types only (dry runs; fast)")
    a = ap.parse_args()
    os.environ.setdefault("LLAMAPY_FULL_EXIT", "1")
    bad = 0
    models, mixes = [m for m in a.models.split(",") if m], a.mixes.split(",")
    if models and a.types_only:
        bad = types_only(models, mixes, a.bin, a.write_expectations)
    elif models:
        bad = compare(models, mixes, a.bin, a.threads, a.write_expectations, a.subprocess)
    if a.imatrix:
        imatrix_compare(a.bin, a.write_expectations, a.threads)
    if a.smollm2:
        smollm2(a.bin, a.threads)
    print(f"\n{bad} differences")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
