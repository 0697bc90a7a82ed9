"""Load test of `llamapy serve`: N concurrent streaming clients on -np 4 (loopback only, bounded).

Starts `python -m llamapy serve` on 127.0.0.1 (a free port) with SmolLM2, then:

1. solo: each distinct prompt once, one client at a time (the single-client baseline and the
   reference answers: greedy, fixed length);
2. load: CLIENTS streaming clients at once (each prompt CLIENTS/len(PROMPTS) times), while a poller
   measures /health latency every 100 ms;
3. checks: every request finished with a finish_reason, none lost, each answer equals its prompt's
   solo answer (nothing mixed up between slots), all ids distinct;

and writes the numbers to benchmarks/results/server_load.{json,md}. Every request has a timeout and
the whole run a deadline; the server is stopped at the end.

    python benchmarks/server_load.py [--clients 32] [--parallel 4] [--max-tokens 32]
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/tokenize.py would shadow the standard library's tokenize module (used by anyio/httpx)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import httpx  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root (benchmarks.harness)
from benchmarks.harness import machine_line  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root (benchmarks.harness)
from benchmarks import harness  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "Quantization reduces the size of a neural network by",
    "1, 2, 3, 4, 5, 6, 7,",
]


def start_server(model: str, parallel: int, ctx: int, threads: int | None) -> tuple[subprocess.Popen, str]:
    args = ["-np", str(parallel), "-c", str(ctx), "--metrics", "--log-level", "warning"]
    if threads:
        args += ["-t", str(threads)]
    try:
        srv = harness.start_server("llamapy", model, args, timeout=300)
    except RuntimeError as e:
        raise SystemExit(f"server did not start: {e}") from None
    return srv.proc, srv.base


async def stream_one(client: httpx.AsyncClient, prompt: str, max_tokens: int) -> dict:
    body = {
        "model": "m",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    t_first = None
    text, ids, finish, usage, n_chunks = [], set(), None, None, 0
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            return {"error": f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"}
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return {"error": chunk["error"]}
            ids.add(chunk["id"])
            n_chunks += 1
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk["choices"]:
                if c["text"] and t_first is None:
                    t_first = time.perf_counter()
                text.append(c["text"])
                finish = c["finish_reason"] or finish
    t1 = time.perf_counter()
    return {
        "prompt": prompt,
        "text": "".join(text),
        "finish_reason": finish,
        "completion_tokens": (usage or {}).get("completion_tokens", 0),
        "ids": sorted(ids),
        "seconds": t1 - t0,
        "ttft": (t_first or t1) - t0,
    }


async def poll_health(base: str, stop: asyncio.Event, out: list[float]) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=30) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            r = await c.get("/health")
            out.append((time.perf_counter() - t0) * 1e3 if r.status_code == 200 else float("inf"))
            try:
                await asyncio.wait_for(stop.wait(), 0.1)
            except asyncio.TimeoutError:
                pass


async def run(base: str, clients: int, max_tokens: int, timeout: float, warmup: int) -> dict:
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(base_url=base, timeout=timeout, limits=limits) as c:
        # warm-up (not timed): JIT compilation and first-use costs of this process, for one client
        # and for mixed batches of several slots
        for p in PROMPTS:
            await stream_one(c, p, max_tokens)
        await asyncio.gather(*(stream_one(c, PROMPTS[i % len(PROMPTS)], max_tokens) for i in range(warmup)))
        solo, t0 = [], time.perf_counter()
        for p in PROMPTS:
            solo.append(await stream_one(c, p, max_tokens))
        solo_s = time.perf_counter() - t0
        health: list[float] = []
        stop = asyncio.Event()
        poller = asyncio.create_task(poll_health(base, stop, health))
        jobs = [PROMPTS[i % len(PROMPTS)] for i in range(clients)]
        t0 = time.perf_counter()
        results = await asyncio.wait_for(
            asyncio.gather(*(stream_one(c, p, max_tokens) for p in jobs), return_exceptions=True), timeout
        )
        load_s = time.perf_counter() - t0
        stop.set()
        await poller
        metrics = (await c.get("/metrics")).text
    solo_tokens = sum(r["completion_tokens"] for r in solo)
    ok = [r for r in results if isinstance(r, dict) and "error" not in r]
    failed = [repr(r)[:300] for r in results if not (isinstance(r, dict) and "error" not in r)]
    ref = {r["prompt"]: r["text"] for r in solo}
    load_tokens = sum(r["completion_tokens"] for r in ok)
    all_ids = [i for r in ok for i in r["ids"]]
    finite = sorted(h for h in health if h != float("inf"))
    return {
        "clients": clients,
        "max_tokens": max_tokens,
        "solo": {
            "requests": len(solo),
            "tokens": solo_tokens,
            "seconds": solo_s,
            "tokens_per_s": solo_tokens / solo_s,
        },
        "load": {
            "requests": len(results),
            "finished": len(ok),
            "failed": failed,
            "with_finish_reason": sum(1 for r in ok if r["finish_reason"] in ("stop", "length")),
            "same_as_solo": sum(1 for r in ok if r["text"] == ref[r["prompt"]]),
            "distinct_ids": len(set(all_ids)) == len(all_ids) == len(ok),
            "tokens": load_tokens,
            "seconds": load_s,
            "tokens_per_s": load_tokens / load_s,
            "ttft_s_median": statistics.median(r["ttft"] for r in ok) if ok else None,
            "ttft_s_max": max((r["ttft"] for r in ok), default=None),
        },
        "speedup_vs_solo": (load_tokens / load_s) / (solo_tokens / solo_s),
        "health_ms": {
            "n": len(health),
            "failed": len(health) - len(finite),
            "p50": statistics.median(finite) if finite else None,
            "p95": finite[int(0.95 * (len(finite) - 1))] if finite else None,
            "max": finite[-1] if finite else None,
        },
        "metrics": [line for line in metrics.splitlines() if line and not line.startswith("#")],
        "mismatches": [
            {"prompt": r["prompt"], "got": r["text"], "solo": ref[r["prompt"]]}
            for r in ok
            if r["text"] != ref[r["prompt"]]
        ][:4],
    }


def machine() -> str:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{machine_line(python=True)}, {platform.system()}; load average at the end {load} "
        "(other work shares these CPUs)"
    )


def main() -> int:
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout` etc.: still stop the server
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2-135m-instruct")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=900, help="deadline for the load phase (seconds)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "server_load"))
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from llamapy.hub import resolve_model

    model = str(resolve_model(args.model))
    proc, base = start_server(model, args.parallel, args.ctx, args.threads)
    try:
        res = asyncio.run(run(base, args.clients, args.max_tokens, args.timeout, 2 * args.parallel))
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
    cmd = " ".join(["python", "benchmarks/server_load.py", *sys.argv[1:]])
    res = {
        "command": cmd,
        "machine": machine(),
        "model": Path(model).name,
        "parallel": args.parallel,
        "ctx": args.ctx,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        **res,
    }
    Path(args.out + ".json").write_text(json.dumps(res, indent=2) + "\n")
    ld, so, h = res["load"], res["solo"], res["health_ms"]
    md = f"""# llamapy serve under load

