"""One server under streamed chat load, for side-by-side runs: llama-server or `llamapy serve`.

Starts the server on 127.0.0.1 (a free port) with -np PARALLEL, waits until /health says ok, then:

1. cold: the first chat request after start (its time to first token, TTFT), then a second one (warm);
2. for each N in --clients: N streamed /v1/chat/completions at once (greedy, ignore_eos, max_tokens
   tokens each), aggregate generated tokens / wall seconds, requests finished vs sent (none lost);

and prints Markdown table rows (``--md-rows-only``: rows only, for benchmarks/compare_llamacpp.sh) or
JSON (``--json``). Every request has a timeout; the server is stopped at the end.

    python benchmarks/server_compare.py --server llamapy -m MODEL [--clients 1,4,16,32] [--max-tokens 128]
    python benchmarks/server_compare.py --server llama.cpp --bin ~/.cache/llamapy/llamacpp/0.3.36/build/bin ...
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/tokenize.py would shadow the standard library's tokenize module (used by anyio/httpx)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import httpx  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.harness import Server, start_server  # noqa: E402

PROMPTS = [
    "Tell me a story about a lighthouse keeper.",
    "Explain how a bicycle works.",
    "Write a short poem about the sea.",
    "What should I pack for a week of hiking?",
]
HEADER = (
    "| server | round | clients | requests ok/sent | tokens | seconds | aggregate t/s | TTFT median s |\n"
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
)


def start(args: argparse.Namespace) -> Server:
    """Start the server (``.base``; ``.seconds`` until /health said ok)."""
    extra = ["-np", str(args.parallel), "-c", str(args.ctx * args.parallel), "-t", str(args.threads)]
    if args.server == "llamapy":
        extra += ["--log-level", "warning"]
    try:
        return start_server(args.server, args.model, extra, timeout=args.start_timeout,
                            bin_dir=Path(args.bin) if args.bin else None)  # fmt: skip
    except RuntimeError as e:
        raise SystemExit(f"{args.server}: the server did not become healthy: {e}") from None


async def chat(client: httpx.AsyncClient, prompt: str, max_tokens: int) -> dict:
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    t0 = time.perf_counter()
    t_first = None
    n, finish = 0, None
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                return {"error": f"HTTP {resp.status_code}"}
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                for c in chunk.get("choices", []):
                    if (c.get("delta") or {}).get("content"):
                        t_first = t_first or time.perf_counter()
                        n += 1  # one content chunk per token on both servers
                    finish = c.get("finish_reason") or finish
    except httpx.HTTPError as e:
        return {"error": f"{type(e).__name__}: {e}"}
    t1 = time.perf_counter()
    if finish is None:
        return {"error": "stream ended without a finish_reason"}
    return {"tokens": n, "seconds": t1 - t0, "ttft": (t_first or t1) - t0}


async def load(base: str, clients: int, max_tokens: int, timeout: float, first: int = 0) -> dict:
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(base_url=base, timeout=timeout, limits=limits) as c:
        t0 = time.perf_counter()
        res = await asyncio.gather(
            *(chat(c, PROMPTS[(first + i) % len(PROMPTS)], max_tokens) for i in range(clients))
        )
        dt = time.perf_counter() - t0
    ok = [r for r in res if "error" not in r]
    ttft = sorted(r["ttft"] for r in ok)
    return {
        "clients": clients,
        "sent": clients,
        "ok": len(ok),
        "errors": [r["error"] for r in res if "error" in r][:3],
        "tokens": sum(r["tokens"] for r in ok),
        "seconds": dt,
        "tokens_per_s": sum(r["tokens"] for r in ok) / dt,
        "ttft_median": ttft[len(ttft) // 2] if ttft else float("nan"),
    }


def main() -> int:
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # still stop the server
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", choices=("llamapy", "llama.cpp"), required=True)
    ap.add_argument("--bin", default="", help="llama.cpp's build/bin (for --server llama.cpp)")
    ap.add_argument("-m", "--model", required=True, help="GGUF path")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=1024, help="context per slot")
    ap.add_argument("--clients", default="1,4,16,32")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--timeout", type=float, default=600, help="per request (seconds)")
    ap.add_argument("--start-timeout", type=float, default=600)
    ap.add_argument("--round", type=int, default=1)
    ap.add_argument("--md-rows-only", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    clients = [int(x) for x in args.clients.split(",") if x]
    srv = start(args)
    base, t_ready = srv.base, srv.seconds
    try:
        cold = asyncio.run(load(base, 1, 8, args.timeout))
        warm = asyncio.run(load(base, 1, 8, args.timeout, first=1))  # another prompt: no reused graph
        runs = [asyncio.run(load(base, n, args.max_tokens, args.timeout)) for n in clients]
    finally:
        srv.stop()
    if args.json:
        print(
            json.dumps({"server": args.server, "ready_s": t_ready, "cold": cold, "warm": warm, "runs": runs})
        )
        return 0 if all(r["ok"] == r["sent"] for r in runs) else 1
    rows = [] if args.md_rows_only else [HEADER]
    s, r = args.server, args.round
    rows.append(
        f"| {s} | {r} | start-up | /health ok after {t_ready:.2f} s | | | | first request "
        f"{cold['ttft_median']:.2f}, second {warm['ttft_median']:.2f} |"
    )
    for x in runs:
        rows.append(
            f"| {s} | {r} | {x['clients']} | {x['ok']}/{x['sent']} | {x['tokens']} | {x['seconds']:.1f} "
            f"| {x['tokens_per_s']:.1f} | {x['ttft_median']:.2f} |"
        )
    print("\n".join(rows))
    return 0 if all(x["ok"] == x["sent"] for x in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
