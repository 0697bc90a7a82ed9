"""``llamapy convert HF_DIR [-o OUT] [--outtype TYPE]``: a Hugging Face checkpoint as a GGUF file, as
llama.cpp's ``convert_hf_to_gguf.py`` writes it (``--outtype q4_k_m`` and the other quantize mixes:
converted, then quantized)."""

from __future__ import annotations

import argparse
import sys


def _size(s: str) -> int:
    """llama.cpp's split_str_to_n_bytes: N, NK, NM, NG (powers of 1000)."""
    mult = {"K": 1000, "M": 1000**2, "G": 1000**3}.get(s[-1:].upper(), 1)
    digits = s[:-1] if mult > 1 else s
    if not digits.isdigit() or int(digits) <= 0:
        raise argparse.ArgumentTypeError(
            f"invalid split size {s!r}: a positive number, optionally followed by K, M or G"
        )
    return int(digits) * mult


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "convert",
        help="convert a Hugging Face checkpoint to GGUF",
        description="Convert a Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer) to a "
        "GGUF file, as llama.cpp's convert_hf_to_gguf.py does.",
        allow_abbrev=False,
    )
    p.add_argument("model", metavar="HF_DIR", help="the checkpoint directory (or a PEFT LoRA adapter's)")
    p.add_argument(
        "-o",
        "--outfile",
        metavar="OUT",
        help="output file or directory (default: <Name>-<Size>-<TYPE>.gguf in HF_DIR)",
    )
    p.add_argument(
        "--outtype",
        default="auto",
        metavar="TYPE",
        help="f32, f16, bf16, q8_0, auto (the checkpoint's 16-bit type; default), or a quantize type "
        "(q4_k_m, q6_k, iq4_xs...: converted, then quantized)",
    )
    p.add_argument("--vocab-only", action="store_true", help="write the vocabulary and metadata only")
    p.add_argument(
        "--mmproj",
        action="store_true",
        help="write the vision projector (mmproj-<Name>-<TYPE>.gguf) of a vision-language checkpoint",
    )
    p.add_argument(
        "--split-max-size", type=_size, default=0, metavar="N", help="at most N bytes a split (K, M, G)"
    )
    p.add_argument("--dry-run", action="store_true", help="print the tensors and sizes, write nothing")
    p.add_argument("--model-name", help="general.name to write")
    p.add_argument("--metadata", metavar="FILE", help="a JSON file of general.* metadata overrides")
    p.add_argument("--imatrix", metavar="FILE", help="importance matrix for a quantize --outtype")
    p.add_argument(
        "--base", metavar="DIR", help="for a LoRA adapter: the base model's directory (its config.json)"
    )
    p.add_argument("--force", action="store_true", help="overwrite the output file")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..convert import convert
    from ..ggml.types import TRAITS

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    r = convert(
        args.model,
        args.outfile,
        args.outtype,
        vocab_only=args.vocab_only,
        dry_run=args.dry_run,
        force=args.force,
        model_name=args.model_name,
        metadata_file=args.metadata,
        split_max_size=args.split_max_size,
        imatrix=args.imatrix,
        base_model=args.base,
        mmproj=args.mmproj,
        progress=None if args.quiet else say,
    )
    total = 0
    for name, shape, t in r.tensors:
        n = 1
        for d in shape:
            n *= d
        total += n // TRAITS[t].block_size * TRAITS[t].type_size
        if args.dry_run:
            print(f"{name:<40} {t.name:<6} {list(reversed(shape))}")
    what = "would write" if args.dry_run else "wrote"
    paths = ", ".join(str(p) for p in r.paths)
    print(f"{what} {paths}: {r.arch}, {len(r.tensors)} tensors, {total / 2**20:.1f} MiB of tensor data")
    return 0
