"""The ``llamapy`` command line: one module per subcommand, each with ``register(subparsers)``.

Subcommand modules keep heavy imports (numba kernels, models) inside their handlers so that
``llamapy --help`` and argument errors stay fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# subcommand name -> module under llamapy.cli
SUBCOMMANDS = {
    "run": "run",
    "chat": "chat",
    "pull": "pull",
    "serve": "serve",
    "tokenize": "tokenize",
    "perplexity": "perplexity",
    "bench": "bench",
    "embed": "embed",
    "gguf": "gguf",
}


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(prog="llamapy", description="llama.cpp, rebuilt in Python.")
    parser.add_argument("--version", action="version", version=f"llamapy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in SUBCOMMANDS.values():
        try:
            mod = importlib.import_module(f"{__name__}.{module}")
        except ModuleNotFoundError as e:
            if e.name == f"{__name__}.{module}":
                continue  # not written yet
            raise
        mod.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    from ..errors import LlamapyError
    from ..gguf import GGUFError
    from ..hub import ModelFetchError

    try:
        rc = args.func(args)
    except (LlamapyError, GGUFError, ModelFetchError, OSError) as e:
        msg = str(e) if not isinstance(e, OSError) or not e.filename else f"{e.filename}: {e.strerror or e}"
        print(f"error: {msg}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    return int(rc or 0)
