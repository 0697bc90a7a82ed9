"""``llamapy quantize [options] IN [OUT] TYPE [nthreads]``: llama-quantize (``llamapy.quantize``)."""

from __future__ import annotations

import argparse
import os
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "quantize",
        help="quantize a GGUF model with llama.cpp's mixes (Q4_K_M, IQ2_XS, ...), as llama-quantize",
        description="Quantize IN (F32/F16/BF16 GGUF) to OUT as llama-quantize does. TYPE is a mix "
        "(see --list-types); OUT defaults to ggml-model-TYPE.gguf beside IN.",
    )
    p.add_argument("args", nargs="*", metavar="IN [OUT] TYPE [nthreads]")
    p.add_argument("--imatrix", metavar="FILE", help="importance matrix (llama-imatrix's GGUF or .dat)")
    p.add_argument("--include-weights", action="append", default=[], metavar="NAME",
                   help="use the imatrix only for tensors whose name contains NAME (repeatable)")  # fmt: skip
    p.add_argument("--exclude-weights", action="append", default=[], metavar="NAME",
                   help="do not use the imatrix for tensors whose name contains NAME (repeatable)")  # fmt: skip
    p.add_argument("--output-tensor-type", metavar="TYPE", help="type of output.weight")
    p.add_argument("--token-embedding-type", metavar="TYPE", help="type of token_embd.weight")
    p.add_argument("--tensor-type", action="append", default=[], metavar="PATTERN=TYPE",
                   help="tensors whose name matches the regex PATTERN get TYPE (repeatable)")  # fmt: skip
    p.add_argument("--tensor-type-file", metavar="FILE", help="PATTERN=TYPE entries, whitespace-separated")
    p.add_argument("--pure", action="store_true", help="no k-quant mixture: every tensor gets TYPE")
    p.add_argument("--leave-output-tensor", action="store_true", help="leave output.weight unquantized")
    p.add_argument("--allow-requantize", action="store_true", help="allow quantized input tensors")
    p.add_argument("--keep-split", action="store_true", help="write the same shards as the input")
    p.add_argument("--override-kv", action="append", default=[], metavar="KEY=TYPE:VALUE",
                   help="set metadata in the output (TYPE int, float, bool, str; repeatable)")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="print the types and the size, write nothing")
    p.add_argument("--force", action="store_true", help="overwrite OUT when it exists")
    p.add_argument("--list-types", action="store_true", help="list the quantization types and exit")
    p.add_argument("-q", "--quiet", action="store_true", help="no per-tensor progress")
    p.set_defaults(func=run)


def _tensor_type(spec: str) -> tuple[str, str]:
    from ..quantize import QuantizeError

    name, sep, ty = spec.partition("=")
    if not sep:
        raise QuantizeError(f"malformed tensor type {spec!r}: expected PATTERN=TYPE")
    if not name:
        raise QuantizeError(f"--tensor-type {spec!r}: missing tensor name")
    if not ty:
        raise QuantizeError(f"--tensor-type {spec!r}: missing quantization type")
    return name, ty


def run(args: argparse.Namespace) -> int:
    from ..quantize import FTYPES, QuantizeError, parse_ftype, quantize_file

    if args.list_types:
        for f in FTYPES:
            num = f"{f.ftype:2d}  or  " if f.name != "COPY" else " " * 10
            print(f"  {num}{f.name:<9s} : {f.desc}")
        return 0
    pos = list(args.args)
    if not pos:
        raise QuantizeError("usage: llamapy quantize [options] IN [OUT] TYPE [nthreads]")
    inp = pos.pop(0)
    if not pos:
        raise QuantizeError("missing TYPE (see llamapy quantize --list-types)")
    try:
        ftype = parse_ftype(pos[0])
        out = None
        pos.pop(0)
    except QuantizeError:
        out = pos.pop(0)
        if not pos:
            raise QuantizeError("missing TYPE (see llamapy quantize --list-types)") from None
        ftype = parse_ftype(pos.pop(0))
    nthreads = None
    if pos:
        try:
            nthreads = int(pos.pop(0))
        except ValueError:
            raise QuantizeError(f"invalid nthreads {args.args[-1]!r}") from None
    if pos:
        raise QuantizeError(f"unexpected arguments: {' '.join(pos)}")
    if out is None and not args.dry_run:
        typed = args.args[1].upper()
        name = f"ggml-model-{ftype.name if typed.isdigit() else typed}"
        out = os.path.join(os.path.dirname(inp), name + ("" if args.keep_split else ".gguf"))
    tts = [_tensor_type(s) for s in args.tensor_type]
    if args.tensor_type_file:
        try:
            with open(args.tensor_type_file, encoding="utf-8") as f:
                tts += [_tensor_type(s) for s in f.read().split()]
        except OSError as e:
            raise QuantizeError(f"{args.tensor_type_file}: {e.strerror or e}") from None
    if args.include_weights and args.exclude_weights:
        raise QuantizeError("--include-weights and --exclude-weights cannot be used together")
    say = None if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    what = "calculating quantization size for" if args.dry_run else f"quantizing '{inp}' to '{out}' as"
    print(
        f"quantize: {what} {ftype.name}" + (f" using {nthreads} threads" if nthreads else ""), file=sys.stderr
    )
    res = quantize_file(
        inp,
        out,
        ftype,
        nthreads=nthreads,
        imatrix=args.imatrix,
        include_weights=args.include_weights,
        exclude_weights=args.exclude_weights,
        output_tensor_type=args.output_tensor_type,
        token_embedding_type=args.token_embedding_type,
        tensor_types=tts,
        pure=args.pure,
        leave_output_tensor=args.leave_output_tensor,
        allow_requantize=args.allow_requantize,
        keep_split=args.keep_split,
        override_kv=args.override_kv,
        dry_run=args.dry_run,
        force=args.force,
        progress=say,
    )
    n_el = sum(_n_elements(t.ne) for t in res.tensors) or 1
    mib = 1024 * 1024
    print(
        f"quantize: model size  = {res.size_in / mib:8.2f} MiB ({res.size_in * 8 / n_el:.2f} BPW)",
        file=sys.stderr,
    )
    print(
        f"quantize: quant size  = {res.size_out / mib:8.2f} MiB ({res.size_out * 8 / n_el:.2f} BPW)",
        file=sys.stderr,
    )
    if res.n_fallback:
        print(f"quantize: WARNING: {res.n_fallback} of {len(res.tensors)} tensor(s) required fallback quantization",
              file=sys.stderr)  # fmt: skip
    if args.dry_run and res.will_require_imatrix:
        print(
            "quantize: WARNING: dry run completed, but this quantization will require an imatrix!",
            file=sys.stderr,
        )
    if not args.dry_run:
        print(f"quantize: wrote {', '.join(res.outputs)} in {res.seconds:.2f} s", file=sys.stderr)
    return 0


def _n_elements(ne: tuple[int, ...]) -> int:
    n = 1
    for d in ne:
        n *= d
    return n
