"""The chat page (issue 28 §1): its bundle size, and in headless Chromium against a real `llamapy serve`:
first contentful paint, the time until the page has listed the models (ready), and the time from Enter to
the first streamed token on the page (the server's prompt time plus the page's own work), each over
fresh browser contexts (cold cache). Prints Markdown tables.

    python benchmarks/bench_webui.py [-m smollm2-135m-instruct] [-n 5] [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import gzip  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root (benchmarks.harness)
from benchmarks import harness  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / "llamapy" / "server" / "webui_dist"

READY = "() => !!document.querySelector('.model-name, #model')"
WATCH = """() => {
  window.__t0 = 0; window.__t1 = 0;
  document.querySelector('#input').addEventListener('keydown', e => {
    if (e.key === 'Enter') window.__t0 = performance.now(); }, true);
  new MutationObserver(() => {
    const c = document.querySelector('.msg.assistant .content');
    if (!window.__t1 && c && c.textContent.trim()) window.__t1 = performance.now();
  }).observe(document.querySelector('.thread'), {subtree: true, childList: true, characterData: true});
}"""


def bundle_table() -> str:
    rows = ["| file | bytes | gzip -9 |", "|---|---:|---:|"]
    total = [0, 0]
    for f in sorted(BUNDLE.iterdir()):
        if not f.is_file() or f.name == "SOURCE_HASH":
            continue
        raw = f.read_bytes()
        gz = len(gzip.compress(raw, 9))
        total[0] += len(raw)
        total[1] += gz
        rows.append(f"| {re.sub(r'-[A-Z0-9]{8}', '', f.name)} | {len(raw):,} | {gz:,} |")
    fonts = sum(f.stat().st_size for f in (BUNDLE / "fonts").iterdir())
    rows.append(f"| fonts/ (KaTeX woff2, on the first formula) | {fonts:,} | - |")
    first = sum(len(f.read_bytes()) for f in BUNDLE.glob("app-*")) + (BUNDLE / "index.html").stat().st_size
    first_gz = sum(
        len(gzip.compress(f.read_bytes(), 9)) for f in [*BUNDLE.glob("app-*"), BUNDLE / "index.html"]
    )
    rows.append(f"| **first load** (index, app.js, app.css) | **{first:,}** | **{first_gz:,}** |")
    return "\n".join(rows)


@contextmanager
def serve(model: str, extra: list[str]) -> Iterator[str]:
    try:
        srv = harness.start_server("llamapy", model, ["--log-level", "warning", *extra], timeout=600)
    except RuntimeError:
        raise SystemExit("llamapy serve did not start") from None
    with srv:
        yield srv.base


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.0f} ms (min {min(xs):.0f}, max {max(xs):.0f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2-135m-instruct")
    ap.add_argument("-n", type=int, default=5, help="fresh browser contexts per measure")
    ap.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    ap.add_argument("--prompt", default="Name three colors.")
    args = ap.parse_args()
    print(f"## bundle ({BUNDLE.relative_to(ROOT)})\n\n{bundle_table()}\n")
    if not args.chromium:
        raise SystemExit("no chromium: apt-get install chromium (or --chromium PATH)")
    from playwright.sync_api import sync_playwright

    from llamapy import hub

    model = args.model if os.path.exists(args.model) else str(hub.pull(args.model, quiet=True))
    fcp, ready, ttft, total = [], [], [], []
    with serve(model, ["-c", "2048"]) as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
        settings = '{"max_tokens": "16", "temperature": "0"}'
        for i in range(args.n + 1):  # the first round warms the server (its first request) and is dropped
            ctx = browser.new_context(viewport={"width": 1280, "height": 800})
            ctx.add_init_script(f"localStorage.setItem('llamapy.settings', {settings!r})")
            page = ctx.new_page()
            t = time.perf_counter()
            page.goto(base + "/")
            page.wait_for_function(READY)
            t_ready = (time.perf_counter() - t) * 1e3
            paint = page.evaluate(
                "() => performance.getEntriesByName('first-contentful-paint')[0]?.startTime ?? 0"
            )
            page.evaluate(WATCH)
            page.fill("#input", f"{args.prompt} ({i})")
            t = time.perf_counter()
            page.press("#input", "Enter")
            page.wait_for_function("() => window.__t1 > 0", timeout=120_000)
            page.wait_for_function(
                "() => !document.querySelector('#stop') && !!document.querySelector('.stats')"
            )
            t_total = (time.perf_counter() - t) * 1e3
            first = page.evaluate("() => window.__t1 - window.__t0")
            if i:
                fcp.append(paint)
                ready.append(t_ready)
                ttft.append(first)
                total.append(t_total)
            ctx.close()
        browser.close()
    print(f"## in the browser ({Path(model).name}, {args.n} fresh contexts, {os.cpu_count()} cores)\n")
    print("| measure | median |\n|---|---|")
    print(f"| first contentful paint | {med(fcp)} |")
    print(f"| page ready (models listed) | {med(ready)} |")
    print(f"| Enter to first streamed token | {med(ttft)} |")
    print(f"| Enter to answer done (16 tokens) | {med(total)} |")


if __name__ == "__main__":
    main()
