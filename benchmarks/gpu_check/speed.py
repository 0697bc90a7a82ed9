"""Speed phase of the GPU check: ``llamapy bench`` (its ``bench()``, one process, so the CUDA kernels
compile once) at ``-ngl 99`` on each file, and the device-to-device copy rate measured with CuPy in the
same run, so that the gap between decode's achieved memory bandwidth and the chip's is a number.

Achieved GB/s of a ``tg`` test = (bytes of the weight matrices one token reads, the token embedding only
where it is also the output; plus the F16 K and V cells attention reads at the test's mean depth) x t/s.
The copy rate counts the bytes read plus the bytes written (``cudaMemcpyAsync`` device to device of
1 GiB, timed with CUDA events), the way bandwidth tools report it; decode only reads, so 100% of it is
the physical limit. ``pp`` tests also get TFLOP/s (2 x weights' parameters x tokens / s).

Each test is one JSON line in ``--jsonl`` as it finishes (bench's record plus the derived figures); a
test is not started after ``--deadline`` (Unix time). Exit 1 when a test failed.

    python -m benchmarks.gpu_check.speed --jsonl speed.jsonl --md speed.md FILE[=TESTS]... [--tests pp512,tg128]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any


def copy_rate(nbytes: int = 1 << 30, iters: int = 20) -> dict[str, Any]:
    """Device-to-device copy rate (GB/s, read + written) with CuPy; ``{"error": ...}`` where it cannot."""
    try:
        import cupy as cp

        a = cp.ones(nbytes, dtype=cp.uint8)
        b = cp.empty_like(a)
        rt = cp.cuda.runtime
        stream = cp.cuda.Stream(non_blocking=True)
        for _ in range(3):  # warm-up
            rt.memcpyAsync(b.data.ptr, a.data.ptr, nbytes, rt.memcpyDeviceToDevice, stream.ptr)
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        for _ in range(iters):
            rt.memcpyAsync(b.data.ptr, a.data.ptr, nbytes, rt.memcpyDeviceToDevice, stream.ptr)
        end.record(stream)
        end.synchronize()
        ms = cp.cuda.get_elapsed_time(start, end)
        props = rt.getDeviceProperties(cp.cuda.Device().id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        del a, b
        cp.get_default_memory_pool().free_all_blocks()
        return {
            "copy_gbs": 2 * nbytes * iters / (ms / 1e3) / 1e9,
            "gpu": name,
            "bytes": nbytes,
            "iters": iters,
        }
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def parse_test(spec: str) -> tuple[int, int, int]:
    """``pp512`` -> (512, 0, 0); ``tg128`` -> (0, 128, 0); ``tg128@4096`` -> (0, 128, 4096)."""
    head, _, depth = spec.partition("@")
    kind, n = head[:2], int(head[2:])
    if kind not in ("pp", "tg"):
        raise ValueError(f"test {spec!r}: ppN or tgN[@DEPTH]")
    return (n, 0, int(depth or 0)) if kind == "pp" else (0, n, int(depth or 0))


def model_bytes(path: Path) -> tuple[float, float, dict[str, Any]]:
    """(weight bytes one decoded token reads, weight parameters multiplied per token, shape facts)."""
    from llamapy.cli.bench import weight_bytes_by_type
    from llamapy.gguf.reader import GGUFReader

    wb = sum(weight_bytes_by_type(str(path)).values())
    r = GGUFReader(path)
    arch = r.get("general.architecture")
    names = {t.name for t in r.tensors}
    params = sum(
        int(t.ne[0]) * int(t.ne[1])
        for t in r.tensors
        if len(t.ne) >= 2 and not (t.name == "token_embd.weight" and "output.weight" in names)
    )
    n_layer = int(r.get(f"{arch}.block_count"))
    kv = int(r.get(f"{arch}.attention.head_count_kv")) * int(r.get(f"{arch}.attention.key_length"))
    return wb, params, {"n_layer": n_layer, "kv_dim": kv}


def run(
    plan: list[tuple[Path, list[str]]], reps: int, deadline: float, jsonl: Path, md: Path
) -> tuple[bool, list[str]]:
    """Each file's tests in order; the copy rate first."""
    from llamapy.cli.bench import bench

    cr = copy_rate()
    copy = cr.get("copy_gbs")
    head = [
        f"device-to-device copy (CuPy, 1 GiB x {cr.get('iters', '?')}, read + written): "
        + (f"**{copy:.0f} GB/s** on {cr['gpu']}" if copy else f"not measured ({cr.get('error')})"),
        "",
        "| file | test | t/s | ± | GB/s read | % of copy rate | TFLOP/s | s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    rows, ok = [], True
    with jsonl.open("a") as jf:
        jf.write(json.dumps({"copy_rate": cr}) + "\n")
        for f, tests in plan:
            try:
                wb, params, facts = model_bytes(f)
            except Exception as e:
                ok = False
                rows.append(
                    f"| {f.name} | {','.join(tests)} | **ERROR** {type(e).__name__}: {str(e)[:200]} | | | | | |"
                )
                continue
            for spec in tests:
                if time.time() > deadline:
                    rows.append(f"| {f.name} | {spec} | out of time: not run | | | | | |")
                    continue
                p, g, d = parse_test(spec)
                t0 = time.perf_counter()
                try:
                    rec = bench(
                        str(f), [p] if p else [], [g] if g else [], reps=reps, n_depth=[d], n_gpu_layers=99
                    )[0]
                except Exception as e:
                    traceback.print_exc()
                    ok = False
                    rows.append(
                        f"| {f.name} | {spec} | **ERROR** {type(e).__name__}: {str(e)[:200]} | | | | | |"
                    )
                    jf.write(
                        json.dumps({"file": f.name, "test": spec, "error": f"{type(e).__name__}: {e}"}) + "\n"
                    )
                    jf.flush()
                    continue
                secs = time.perf_counter() - t0
                ts = rec["avg_ts"]
                gbs = pct = tflops = None
                if g:
                    kv = 2 * facts["n_layer"] * facts["kv_dim"] * 2 * (d + g / 2)  # K and V, F16, mean depth
                    gbs = (wb + kv) * ts / 1e9
                    pct = 100 * gbs / copy if copy else None
                else:
                    tflops = 2 * params * ts / 1e12
                rec.update(file=f.name, test=spec, read_gbs=gbs, pct_of_copy=pct, tflops=tflops, wall_s=secs,
                           weight_bytes_per_token=wb)  # fmt: skip
                jf.write(json.dumps(rec) + "\n")
                jf.flush()
                if not ts > 0:
                    ok = False
                rows.append(
                    f"| {f.name} | {spec} | {ts:.2f} | {rec['stddev_ts']:.2f} | "
                    f"{'' if gbs is None else f'{gbs:.1f}'} | {'' if pct is None else f'{pct:.1f}%'} | "
                    f"{'' if tflops is None else f'{tflops:.2f}'} | {secs:.1f} |"
                )
                print(rows[-1], f"({rec['gpu_info']}, backends {rec['backends']})", flush=True)
                md.write_text("\n".join(head + rows) + "\n")  # so far (the run may be cut short)
    return ok, head + rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="FILE or FILE=TESTS (that file's own comma list)")
    ap.add_argument("--tests", default="pp512,tg128,tg128@4096", help="default comma list of tests")
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--jsonl", type=Path, required=True)
    ap.add_argument("--md", type=Path, required=True)
    ap.add_argument("--deadline", type=float, default=float("inf"))
    a = ap.parse_args(argv)
    plan = []
    for item in a.files:
        path, _, spec = item.partition("=")
        tests = [t.strip() for t in (spec or a.tests).split(",") if t.strip()]
        for t in tests:
            parse_test(t)
        plan.append((Path(path), tests))
    try:
        ok, lines = run(plan, a.reps, a.deadline, a.jsonl, a.md)
    except Exception as e:
        traceback.print_exc()
        ok, lines = False, [f"**ERROR** {type(e).__name__}: {e}"]
    print("\n".join(lines), flush=True)
    a.md.write_text("\n".join(lines) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
