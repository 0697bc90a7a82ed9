"""``llamapy show MODEL``: a stored model's (or a GGUF file's) architecture, parameters, context length,
quantization, chat template, license and the rest of its metadata; ``--json`` for one JSON object."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "show",
        help="show a model's details and metadata",
        description="Show a model of the store (user/repo:QUANT or a known name) or a GGUF file.",
        allow_abbrev=False,
    )
    p.add_argument("model", help="user/repo[:quant], a known model name, or a GGUF file")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..hub import store
    from .ls import human

    info = store.show(args.model)
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    lines = [
        f"  name            {info['name']}",
        f"  path            {info['path']}",
        f"  architecture    {info['architecture']}",
        f"  parameters      {info['parameter_size']} ({info['parameters']})",
        f"  context length  {info['context_length']}",
        f"  embedding       {info['embedding_length']}",
        f"  quantization    {info['quantization']}",
        f"  size            {human(info['size'])}"
        + (f" in {info['splits']} files" if info["splits"] > 1 else ""),
        f"  license         {info['license'] or '-'}",
    ]
    if info["mmproj"]:
        lines.append(f"  mmproj          {info['mmproj']}")
    out = ["Model", *lines]
    if info["chat_template"]:
        out += ["", "Chat template", *("  " + ln for ln in str(info["chat_template"]).splitlines())]
    out += ["", "Metadata"]
    w = max((len(k) for k in info["metadata"]), default=0)
    out += [f"  {k:<{w}}  {v}" for k, v in info["metadata"].items() if k != "tokenizer.chat_template"]
    print("\n".join(out))
    return 0
