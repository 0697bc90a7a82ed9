"""``llamapy rm MODEL...``: delete models from the store (never a plain file)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rm",
        help="delete downloaded models",
        description="Delete models of the store (user/repo:QUANT or a known name) and their files.",
        allow_abbrev=False,
    )
    p.add_argument("models", nargs="+", metavar="MODEL", help="user/repo[:quant] or a known model name")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..hub import store

    for name in args.models:
        m = store.find(name)
        store.remove(name)
        print(f"deleted {m.name} ({m.path})")
    return 0