- command: `{cmd}`
- machine: {res["machine"]}
- server: `llamapy serve -m {res["model"]} -np {args.parallel} -c {args.ctx}` on 127.0.0.1, {res["date"]}
- each request: `/v1/completions`, streamed, greedy, ignore_eos, max_tokens {args.max_tokens}; untimed warm-up first
  (each prompt alone, then {2 * args.parallel} concurrent requests: JIT compilation of this process)

| | requests | generated tokens | seconds | tokens/s |
|---|---|---|---|---|
| one client alone | {so["requests"]} | {so["tokens"]} | {so["seconds"]:.1f} | {so["tokens_per_s"]:.1f} |
| {args.clients} concurrent clients | {ld["requests"]} | {ld["tokens"]} | {ld["seconds"]:.1f} | {ld["tokens_per_s"]:.1f} |

- aggregate speed-up over one client: **{res["speedup_vs_solo"]:.2f}x**
- finished: {ld["finished"]}/{ld["requests"]}, with a finish_reason: {ld["with_finish_reason"]}, failed: {len(ld["failed"])}
- same text as the prompt's solo answer (nothing mixed up): {ld["same_as_solo"]}/{ld["finished"]}; distinct ids: {ld["distinct_ids"]}
- time to first token under load: median {ld["ttft_s_median"]:.2f} s, max {ld["ttft_s_max"]:.2f} s
- /health latency under load ({h["n"]} probes, every 100 ms): p50 {h["p50"]:.1f} ms, p95 {h["p95"]:.1f} ms, max {h["max"]:.1f} ms, failed {h["failed"]}
"""
    Path(args.out + ".md").write_text(md)
    print(md)
    good = ld["finished"] == ld["requests"] == ld["with_finish_reason"] and ld["distinct_ids"]
    return 0 if good else 1


if __name__ == "__main__":
    raise SystemExit(main())
