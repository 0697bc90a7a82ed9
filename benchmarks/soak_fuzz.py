"""Soak `llamapy serve` with the structure-aware request fuzzer for an hour (issue 33).

    python benchmarks/soak_fuzz.py [--seconds 3600] [-m smollm2-135m-instruct] [--out DIR] [--routes R ...]

Starts ``python -m llamapy serve -m MODEL`` on 127.0.0.1 (a free port, -np 2, a slot folder, an API key,
the default 8 MiB body limit) and sends it, one at a time, the mutated request bodies of
``tests/server/fuzz_bodies.py`` (the same strategies as ``tests/server/test_fuzz_routes.py``: wrong JSON
types at any depth, deep and wide values, huge and hostile strings, edge numbers, missing and extra
fields, raw-byte damage) for every POST route of the app, round-robin in batches, until ``--seconds``
have passed. Every answer must be a 2xx or a 4xx in the API's own error shape (a 501 for a feature the
server was not started with), within ``--deadline`` seconds, a stream must end with its final event or an
error event, and after each request ``/health`` must answer 200 and the process must be alive.

Prints requests/s, the status histogram and latency percentiles per route; every failing body is saved to
``DIR/failures/`` (with a ``.txt`` saying what was wrong) for reproduction, e.g.
``curl -H 'Authorization: Bearer soak' -H 'content-type: application/json' --data-binary @FILE URL``.
The exit status is 1 on any failure (a 5xx, a hang, a dropped connection, a wrong error shape, a
broken stream, a dead or unhealthy server), else 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/tokenize.py-like names would shadow the standard library; the repository root has tests/
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root (benchmarks.harness)
from benchmarks import harness  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import httpx  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402

from tests.server.fuzz_bodies import Case, cases, check, healthy, post_routes, served_model  # noqa: E402

API_KEY = "soak"


def start_server(model: str, ctx: int, slot_dir: str, log_path: Path) -> tuple[subprocess.Popen, str]:
    args = ["-np", "2", "-c", str(ctx), "--metrics", "--log-level", "warning", "--api-key", API_KEY]
    args += ["--slot-save-path", slot_dir]
    try:
        srv = harness.start_server("llamapy", model, args, timeout=600, log=log_path)
    except RuntimeError:
        raise SystemExit(f"the server did not start (see {log_path})") from None
    return srv.proc, srv.base


class Soak:
    def __init__(self, base: str, proc: subprocess.Popen, out: Path, deadline: float, t_end: float) -> None:
        self.base, self.proc, self.out, self.deadline, self.t_end = base, proc, out, deadline, t_end
        self.client = httpx.Client(headers={"authorization": f"Bearer {API_KEY}"})
        self.statuses: collections.Counter[str] = collections.Counter()
        self.by_route: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.seconds: dict[str, list[float]] = collections.defaultdict(list)
        self.failures: list[str] = []
        self.dead = False
        self.n = 0
        self.model = served_model(self.client, base)

    def _record_failure(self, case: Case, problem: str, seconds: float) -> None:
        fdir = self.out / "failures"
        fdir.mkdir(parents=True, exist_ok=True)
        stem = f"{len(self.failures):04d}-" + re.sub(r"[^a-z0-9]+", "_", case.url.lower()).strip("_")
        (fdir / f"{stem}.json").write_bytes(case.body)
        (fdir / f"{stem}.txt").write_text(f"{problem}\nafter {seconds:.2f} s\n{case.describe(2000)}\n")
        self.failures.append(f"{problem[:200]} | {case.describe(150)} | {fdir / stem}.json")
        print(f"FAILURE {len(self.failures)}: {problem[:300]}\n  {case.describe(200)}", flush=True)

    def one(self, case: Case) -> None:
        if self.dead or time.monotonic() > self.t_end:
            return
        res = check(self.client, self.base, case, self.deadline)
        self.n += 1
        key = "none" if res.status is None else str(res.status)
        self.statuses[key] += 1
        self.by_route[case.route][key] += 1
        self.seconds[case.route].append(res.seconds)
        if res.problem:
            self._record_failure(case, res.problem, res.seconds)
        if self.proc.poll() is not None:
            self.dead = True
            self._record_failure(case, f"the server process died (exit {self.proc.returncode})", res.seconds)
            return
        bad = healthy(self.client, self.base, timeout=30)
        if bad:
            self._record_failure(case, f"the server is unwell after the request: {bad}", res.seconds)

    def batch(self, route: str, n: int) -> None:
        @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(case=cases(route, real=True, model=self.model))
        def run(case: Case) -> None:
            self.one(case)

        run()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3600.0, help="how long to fuzz (default 3600)")
    ap.add_argument("-m", "--model", default="smollm2-135m-instruct", help="model file or name")
    ap.add_argument("-c", "--ctx", type=int, default=2048, help="context size (-c; 2 slots share it)")
    ap.add_argument("--deadline", type=float, default=30.0, help="seconds one answer may take")
    ap.add_argument("--batch", type=int, default=25, help="examples per route before the next route")
    ap.add_argument("--routes", nargs="*", help="only these route templates (default: every POST route)")
    ap.add_argument("--out", type=Path, help="where failures and the server log go (default: a temp dir)")
    args = ap.parse_args()

    from llamapy.server.app import ServerSettings, create_app

    routes = post_routes(create_app(ServerSettings(), lambda: None))  # type: ignore[arg-type,return-value]
    if args.routes:
        unknown = set(args.routes) - set(routes)
        if unknown:
            raise SystemExit(f"error: no such POST route(s): {sorted(unknown)}; the app has {routes}")
        routes = args.routes
    out = args.out or Path(tempfile.mkdtemp(prefix="llamapy-soak-fuzz-"))
    out.mkdir(parents=True, exist_ok=True)
    slot_dir = out / "slots"
    slot_dir.mkdir(exist_ok=True)
    print(f"starting llamapy serve -m {args.model} (log: {out / 'server.log'})", flush=True)
    proc, base = start_server(args.model, args.ctx, str(slot_dir), out / "server.log")
    t0 = time.monotonic()
    soak = Soak(base, proc, out, args.deadline, t0 + args.seconds)
    last = t0
    try:
        while time.monotonic() < soak.t_end and not soak.dead:
            for route in routes:
                if time.monotonic() >= soak.t_end or soak.dead:
                    break
                soak.batch(route, args.batch)
                if set(soak.by_route[route]) == {"501"}:  # e.g. /v1/embeddings on a generating model
                    print(f"{route}: only 501s (a feature this server was not started with); dropped")
                    routes = [r for r in routes if r != route]
                if time.monotonic() - last > 60:
                    last = time.monotonic()
                    el = last - t0
                    print(f"[{el:6.0f} s] {soak.n} requests ({soak.n / el:.1f}/s), statuses "
                          f"{dict(sorted(soak.statuses.items()))}, failures {len(soak.failures)}", flush=True)  # fmt: skip
    finally:
        soak.client.close()
        alive = proc.poll() is None
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    elapsed = time.monotonic() - t0
    summary = {
        "seconds": round(elapsed, 1),
        "requests": soak.n,
        "requests_per_s": round(soak.n / elapsed, 2) if elapsed else 0.0,
        "statuses": dict(sorted(soak.statuses.items())),
        "server_alive_at_end": alive,
        "failures": soak.failures,
        "routes": {
            r: {
                "n": len(s),
                "statuses": dict(sorted(soak.by_route[r].items())),
                "p50_s": round(statistics.median(s), 3),
                "max_s": round(max(s), 3),
            }
            for r, s in soak.seconds.items()
        },
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(
        f"\n{soak.n} requests in {elapsed:.0f} s ({summary['requests_per_s']}/s); statuses {summary['statuses']}"
    )
    for r, v in summary["routes"].items():
        print(f"  {r:28s} n={v['n']:5d} p50={v['p50_s']:.3f}s max={v['max_s']:.2f}s {v['statuses']}")
    print(f"failures: {len(soak.failures)} (bodies in {out / 'failures'}); summary: {out / 'summary.json'}")
    for f in soak.failures[:50]:
        print("  " + f)
    return 1 if soak.failures or not alive else 0


if __name__ == "__main__":
    sys.exit(main())
