"""llama.cpp flags that ``llamapy`` accepts so that a copied llama.cpp command line runs, although they
change nothing here: CPU affinity and priorities, device placement (one device), logging and display
options. None of them changes the generated text: a flag that would and that llamapy does not implement
(``--control-vector``, ``-gan``...) stays an error (the RoPE scaling flags and ``--override-kv`` are real
options: ``llamapy.cli.common.add_rope_args``).

The flags are grouped (:data:`GROUPS`); a command adds the groups of the llama.cpp tool it stands for with
:func:`add_compat_args`, which skips any spelling the command already gives a meaning to. A flag that
llama.cpp's own CPU build warns about (``-sm``, ``-ts``) prints one line on stderr, as llama.cpp does.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .._dataclass import dataclass


@dataclass(frozen=True)
class NoEffect:
    """A llama.cpp flag accepted for compatibility that changes nothing here."""

    names: tuple[str, ...]  # llama.cpp's spellings
    value: bool  # takes a value
    warn: str = ""  # one line on stderr when given (where llama.cpp's CPU build warns too)


def _f(*names: str, value: bool = False, warn: str = "") -> NoEffect:
    return NoEffect(names, value, warn)


GROUPS: dict[str, tuple[NoEffect, ...]] = {
    # threads: one pool (-t) for prompts and decode; affinity, priority and polling are the OS's
    "cpu": (
        _f("-tb", "--threads-batch", value=True),
        _f("-C", "--cpu-mask", value=True),
        _f("-Cr", "--cpu-range", value=True),
        _f("--cpu-strict", value=True),
        _f("--prio", value=True),
        _f("--poll", value=True),
        _f("-Cb", "--cpu-mask-batch", value=True),
        _f("-Crb", "--cpu-range-batch", value=True),
        _f("--cpu-strict-batch", value=True),
        _f("--prio-batch", value=True),
        _f("--poll-batch", value=True),
        _f("--numa", value=True),
    ),
    # where tensors live: the same numbers on the one device llamapy computes on
    "device": (
        _f("-sm", "--split-mode", value=True, warn="one device: setting the split mode has no effect"),
        _f("-ts", "--tensor-split", value=True, warn="one device: setting a tensor split has no effect"),
        _f("-ot", "--override-tensor", value=True),
        _f("-cmoe", "--cpu-moe"),
        _f("-ncmoe", "--n-cpu-moe", value=True),
        _f("-ncffn", "--n-cpu-ffn", value=True),
        _f("--op-offload"),
        _f("-nopo", "--no-op-offload"),
        _f("--no-host"),
        _f("-lm", "--load-mode", value=True),
        _f("-lzm", "--lazy-mode", value=True),
        _f("-fit", "--fit", value=True),
        _f("-fitt", "--fit-target", value=True),
        _f("-fitc", "--fit-ctx", value=True),
        _f("-bs", "--backend-sampling"),
        _f("--swa-full"),
        _f("-dt", "--defrag-thold", value=True),
        _f("--check-tensors"),
    ),
    # llama.cpp's logger: llamapy logs to stderr (-v for more)
    "log": (
        _f("--log-disable"),
        _f("--log-file", value=True),
        _f("--log-colors", value=True),
        _f("--log-jsonl"),
        _f("--no-log-jsonl"),
        _f("-lv", "--verbosity", "--log-verbosity", value=True),
        _f("--log-prefix"),
        _f("--no-log-prefix"),
        _f("--log-timestamps"),
        _f("--no-log-timestamps"),
        _f("--perf"),
        _f("--no-perf"),
    ),
    # the terminal: llamapy prints the generated text only, without colours
    "console": (
        _f("-co", "--color", value=True),
        _f("--simple-io"),
        _f("--verbose-prompt"),
        _f("--warmup"),
        _f("--no-warmup"),
        _f("--jinja"),
    ),
    # llamapy serve computes on the CPU: llama.cpp's CPU build warns about -ngl the same way
    "serve_cpu": (
        _f(
            "-ngl",
            "--gpu-layers",
            "--n-gpu-layers",
            value=True,
            warn="llamapy serve computes on the CPU, the layers stay there",
        ),
        _f("-mg", "--main-gpu", value=True),
        _f("-dev", "--device", value=True),
        _f("-kvo", "--kv-offload"),
        _f("-nkvo", "--no-kv-offload"),
        _f("--mmproj-offload"),
        _f("--no-mmproj-offload"),
        _f("-fa", "--flash-attn", value=True),
        _f("--mlock"),
        _f("--mmap"),
        _f("--no-mmap"),
    ),
    # one sequence: llama-completion and llama-cli decode one too, whatever -np says
    "single": (_f("-np", "--parallel", value=True),),
    # llama-server's HTTP layer (uvicorn's own event loop and timeouts)
    "http": (
        _f("--threads-http", value=True),
        _f("-to", "--timeout", value=True),
        _f("-cb", "--cont-batching"),
        _f("-nocb", "--no-cont-batching"),
        _f("-sps", "--slot-prompt-similarity", value=True),
        _f("--jinja"),
    ),
}


class NoEffectAction(argparse.Action):
    def __init__(self, option_strings: Sequence[str], dest: str, warn: str = "", **kw: object) -> None:
        self.warn = warn
        super().__init__(option_strings, dest, **kw)  # type: ignore[arg-type]

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:  # fmt: skip
        if self.warn and values not in ("0", "none"):
            print(f"llamapy: warning: {option_string}: {self.warn}", file=sys.stderr)


def add_compat_args(p: argparse.ArgumentParser, *groups: str) -> None:
    """Add the no-effect flags of ``groups`` (keys of :data:`GROUPS`) that ``p`` does not have yet; they
    set nothing on the parsed namespace."""
    known = p._option_string_actions  # (argparse's own table of the spellings taken)
    g = p.add_argument_group(
        "llama.cpp flags accepted without effect", "threads, devices, logging and display options of "
        "llama.cpp that change nothing in llamapy's output",
    )  # fmt: skip
    for group in groups:
        for f in GROUPS[group]:
            names = [n for n in f.names if n not in known]
            if names:
                g.add_argument(
                    *names, action=NoEffectAction, nargs=None if f.value else 0, warn=f.warn,
                    dest=f"compat_{names[-1].lstrip('-').replace('-', '_')}", default=argparse.SUPPRESS,
                    metavar="X" if f.value else None, help=argparse.SUPPRESS,
                )  # fmt: skip
