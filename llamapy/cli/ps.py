"""``llamapy ps``: the models loaded in a running ``llamapy serve`` (its ollama-style ``GET /api/ps``):
name, size, context length, quantization, and until when it stays loaded."""

from __future__ import annotations

import argparse
import json
import os


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ps",
        help="list the models loaded in a running server",
        description="List the models loaded in a running llamapy server (GET /api/ps).",
        allow_abbrev=False,
    )
    p.add_argument(
        "--url",
        default=os.environ.get("LLAMAPY_URL", "http://127.0.0.1:8080"),
        help="the server (default $LLAMAPY_URL or http://127.0.0.1:8080)",
    )
    p.add_argument(
        "--api-key", default=os.environ.get("LLAMAPY_API_KEY"), help="the server's API key, if any"
    )
    p.add_argument("--json", action="store_true", help="the server's answer as JSON")
    p.set_defaults(func=run)


def fetch(url: str, api_key: str | None = None, timeout: float = 10.0) -> list[dict]:
    import urllib.error
    import urllib.request

    from ..errors import LlamapyError

    req = urllib.request.Request(url.rstrip("/") + "/api/ps")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise LlamapyError(f"{url}/api/ps answered {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise LlamapyError(f"no server at {url} ({reason}); start one with `llamapy serve`") from None
    except ValueError:
        raise LlamapyError(f"{url}/api/ps did not answer JSON; is it a llamapy server?") from None
    models = body.get("models") if isinstance(body, dict) else None
    if not isinstance(models, list):
        raise LlamapyError(f"{url}/api/ps answered no model list; is it a llamapy server?")
    return models


def run(args: argparse.Namespace) -> int:
    from .ls import human

    models = fetch(args.url, args.api_key)
    if args.json:
        print(json.dumps(models, indent=2))
        return 0
    rows = [("NAME", "SIZE", "CONTEXT", "QUANT", "UNTIL")]
    for m in models:
        d = m.get("details") or {}
        rows.append(
            (
                str(m.get("name") or m.get("model") or "?"),
                human(int(m.get("size") or 0)),
                str(m.get("context_length") or "-"),
                str(d.get("quantization_level") or "-"),
                str(m.get("expires_at") or "-"),
            )
        )
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print(f"{r[0]:<{w[0]}}  {r[1]:>{w[1]}}  {r[2]:>{w[2]}}  {r[3]:<{w[3]}}  {r[4]}")
    return 0
