"""The ``llamapy`` command line: one module per subcommand, each with ``register(subparsers)``.

Subcommand modules keep heavy imports (numba kernels, models) inside their handlers so that
``llamapy --help`` and argument errors stay fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

# subcommand name -> module under llamapy.cli
SUBCOMMANDS = {
    "run": "run",
    "chat": "chat",
    "pull": "pull",
    "serve": "serve",
    "serve-ray": "serve_ray",
    "tokenize": "tokenize",
    "perplexity": "perplexity",
    "convert": "convert",
    "quantize": "quantize",
    "imatrix": "imatrix",
    "bench": "bench",
    "embed": "embed",
    "gguf": "gguf",
    "list": "ls",
    "show": "show",
    "rm": "rm",
    "ps": "ps",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with ``only`` (a subcommand name) just that subcommand: its module
    alone is imported (``llamapy run`` need not import the server, bench or perplexity modules)."""
    from .. import __version__

    parser = argparse.ArgumentParser(prog="llamapy", description="llama.cpp, rebuilt in Python.")
    parser.add_argument("--version", action="version", version=f"llamapy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = [SUBCOMMANDS[only]] if only in SUBCOMMANDS else SUBCOMMANDS.values()
    for module in modules:
        try:
            mod = importlib.import_module(f"{__name__}.{module}")
        except ModuleNotFoundError as e:
            if e.name == f"{__name__}.{module}":
                continue  # not written yet
            raise
        mod.register(sub)
    return parser


def options_of(parser: argparse.ArgumentParser, command: str) -> dict[str, Any]:
    """The flags (every spelling) of subcommand ``command`` in ``parser`` (:func:`build_parser`'s); none
    when it has no such subcommand."""
    sub = parser._subparsers._group_actions[0].choices.get(command) if parser._subparsers else None  # type: ignore[union-attr]
    return sub._option_string_actions if sub is not None else {}


# subcommands that only compute and print: once they return, nothing is left to finalize
_FAST_EXIT = frozenset({"run", "tokenize", "embed", "bench", "perplexity"})
#: what a subcommand keeps to the end of a fast exit (``keep_until_exit``); None: no fast exit is coming
_KEEP: list[Any] | None = None


def keep_until_exit(obj: Any) -> None:
    """Hold ``obj`` (a loaded model) until ``entry``'s immediate exit, so that returning from the
    subcommand does not free it first: SmolLM2's arrays, graphs and mappings took ~6 ms of a 0.45 s
    ``llamapy run`` to free, work that the exit makes moot. Nothing when no fast exit follows (``main``
    called in a process that goes on, LLAMAPY_FULL_EXIT): there ``obj`` is freed as usual."""
    if _KEEP is not None:
        _KEEP.append(obj)


def entry() -> None:
    """The ``llamapy`` command (and ``python -m llamapy``): :func:`main`, then for a subcommand in
    ``_FAST_EXIT`` an immediate exit once stdout and stderr are flushed. The interpreter's teardown
    (every module, Numba's and LLVM's runtime, the thread pool) cost 0.08-0.1 s of a 0.6 s
    ``llamapy run``. LLAMAPY_FULL_EXIT=1 keeps the normal exit."""
    import os

    from . import gcpause

    global _KEEP
    if _subcommand(sys.argv[1:]) in _GC_PAUSE:
        gcpause.pause()
    fast = _subcommand(sys.argv[1:]) in _FAST_EXIT and not os.environ.get("LLAMAPY_FULL_EXIT")
    if fast:
        _KEEP = []
    try:
        rc = main()
    finally:
        gcpause.end()
    if fast:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            sys.exit(rc)  # a closed or broken stream: let the normal exit report it
        os._exit(rc)
    sys.exit(rc)


def _subcommand(argv: Sequence[str]) -> str | None:
    """The subcommand named by ``argv`` when it is its first argument (no top-level option before it)."""
    return argv[0] if argv and argv[0] in SUBCOMMANDS else None


# subcommands whose -m file is read whole: its pages are asked for while Python imports
_PREFETCH = frozenset({"run", "chat", "embed", "perplexity"})


def _prefetch_model(argv: Sequence[str]) -> None:
    """Ask the kernel to read the ``-m`` file into the page cache (``POSIX_FADV_WILLNEED``, as llama.cpp
    advises its mapping) from a background thread, before the ~0.4 s of imports: a model not in the
    page cache (or partly evicted) is then read while Python imports NumPy and Numba instead of page by
    page in the first forward pass (Qwen2.5-1.5B-shaped, 935 MiB: first token 1.0-2.9 s -> 0.8-0.9 s
    on a busy machine). Nothing is read or checked here; a bad path fails later as before."""
    if _subcommand(argv) not in _PREFETCH:
        return
    path = None
    for i, a in enumerate(argv):
        if a in ("-m", "--model") and i + 1 < len(argv):
            path = argv[i + 1]
        elif a.startswith("--model="):
            path = a.partition("=")[2]
    import os

    path = path or os.environ.get("LLAMA_ARG_MODEL")  # (llamapy.cli.env: the flag's variable)
    if not path or not hasattr(os, "posix_fadvise") or not os.path.isfile(path):
        return

    def advise() -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)
        except OSError:
            pass

    import threading

    threading.Thread(target=advise, name="llamapy-prefetch", daemon=True).start()


# subcommands that load one model and then generate: the cyclic garbage collector is paused from the
# start until the model is loaded (``llamapy.cli.gcpause``)
_GC_PAUSE = frozenset({"run", "chat"})


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    from .env import with_env

    _prefetch_model(argv)
    command = _subcommand(argv)
    parser = build_parser(command)
    if command is not None:  # llama.cpp's LLAMA_ARG_* variables of the subcommand's flags
        argv = with_env(argv, accepted=options_of(parser, command))
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
