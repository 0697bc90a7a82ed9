"""``llamapy serve``'s chat template and reasoning flags, as llama-server takes them (``-rea``,
``--reasoning-format``, ``--reasoning-budget``, ``--reasoning-effort``, ``--chat-template-kwargs``,
``--no-jinja``), and the chat defaults of requests they make (:func:`chat_defaults`)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_reasoning_args", "chat_defaults"]


def add_reasoning_args(p: argparse.ArgumentParser) -> None:
    """llama-server's chat template and reasoning options (the defaults of chat requests)."""
    p.add_argument(
        "-rea", "--reasoning", type=_reasoning, default="auto", metavar="on|off|auto",
        help="thinking in chat: on, off, or auto (the default: on where the template has a switch)",
    )  # fmt: skip
    p.add_argument(
        "--reasoning-format", type=_reasoning_format, default="auto", metavar="FORMAT",
        help="where thoughts go: none (left in content), deepseek (reasoning_content), auto (the default); "
        "a request's reasoning_format wins",
    )  # fmt: skip
    p.add_argument(
        "--reasoning-budget", type=_reasoning_budget, default=-1, metavar="N",
        help="-1: thinking unrestricted (the default); 0: thinking off (no other budget here)",
    )  # fmt: skip
    p.add_argument(
        "--reasoning-effort", default="default", metavar="LEVEL",
        help="reasoning_effort given to the chat template (low, medium, high...; default: the template's)",
    )  # fmt: skip
    p.add_argument(
        "--chat-template-kwargs", type=_template_kwargs, default={}, metavar="JSON",
        help="""variables of the chat template, a JSON object ('{"key": "value"}'); a request's """
        "chat_template_kwargs are merged over them",
    )  # fmt: skip
    # --jinja is accepted without effect (llamapy.cli.compat): chat templates are always Jinja here
    p.add_argument("--no-jinja", action=_NoJinja, nargs=0, help=argparse.SUPPRESS)


def _reasoning(s: str) -> str:
    v = s.lower()
    for name, spellings in (
        ("on", ("on", "enabled", "true", "1")),
        ("off", ("off", "disabled", "false", "0")),
    ):
        if v in spellings:
            return name
    if v in ("auto", "-1"):
        return "auto"
    raise argparse.ArgumentTypeError(f"unknown value {s!r}: give on, off or auto")


def _reasoning_format(s: str) -> str:
    from ..api.chat_request import REASONING_FORMATS

    if s == "deepseek-legacy":
        raise argparse.ArgumentTypeError(
            "deepseek-legacy (<think> tags kept in content too) is not supported: give deepseek or none"
        )
    if s not in REASONING_FORMATS:
        raise argparse.ArgumentTypeError(f"unknown format {s!r}: give one of {', '.join(REASONING_FORMATS)}")
    return s


def _reasoning_budget(s: str) -> int:
    v = int(s)
    if v not in (-1, 0):
        raise argparse.ArgumentTypeError(
            f"{v}: llamapy has no thinking token budget; give -1 (unrestricted) or 0 (thinking off)"
        )
    return v


def _template_kwargs(s: str) -> dict[str, Any]:
    import json

    from ..server.schemas import RESERVED_TEMPLATE_KWARGS

    try:
        value = json.loads(s)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    reserved = sorted(RESERVED_TEMPLATE_KWARGS.intersection(value))
    if reserved:
        raise argparse.ArgumentTypeError(f"{', '.join(reserved)}: set by the server, not a template kwarg")
    return value


class _NoJinja(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        parser.error(
            "--no-jinja: llamapy renders chat templates with Jinja only (use --chat-template chatml...)"
        )


def chat_defaults(args: argparse.Namespace) -> dict[str, Any]:
    """:class:`~llamapy.server.params.Defaults`' chat fields from --reasoning, --reasoning-budget,
    --reasoning-effort, --reasoning-format and --chat-template-kwargs, as llama-server: on/off set the
    template's ``enable_thinking`` (over the kwargs), off (or a budget of 0) also turns the switch off."""
    kwargs = dict(args.chat_template_kwargs)
    if args.reasoning_effort != "default":
        kwargs["reasoning_effort"] = args.reasoning_effort
    off = args.reasoning == "off" or args.reasoning_budget == 0
    if off or args.reasoning == "on":
        kwargs["enable_thinking"] = not off
    return {"reasoning": not off, "reasoning_format": args.reasoning_format, "chat_template_kwargs": kwargs}
