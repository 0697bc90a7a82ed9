"""llamapy on Ray Serve, this machine: replicas of SmolLM2 (``-t 1`` each) on a local Ray cluster.

1. aggregate tokens/s of 1 vs 2 replicas at 1/4/16 concurrent clients (non-streamed chat, greedy,
   fixed ``max_tokens``, distinct prompts);
2. prompt-cache hit rate of prefix-aware vs round-robin routing over 20 multi-turn conversations
   (4 users at once, each 5 conversations of 3 turns; -np 2 per replica): a later turn is a hit when its
   ``timings.cache_n`` covers the whole previous turn's prompt (what one server gives it), and the share
   of prompt tokens read from the cache;
3. 32 concurrent streaming clients on 2 replicas: all finish.

Writes benchmarks/results/ray.md. Every request has a timeout; the cluster is shut down at the end.

    python benchmarks/bench_ray.py [--max-tokens 32] [--skip-throughput]
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/tokenize.py would shadow the standard library's tokenize module (used by anyio/httpx)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import httpx  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root (benchmarks.harness)
from benchmarks.harness import load, machine_line  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "ray.md"
TOPICS = ["the sea", "a mountain", "a city at night", "an old library", "a desert", "a forest", "rain",
          "a train", "the moon", "a market", "winter", "a garden", "a bridge", "a lighthouse", "a river",
          "a festival"]  # fmt: skip


async def chat(c: httpx.AsyncClient, msgs: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    r = await c.post(
        "/v1/chat/completions", json={"messages": msgs, "max_tokens": max_tokens, "temperature": 0}
    )
    r.raise_for_status()
    return r.json()


async def throughput(base: str, clients: int, max_tokens: int) -> tuple[float, int, float]:
    """(tokens/s over all clients, tokens, seconds): ``clients`` at once, each 2 requests in turn."""
    async with httpx.AsyncClient(base_url=base, timeout=600) as c:

        async def user(i: int) -> int:
            n = 0
            for k in range(2):
                topic = TOPICS[(i * 2 + k) % len(TOPICS)]
                body = await chat(c, [{"role": "user", "content": f"({i}.{k}) Write a poem about {topic}."}],
                                  max_tokens)  # fmt: skip
                n += body["usage"]["completion_tokens"]
            return n

        t0 = time.perf_counter()
        counts = await asyncio.gather(*(user(i) for i in range(clients)))
        dt = time.perf_counter() - t0
    return sum(counts) / dt, sum(counts), dt


async def conversations(base: str, max_tokens: int) -> dict[str, Any]:
    """20 conversations of 3 turns, 4 users at once: hits, cached share of prompt tokens, replica moves."""
    stats = {"turns": 0, "hits": 0, "cache_n": 0, "prompt_n": 0, "moved": 0}
    async with httpx.AsyncClient(base_url=base, timeout=600) as c:

        async def user(u: int) -> None:
            for k in range(5):
                i = u * 5 + k
                system = (
                    "You are a concise travel guide. " if i % 2 else "You are a friendly science tutor. "
                ) * 4
                msgs = [{"role": "system", "content": system},
                        {"role": "user", "content": f"Conversation {i}: tell me one fact about {TOPICS[i % 16]}."}]  # fmt: skip
                prev: tuple[int, str] | None = None
                for turn in range(3):
                    r = await c.post("/v1/chat/completions",
                                     json={"messages": msgs, "max_tokens": max_tokens, "temperature": 0})  # fmt: skip
                    r.raise_for_status()
                    body, replica = r.json(), r.headers.get("x-llamapy-replica", "")
                    t = body["timings"]
                    if prev is not None:
                        stats["turns"] += 1
                        stats["hits"] += int(t["cache_n"] >= prev[0])
                        stats["moved"] += int(replica != prev[1])
                        stats["cache_n"] += t["cache_n"]
                        stats["prompt_n"] += t["prompt_n"]
                    prev = (t["cache_n"] + t["prompt_n"], replica)
                    msgs += [{"role": "assistant", "content": body["choices"][0]["message"]["content"]},
                             {"role": "user", "content": ["Why?", "Tell me more."][turn % 2]}]  # fmt: skip

        t0 = time.perf_counter()
        await asyncio.gather(*(user(u) for u in range(4)))
        stats["seconds"] = time.perf_counter() - t0
    return stats


async def many_streams(base: str, n: int) -> tuple[int, float]:
    async with httpx.AsyncClient(base_url=base, timeout=600) as c:

        async def one(i: int) -> bool:
            body = {"messages": [{"role": "user", "content": f"Say hello ({i})."}], "max_tokens": 16,
                    "temperature": 0, "stream": True}  # fmt: skip
            async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                lines = [line async for line in r.aiter_lines()]
            return r.status_code == 200 and "data: [DONE]" in lines and not any('"error"' in x for x in lines)

        t0 = time.perf_counter()
        ok = await asyncio.gather(*(one(i) for i in range(n)))
    return sum(ok), time.perf_counter() - t0


def deploy(model: str, replicas: int, routing: str) -> float:
    from ray import serve

    from llamapy.ray import build_app

    t0 = time.perf_counter()
    serve.run(build_app(model, replicas, threads=1, parallel=2, ctx_size=4096, routing=routing), name="llamapy",
              route_prefix="/")  # fmt: skip
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2-135m-instruct")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--skip-throughput", action="store_true")
    args = ap.parse_args()

    import ray
    from ray import serve

    from llamapy import hub

    model = str(hub.resolve_model(args.model))
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=200 << 20,
             log_to_driver=False)  # fmt: skip
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    base = f"http://127.0.0.1:{port}"
    lines = [f"# llamapy on Ray Serve ({machine_line(python=True)})", "",
             f"SmolLM2-135M-Instruct Q4_1, replicas of `-t 1 -np 2`, local cluster `num_cpus=2`; "
             f"max_tokens {args.max_tokens}; load average at start {load()} (other work shares these CPUs).", ""]  # fmt: skip
    tput: dict[tuple[int, int], tuple[float, int, float]] = {}
    hit: dict[str, dict[str, Any]] = {}
    try:
        for replicas, routing in [(2, "prefix"), (2, "round_robin"), (1, "prefix")]:
            if args.skip_throughput and replicas == 1:
                continue
            up = deploy(model, replicas, routing)
            print(f"{replicas} replica(s), {routing}: deployed in {up:.1f} s (load {load()})", flush=True)
            if routing == "prefix" and not args.skip_throughput:
                for clients in (1, 4, 16):
                    tput[(replicas, clients)] = asyncio.run(throughput(base, clients, args.max_tokens))
                    print(
                        f"  {clients} clients: {tput[(replicas, clients)][0]:.1f} tok/s (load {load()})",
                        flush=True,
                    )
            if replicas == 2:
                hit[routing] = asyncio.run(conversations(base, args.max_tokens))
                print(f"  conversations: {hit[routing]} (load {load()})", flush=True)
            if replicas == 2 and routing == "prefix":
                ok, dt = asyncio.run(many_streams(base, 32))
                lines += [
                    f"32 concurrent streaming clients on 2 replicas: {ok}/32 finished in {dt:.1f} s.",
                    "",
                ]
                print(lines[-2], flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
    if tput:
        lines += ["| clients | 1 replica tok/s | 2 replicas tok/s | speed-up |", "|---|---|---|---|"]
        for clients in (1, 4, 16):
            one, two = tput.get((1, clients)), tput.get((2, clients))
            if one and two:
                lines.append(f"| {clients} | {one[0]:.1f} | {two[0]:.1f} | {two[0] / one[0]:.2f}x |")
        lines.append("")
    if hit:
        lines += ["| routing | later turns | cache hits | hit rate | prompt tokens from cache | moved replica |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for routing, h in hit.items():
            share = h["cache_n"] / max(1, h["cache_n"] + h["prompt_n"])
            lines.append(f"| {routing} | {h['turns']} | {h['hits']} | {h['hits'] / max(1, h['turns']):.0%} | "
                         f"{share:.0%} | {h['moved']} |")  # fmt: skip
        lines.append("")
    lines.append(f"Load average at the end: {load()}.")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
