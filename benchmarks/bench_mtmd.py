"""Image encode time (vision tower + projector) for 224, 384 and 896 pixel images, llamapy's
``ClipModel.encode`` side by side with llama.cpp's ``llama-mtmd-cli`` on the same files (comparison only).

    python benchmarks/bench_mtmd.py [--sizes 224,384,896] [--layers 6] [--width 384] [--type f16] [--runs 3]
                                    [--threads N] [--out benchmarks/results/mtmd.md]

The files are gemma3 mmproj files with random weights (a SigLIP-small-like tower: ``--layers`` blocks,
``--width`` wide, 6 heads, FFN 4x; patch 14, or 16 for 384 px, and the 4x4 average pool) and the tiny
gemma3 text model they project into, written by the test converter (``tests/mtmd/convert.py``: needs the
``test`` extra, torch and transformers). llamapy is timed in-process after a warm-up encode (Numba cache
and graph warm); llama.cpp as ``llama-mtmd-cli -n 1 --chat-template gemma -c 2048`` (the tiny text model
has no template, and too small a context), reading its ``mtmd batch encoding done in N ms`` line
(``image slice encoded in N ms`` in older builds; both time the encode alone, after the warm-up encode
llama.cpp does when it loads the mmproj).
Both sides get the same thread count (``--threads``, default all cores). The llama.cpp binary comes from
benchmarks/build_llamacpp.sh (~/.cache/llamapy/llamacpp/<version>/build/bin, or ``--llama-cpp PATH``);
without it only llamapy runs. The table goes to stdout and to ``--out`` (benchmarks/results/mtmd.md) with
the machine line and the command. Only the gemma3 projector is timed: llama.cpp's ``ldp``/``ldpv2`` graph
assumes a 24x24 patch grid (336 px), so those types would not run at these sizes.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root (benchmarks.harness)
from benchmarks.harness import CACHE, llamacpp_tool, machine_line  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def patch_for(size: int) -> int:
    return 14 if (size // 14) % 4 == 0 and size % 14 == 0 else 16


def make_pair(size: int, layers: int, width: int, ftype: str, out: Path) -> tuple[Path, Path]:
    import transformers

    from llamapy.ggml.types import GGMLType
    from tests.mtmd import convert

    t = {"f32": GGMLType.F32, "f16": GGMLType.F16}[ftype]
    patch = patch_for(size)
    side = size // patch
    cfg = convert.gemma3_config(image_size=size, patch_size=patch, tokens_per_image=(side // 4) ** 2)
    v = cfg.vision_config
    v.hidden_size, v.num_hidden_layers, v.num_attention_heads, v.intermediate_size = (
        width,
        layers,
        6,
        4 * width,
    )
    import torch

    torch.manual_seed(0)
    hf = transformers.Gemma3ForConditionalGeneration(cfg).to(torch.float32).eval()
    from tests.model import hf_tiny

    vlm = convert.TinyVLM(hf, hf_tiny.hf_state_dict(hf), out)
    return vlm.text_gguf(), vlm.mmproj_gguf(t)


def find_mtmd_cli(given: str | None) -> str | None:
    if given:
        return given
    tool = llamacpp_tool("llama-mtmd-cli")
    return str(tool) if tool else None


def image_file(size: int, out: Path) -> Path:
    from PIL import Image

    p = out / f"img-{size}.png"
    if not p.exists():
        arr = np.random.default_rng(size).integers(0, 256, (size, size, 3), dtype=np.uint8)
        Image.fromarray(arr).save(p)
    return p


def time_llamapy(mmproj: Path, img: Path, runs: int, threads: int | None) -> tuple[float, int]:
    from llamapy.mtmd import ClipModel, load_image, preprocess_fixed

    cm = ClipModel(mmproj, n_threads=threads)
    hp = cm.hparams
    px = preprocess_fixed(load_image(img.read_bytes()), hp.image_size, hp.image_mean, hp.image_std)
    n_tok = cm.encode(px).shape[0]  # warm-up: kernels compiled, graph built
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        cm.encode(px)
        best = min(best, time.perf_counter() - t0)
    return best, n_tok


def time_llamacpp(
    cli: str, text: Path, mmproj: Path, img: Path, runs: int, threads: int | None
) -> float | None:
    best = None
    for _ in range(runs):
        cmd = [
            cli,
            "-m",
            str(text),
            "--mmproj",
            str(mmproj),
            "--image",
            str(img),
            "-p",
            "describe",
            "-n",
            "1",
            "--chat-template",
            "gemma",
            "-c",
            "2048",  # the image's tokens must fit (the tiny text model says 128)
        ]
        if threads:
            cmd += ["-t", str(threads)]
        r = subprocess.run(cmd, capture_output=True, encoding="utf-8", errors="replace", timeout=600)
        m = re.search(r"(?:image slice encoded|mtmd batch encoding done) in (\d+) ms", r.stdout + r.stderr)
        if not m:
            print(
                f"llama-mtmd-cli gave no encode time (rc {r.returncode}):\n{r.stderr[-2000:]}",
                file=sys.stderr,
            )
            return None
        t = int(m.group(1)) / 1000
        best = t if best is None else min(best, t)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="224,384,896")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=384)
    ap.add_argument("--type", default="f16", choices=["f32", "f16"])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--llama-cpp", default=None, help="path of llama-mtmd-cli")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "mtmd.md"))
    args = ap.parse_args()
    cli = find_mtmd_cli(args.llama_cpp)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    machine = machine_line(load_avg=True)  # the load before this run's own work
    head = (
        "| size px | patch | patches | tokens | llamapy ms | llama.cpp ms | time ratio llamapy / llama.cpp |"
    )
    rows = [head, "|---:|---:|---:|---:|---:|---:|---:|"]
    print(head + "\n" + rows[1], flush=True)
    for size in (int(s) for s in args.sizes.split(",")):
        out = CACHE / "bench-mtmd" / f"{size}-{args.layers}x{args.width}-{args.type}"
        out.mkdir(parents=True, exist_ok=True)
        text, mmproj = make_pair(size, args.layers, args.width, args.type, out)
        img = image_file(size, out)
        t_py, n_tok = time_llamapy(mmproj, img, args.runs, args.threads)
        t_cpp = time_llamacpp(cli, text, mmproj, img, args.runs, args.threads) if cli else None
        patch = patch_for(size)
        cpp = f"{t_cpp * 1000:.0f}" if t_cpp is not None else "-"
        ratio = f"{t_py / t_cpp:.2f}x" if t_cpp else "-"
        rows.append(
            f"| {size} | {patch} | {(size // patch) ** 2} | {n_tok} | {t_py * 1000:.0f} | {cpp} | {ratio} |"
        )
        print(rows[-1], flush=True)
    cmd = "python benchmarks/bench_mtmd.py " + shlex.join(sys.argv[1:])
    load = os.getloadavg()[0]
    busy = [f"- NOTE: load {load:.2f} on {os.cpu_count()} cores: a busy machine, not final numbers"]
    md = [
        "# Image encode time (vision tower + projector), llamapy vs llama.cpp's llama-mtmd-cli",
        "",
        f"- when: {when}; machine: {machine}",
        *(busy if load > 0.75 * (os.cpu_count() or 1) else []),
        f"- command: `{cmd.strip()}` (threads {args.threads}, best of {args.runs})",
        f"- llama.cpp: `{cli or 'not found'}` (`-n 1 --chat-template gemma -c 2048`; "
        "its `mtmd batch encoding done in` line)",
        f"- files: gemma3 mmproj, random weights, {args.layers} blocks x {args.width} wide, 6 heads, FFN "
        f"{4 * args.width}, {args.type.upper()}; 4x4 average pool; written by tests/mtmd/convert.py",
        "",
        *rows,
        "",
    ]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(md))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
