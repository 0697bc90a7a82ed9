"""``llamapy serve-ray``: N replicas of the llamapy server on Ray Serve behind one endpoint, with
prefix-cache-aware routing (see docs/ray.md). Connects to a running Ray cluster (``ray start --head``,
or ``--address``); with none, starts a local one."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from typing import Any

from ..errors import LlamapyError
from .serve import _api_keys, _positive


def _first_line(e: BaseException) -> str:
    """The message of a deploy failure without Ray's traceback (the replica's own error included)."""
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    tail = [x for x in lines if "Error" in x and not x.startswith(("File ", "Traceback"))]
    return "; ".join(dict.fromkeys(lines[:1] + tail[-1:]))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve-ray",
        help="the server as N replicas on a Ray cluster, prefix-cache-aware routing",
        description="Serve a GGUF model from N llamapy replicas on Ray Serve behind one HTTP endpoint "
        "(every API `llamapy serve` speaks). Needs: pip install 'llamapy[ray]'.",
    )
    p.add_argument("-m", "--model", help="GGUF file (readable on every node) or known model name")
    p.add_argument("-a", "--alias", help="model name reported by /v1/models (default: the file name)")
    p.add_argument("--replicas", type=_positive, default=1, help="number of replicas (default 1)")
    p.add_argument("--min-replicas", type=int, default=None, help="autoscaling: fewest replicas")
    p.add_argument("--max-replicas", type=int, default=None, help="autoscaling: most replicas")
    p.add_argument("--target-ongoing-requests", type=float, default=2.0,
                   help="autoscaling: queued + running requests per replica to aim at (default 2)")  # fmt: skip
    p.add_argument(
        "-t", "--threads", type=_positive, default=1, help="compute threads per replica (default 1)"
    )
    p.add_argument("--num-cpus", type=float, default=None, help="Ray CPUs per replica (default: --threads)")
    p.add_argument("-np", "--parallel", type=_positive, default=2, help="slots per replica (default 2)")
    p.add_argument(
        "-c", "--ctx-size", type=_positive, default=4096, help="context per replica, split over slots"
    )
    p.add_argument("-b", "--batch-size", type=_positive, default=512, help="max tokens per decode step")
    p.add_argument("--routing", choices=["prefix", "round_robin"], default="prefix",
                   help="prefix: to the replica holding the longest prefix (default); round_robin: in turn")  # fmt: skip
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    p.add_argument("--address", default=None, help="Ray cluster address (default: a running one, else local)")
    p.add_argument("--api-key", action="append", default=[], help="require this API key (repeatable)")
    p.add_argument("--api-key-file", help="file with one API key per line")
    p.add_argument(
        "-n", "--n-predict", type=int, default=-1, help="default max tokens per answer (-1: no limit)"
    )
    p.add_argument("--seed", type=int, default=-1, help="default seed (-1: random)")
    p.add_argument("--chat-template", help="built-in template name or Jinja source")
    p.add_argument("--no-warmup", action="store_true", help="skip the replicas' kernel warm-up")
    p.set_defaults(func=run)


def _autoscaling(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.min_replicas is None and args.max_replicas is None:
        return None
    lo = args.min_replicas if args.min_replicas is not None else 1
    hi = args.max_replicas if args.max_replicas is not None else max(lo, args.replicas)
    if lo < 0 or hi < 1 or lo > hi:
        raise SystemExit(
            f"llamapy serve-ray: need 0 <= --min-replicas ({lo}) <= --max-replicas ({hi}), max >= 1"
        )
    return {
        "min_replicas": lo,
        "max_replicas": hi,
        "initial_replicas": min(max(lo, args.replicas), hi),
        "target_ongoing_requests": args.target_ongoing_requests,
    }


def run(args: argparse.Namespace) -> int:
    from ..ray import require_ray

    require_ray()  # before anything else: without Ray, `error: ... pip install 'llamapy[ray]'`, exit 1
    from .common import resolve_model_args

    api_keys = _api_keys(args)
    autoscaling = _autoscaling(args)
    model_path = resolve_model_args(args)
    from ..vocab.vocab import load_vocab

    load_vocab(model_path)  # not a GGUF, or no vocabulary: a clear error here, before any cluster starts

    import ray
    from ray import serve

    from ..ray import build_app

    app = build_app(
        str(model_path),
        args.replicas,
        threads=args.threads,
        num_cpus=args.num_cpus,
        parallel=args.parallel,
        ctx_size=args.ctx_size,
        batch_size=args.batch_size,
        routing=args.routing,
        autoscaling_config=autoscaling,
        alias=args.alias,
        api_keys=api_keys,
        n_predict=args.n_predict,
        seed=args.seed,
        chat_template=args.chat_template,
        warmup=not args.no_warmup,
    )
    ray.init(address=args.address, include_dashboard=False, ignore_reinit_error=True)
    serve.start(http_options={"host": args.host, "port": args.port})
    try:
        serve.run(app, name="llamapy", route_prefix="/", blocking=False)
    except RuntimeError as e:  # a replica that cannot start (its model file missing on a node, not a GGUF)
        with contextlib.suppress(Exception):
            serve.delete("llamapy")
        raise LlamapyError(f"the Ray Serve application failed to deploy: {_first_line(e)}") from None
    print(f"llamapy: listening on http://{args.host}:{args.port} (Ray Serve)", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `kill`: remove the application too
    try:
        while True:
            time.sleep(3600)
    finally:
        with contextlib.suppress(Exception):
            serve.delete("llamapy")
