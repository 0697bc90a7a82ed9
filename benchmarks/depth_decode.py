"""Token generation at depth (4096 / 16384 tokens of context), llamapy against llama.cpp, in CPU time.

The cache is filled once with ``depth`` random tokens by prompt batches (``--fill-threads`` threads, not
timed); then ``--n-gen`` single-token decodes run on 1 thread and their process CPU time
(``time.process_time`` / ``CLOCK_PROCESS_CPUTIME_ID``) is divided by the tokens. llamapy fills in one
context and restores the saved sequence into a 1-thread one; llama.cpp's side is
``depth_decode_llamacpp.c`` (built here against llama.cpp's ``libllama``), which fills on
``--fill-threads`` threads and then calls ``llama_set_n_threads(ctx, 1, 1)``. Both use an F16 cache;
llama.cpp runs with flash attention off and on. ``--kernels group,heads`` runs llamapy both with the per-query-head
decode kernel (``attn_heads_f16x8``, the one before ``attn_group_f16x8``) after one fill: a before/after.
``--attn-share`` also profiles llamapy's decode (cProfile on CPU time) for the attention kernels' share.

    python benchmarks/depth_decode.py MODEL.gguf --depths 0,4096,16384 [--kernels group,heads] [--llamacpp]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import llamacpp_bin, machine_line  # noqa: E402

HERE = Path(__file__).resolve().parent
ATTN_KERNELS = ("attn_group_f16x8", "attn_heads_f16x8", "attn_heads", "attn_split")


def llamapy_depth(
    path: str, depth: int, n_gen: int, fill_threads: int, kernels: list[str], share: bool
) -> dict:
    """{kernel: {cpu_ms, wall_ms[, attn_ms]}} per generated token, after one fill of ``depth`` tokens."""
    from llamapy.batch import Batch
    from llamapy.context import Context, ContextParams
    from llamapy.ggml.cpu import attn_decode
    from llamapy.model import Model

    model = Model.load(path)
    rng = np.random.default_rng(1)
    n_ctx = depth + n_gen + 16
    state = None
    t0 = time.perf_counter()
    if depth:
        fill = Context(model, ContextParams(n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=fill_threads))
        for p in range(0, depth, 512):
            n = min(512, depth - p)
            fill.decode(Batch.from_tokens(rng.integers(0, model.n_vocab, n), pos0=p))
        state = fill.state_seq_get_data(0)
        del fill
    res: dict = {"fill_s": time.perf_counter() - t0}
    use_group = attn_decode.use_group
    for kernel in kernels:
        # the step compiler looks use_group up at each graph build; a new context builds new graphs
        attn_decode.use_group = use_group if kernel == "group" else (lambda *a: False)
        ctx = Context(model, ContextParams(n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=1))
        r: dict = {}
        for run in ("time", "profile") if share else ("time",):
            ctx.memory.clear()
            if state is not None:
                ctx.state_seq_set_data(state, 0)
            ctx.decode(Batch.from_tokens(rng.integers(0, model.n_vocab, 1), pos0=depth))  # warm-up, compiles
            prof = cProfile.Profile(time.process_time) if run == "profile" else None
            c0, w0 = time.process_time(), time.perf_counter()
            if prof:
                prof.enable()
            for i in range(n_gen):
                ctx.decode(Batch.from_tokens(rng.integers(0, model.n_vocab, 1), pos0=depth + 1 + i))
            if prof:
                prof.disable()
                st = pstats.Stats(prof).stats  # type: ignore[attr-defined]
                r["attn_ms"] = 1e3 * sum(v[2] for k, v in st.items() if k[2] in ATTN_KERNELS) / n_gen
            else:
                r["cpu_ms"] = 1e3 * (time.process_time() - c0) / n_gen
                r["wall_ms"] = 1e3 * (time.perf_counter() - w0) / n_gen
        res[kernel] = r
        del ctx
    attn_decode.use_group = use_group
    return res


def llamacpp_depth(path: str, depth: int, n_gen: int, fa: int, fill_threads: int) -> dict:
    exe = Path(os.environ.get("DEPTH_DECODE_EXE", "/tmp/depth_decode_llamacpp"))
    bindir = llamacpp_bin("avx2")
    src = HERE / "depth_decode_llamacpp.c"
    if not exe.exists() or exe.stat().st_mtime < src.stat().st_mtime:
        root = bindir.parents[1]
        subprocess.run(["gcc", "-O2", "-o", str(exe), str(src), f"-I{root}/include", f"-I{root}/ggml/include",
                        f"-L{bindir}", "-lllama", f"-Wl,-rpath,{bindir}"], check=True)  # fmt: skip
    r = subprocess.run([str(exe), path, str(depth), str(n_gen), str(fa), str(fill_threads)], capture_output=True,
                       text=True, check=True)  # fmt: skip
    line = [x for x in r.stdout.splitlines() if x.startswith("llama.cpp")][-1]
    kv = dict(f.split("=") for f in line.split()[1:])
    return {"cpu_ms": float(kv["cpu_ms_per_tok"]), "wall_ms": float(kv["wall_ms_per_tok"]),
            "fill_s": float(kv["fill_s"])}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--depths", default="0,4096,16384")
    ap.add_argument("--n-gen", type=int, default=16)
    ap.add_argument("--fill-threads", type=int, default=2)
    ap.add_argument("--kernels", default="group", help="comma list of group, heads")
    ap.add_argument("--llamacpp", action="store_true", help="also llama.cpp, flash attention off and on")
    ap.add_argument("--no-llamapy", action="store_true")
    ap.add_argument("--attn-share", action="store_true")
    a = ap.parse_args(argv)
    print(machine_line(load_avg=True), flush=True)
    name = Path(a.model).name
    for d in (int(x) for x in a.depths.split(",")):
        if not a.no_llamapy:
            res = llamapy_depth(a.model, d, a.n_gen, a.fill_threads, a.kernels.split(","), a.attn_share)
            for kern in a.kernels.split(","):
                r = res[kern]
                share = f" attn {r['attn_ms']:.2f} ms" if "attn_ms" in r else ""
                print(f"{name} d{d} llamapy[{kern}] cpu {r['cpu_ms']:.2f} ms/token (wall {r['wall_ms']:.1f}){share}"
                      f" fill {res['fill_s']:.0f} s", flush=True)  # fmt: skip
        if a.llamacpp:
            for fa in (0, 1):
                r = llamacpp_depth(a.model, d, a.n_gen, fa, a.fill_threads)
                print(f"{name} d{d} llama.cpp fa={fa} cpu {r['cpu_ms']:.2f} ms/token (wall {r['wall_ms']:.1f})"
                      f" fill {r['fill_s']:.0f} s", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
