"""``llamapy tokenize``: print the tokens of a text, in llama.cpp's llama-tokenize format.

Only the vocabulary is loaded (no weights). As in llama-tokenize: special-token text is parsed unless
``--no-parse-special``; BOS (and EOS) are added as the model asks unless ``--no-bos``; escapes
(``\\n``, ``\\t``, ``\\xNN`` ...) in the prompt, file or stdin are processed unless ``--no-escape``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tokenize", help="print the tokens of a text (like llama-tokenize)")
    p.add_argument(
        "-m", "--model", default=None, help="GGUF file (or a known model name, or user/repo[:quant])"
    )
    from .common import add_hf_args

    add_hf_args(p)  # -hf user/repo[:quant], -hff, --hf-token, --offline, --no-mmproj
    src = p.add_mutually_exclusive_group()
    src.add_argument("-p", "--prompt", help="text to tokenize")
    src.add_argument("-f", "--file", help="file with the text (read as bytes)")
    src.add_argument("--stdin", action="store_true", help="read the text from standard input")
    p.add_argument("--ids", action="store_true", help="print only the ids, as a Python list")
    p.add_argument("--no-bos", action="store_true", help="do not add BOS/EOS even if the model asks for them")
    p.add_argument(
        "--no-parse-special", action="store_true", help="do not turn special-token text into tokens"
    )
    p.add_argument("--show-count", action="store_true", help="print the number of tokens")
    p.add_argument("-e", "--escape", dest="escape", action="store_true", default=True, help=argparse.SUPPRESS)
    p.add_argument("--no-escape", dest="escape", action="store_false", help="do not process escape sequences")
    from .compat import add_compat_args

    add_compat_args(p, "cpu", "device", "log")
    p.set_defaults(func=run)


def process_escapes(data: bytes) -> bytes:
    """llama.cpp's string_process_escapes: \\n \\r \\t \\' \\" \\\\ and \\xNN; other escapes stay."""
    out = bytearray()
    i, n = 0, len(data)
    simple = {ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("'"): 39, ord('"'): 34, ord("\\"): 92}
    while i < n:
        c = data[i]
        if c == 0x5C and i + 1 < n:
            i += 1
            e = data[i]
            if e in simple:
                out.append(simple[e])
            elif (
                e == ord("x")
                and i + 2 < n
                and all(chr(h) in "0123456789abcdefABCDEF" for h in data[i + 1 : i + 3])
            ):
                out.append(int(data[i + 1 : i + 3], 16))
                i += 2
            else:
                out += bytes((0x5C, e))
        else:
            out.append(c)
        i += 1
    return bytes(out)


def _model_path(name: str) -> Path:
    p = Path(name)
    if p.exists():
        return p
    from .. import hub

    if hub.canonical_name(name):
        return hub.pull(name, quiet=True)
    if hub.looks_like_ref(name):  # user/repo[:quant] from the Hugging Face Hub
        return hub.resolve_model(name)
    raise FileNotFoundError(2, "No such file or directory", name)


def run(args: argparse.Namespace) -> int:
    from ..errors import LlamapyError
    from ..vocab import load_vocab

    if args.prompt is None and args.file is None and not args.stdin:
        raise LlamapyError("must specify one of: --stdin, --file or --prompt")
    if args.file is not None:
        data = Path(args.file).read_bytes()
    elif args.prompt is not None:
        data = args.prompt.encode("utf-8", "surrogateescape")
    else:
        data = None
    from .common import hf_model_or

    vocab = load_vocab(hf_model_or(args, _model_path))
    if data is None:
        data = sys.stdin.buffer.read()
    if args.escape:
        data = process_escapes(data)
    add_special = vocab.add_bos and not args.no_bos
    ids = vocab.tokenize(data, add_special=add_special, parse_special=not args.no_parse_special)
    out = sys.stdout.buffer
    if args.ids:
        out.write(("[" + ", ".join(map(str, ids)) + "]\n").encode())
    else:
        for t in ids:
            out.write(b"%6d -> '" % t + vocab.token_to_piece(t, special=True) + b"'\n")
    if args.show_count:
        out.write(b"Total number of tokens: %d\n" % len(ids))
    out.flush()
    return 0
