"""``llamapy imatrix -m MODEL -f TEXT [-o imatrix.gguf]``: llama-imatrix (``llamapy.quantize.imatrix``)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "imatrix",
        help="compute an importance matrix for quantization (llama-imatrix)",
        description="Sums of squared activations into every weight matrix over a text, in llama-imatrix's "
        "GGUF format (or its legacy .dat); --in-file combines earlier ones.",
    )
    p.add_argument("-m", "--model", help="GGUF model file")
    p.add_argument("-f", "--file", help="text file to run the model over")
    p.add_argument("-o", "--output-file", default="imatrix.gguf", help="output (default imatrix.gguf)")
    p.add_argument("--output-format", choices=("gguf", "dat"), default=None,
                   help="gguf (default) or the legacy dat format (default: dat when -o ends in .dat)")  # fmt: skip
    p.add_argument("-c", "--ctx-size", type=int, default=512, help="tokens per chunk (default 512)")
    p.add_argument("-b", "--batch-size", type=int, default=2048, help="tokens per batch (default 2048)")
    p.add_argument("--chunks", type=int, default=-1, help="process at most N chunks")
    p.add_argument("--chunk", type=int, default=0, help="skip the first N chunks of the text")
    p.add_argument("--in-file", action="append", default=[], help="imatrix to add in (repeatable)")
    p.add_argument("--process-output", action="store_true", help="collect output.weight too")
    p.add_argument("--parse-special", action="store_true", help="parse special tokens in the text")
    p.add_argument("--show-statistics", action="store_true", help="statistics of one --in-file, then exit")
    p.add_argument("-t", "--threads", type=int, default=None, help="threads (default: all cores)")
    p.add_argument("-ctk", "--cache-type-k", default="f16", help="K cache type (f16, f32, q8_0, q4_0)")
    p.add_argument("-ctv", "--cache-type-v", default="f16", help="V cache type (f16, f32, q8_0, q4_0)")
    p.add_argument("--force", action="store_true", help="overwrite the output file when it exists")
    from .compat import add_compat_args

    add_compat_args(p, "cpu", "device", "log")
    p.set_defaults(func=run)


def _show_statistics(path: str) -> int:
    from ..quantize import load_imatrix
    from ..quantize.imatrix import statistics

    ts = statistics(load_imatrix(path))
    if not ts:
        from ..quantize import QuantizeError

        raise QuantizeError(f"cannot compute statistics for {path}")

    def split(name: str) -> tuple[str, str]:
        parts = name.split(".")
        layer = parts[parts.index("blk") + 1] if "blk" in parts[:-1] else "-"
        tensor = parts[parts.index("weight") - 1] if "weight" in parts[1:] else name
        return layer, tensor

    ts.sort(key=lambda t: (split(t.name)[1], -t.total))
    out = sys.stdout
    print(f"\nComputing statistics for {path} ({len(ts)} tensors)\n", file=out)
    print(" Layer\t       Tensor\t          Σ(Act²)\t  Min\t            Max\t           μ\t   σ\t % Active\tN"
          "\t   Entropy\tE (norm)\tZD\t  CosSim", file=out)  # fmt: skip
    print("=" * 170, file=out)
    import math

    layers: dict[int, list[float]] = {}
    for t in ts:
        layer, name = split(t.name)
        en = 100.0 * t.entropy / math.log2(t.elements) if t.elements > 1 else 0.0
        print(f"{layer:>5s}\t{name:<20s}\t{t.total:10.2f}\t{t.min:8.4f}\t{t.max:11.4f}\t{t.mean:6.2f}\t{t.stddev:6.2f}"
              f"\t{t.active * 100:8.2f}%\t{t.elements:6d}\t{t.entropy:10.4f}\t{en:6.2f}%\t{100 * t.zd:10.2f}%"
              f"\t{t.cossim:8.4f}", file=out)  # fmt: skip
        if layer.isdigit():
            acc = layers.setdefault(int(layer), [0.0, 0.0, 0.0, 0])
            acc[0] += t.elements * t.total
            acc[1] += t.elements * t.zd
            acc[2] += t.elements * t.cossim
            acc[3] += t.elements
    print(f"\nComputing weighted average statistics per layer ({len(layers)} layers)\n", file=out)
    print("  Layer\t     μΣ(Act²)\t      μZD\tμCosSim", file=out)
    print("=" * 48, file=out)
    for il in sorted(layers):
        b, zd, cs, n = layers[il]
        print(f"{il:5d}\t{b / n:14.2f}\t{100 * zd / n:10.4f}%\t{cs / n:6.4f}", file=out)
    return 0


def run(args: argparse.Namespace) -> int:
    from ..quantize import Imatrix, QuantizeError, load_imatrix

    if args.show_statistics:
        if len(args.in_file) != 1:
            raise QuantizeError("--show-statistics needs exactly one --in-file")
        return _show_statistics(args.in_file[0])
    if args.ctx_size <= 0:
        raise QuantizeError("imatrix requires --ctx-size > 0")
    if args.batch_size <= 0:
        raise QuantizeError("--batch-size must be positive")
    out = args.output_file
    fmt = args.output_format or ("dat" if out.endswith(".dat") else "gguf")
    if os.path.exists(out) and not args.force:
        raise QuantizeError(f"{out} exists (use --force to overwrite it)")
    n_seq = max(1, args.batch_size // args.ctx_size)
    chunk_size = args.ctx_size  # n_ctx / n_parallel
    combined: Imatrix | None = None
    for path in args.in_file:
        print(f"imatrix: loading imatrix from '{path}'", file=sys.stderr)
        im = load_imatrix(path)
        if combined is None:
            combined = Imatrix(chunk_size=chunk_size)
        combined.merge(im, chunk_size)
    if not args.file:
        if combined is None:
            raise QuantizeError("no text (-f) and no precomputed matrices (--in-file) to combine")
        combined.chunk_size = chunk_size
        _save(combined, out, fmt)
        print(f"imatrix: saved the combined imatrix to '{out}'", file=sys.stderr)
        return 0
    if not args.model:
        raise QuantizeError("-m MODEL is required to compute an imatrix")
    from ..model import Model
    from ..quantize.imatrix import compute_imatrix

    try:
        with open(args.file, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise QuantizeError(f"{args.file}: {e.strerror or e}") from None
    model = Model.load(args.model)
    if model.vocab is None:
        raise QuantizeError(f"{args.model}: the model has no vocabulary to tokenize the text")
    tokens = model.vocab.tokenize(text, add_special=True, parse_special=args.parse_special)
    if args.chunk > 0:
        if (args.chunk + 2) * args.ctx_size >= len(tokens):
            raise QuantizeError(f"there will be not enough tokens left after removing {args.chunk} chunks")
        tokens = tokens[args.chunk * args.ctx_size :]
    n_chunk = (
        len(tokens) // args.ctx_size if args.chunks < 0 else min(args.chunks, len(tokens) // args.ctx_size)
    )
    print(f"imatrix: {len(tokens)} tokens, computing over {n_chunk} chunks, n_ctx={args.ctx_size}, "
          f"batch_size={min(args.batch_size, n_seq * args.ctx_size)}, n_seq={n_seq}", file=sys.stderr)  # fmt: skip

    def progress(done: int, total: int, secs: float) -> None:
        print(f"imatrix: [{done}/{total}] {secs:.1f} s", file=sys.stderr, flush=True)

    im = compute_imatrix(model, tokens, n_ctx=args.ctx_size, n_batch=args.batch_size, n_chunks=args.chunks,
                         process_output=args.process_output, n_threads=args.threads, datasets=[args.file],
                         previous=combined, progress=progress, type_k=args.cache_type_k,
                         type_v=args.cache_type_v)  # fmt: skip
    _save(im, out, fmt, args.file)
    print(
        f"imatrix: stored {len(im.entries)} entries after {im.chunk_count} chunks in '{out}'", file=sys.stderr
    )
    return 0


def _save(im: Any, out: str, fmt: str, dataset: str = "") -> None:
    from ..quantize import save_imatrix, save_imatrix_legacy

    if fmt == "dat":
        save_imatrix_legacy(im, out, dataset)
    else:
        save_imatrix(im, out)
