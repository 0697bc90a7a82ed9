"""Where the CPU time of one ``llamapy run`` goes, phase by phase, in one process (issue 25: the whole
``run -p Hello -n 16`` against llama.cpp's ``llama-completion``).

    python benchmarks/startup_phases.py [--runs 3] -- run -m FILE -p Hello -n 16 -c 4096 --temp 0 -t 1

Each run is a fresh ``python`` that runs the command as ``llamapy`` does (``llamapy.cli.entry``'s GC
pause included) with wrappers that read ``time.process_time()`` (this process's CPU time, all threads)
at the phase boundaries: imports (parsing the arguments imports NumPy, Numba and the model code), the
model load (of it: the vocabulary), the context, the first token (of it: repacking weights, loading the
cached Numba kernels), the other tokens. Also counted: garbage collections and their CPU time. The
median over ``--runs`` is printed per phase, in ms. CPU time rather than wall time, so that a machine
shared with other work still gives comparable numbers; use ``-t 1`` for the same reason (idle OpenMP
threads spin, and on a busy machine that spinning is CPU time too).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CHILD = r"""
import gc, json, os, sys, time
T = time.process_time
if os.environ.get("PHASES_LAUNCH"):  # --wall: seconds since the parent started this process
    T = lambda: time.time() - float(os.environ["PHASES_LAUNCH"])
marks = {}
acc = {"repack": 0.0, "kernel loads": 0.0, "vocab": 0.0, "gc": 0.0}
n = {"repacked tensors": 0, "kernels loaded": 0, "collections": 0}
gc_t = [0.0]
def on_gc(phase, info):
    if phase == "start":
        gc_t[0] = T()
    else:
        acc["gc"] += T() - gc_t[0]
        n["collections"] += 1
gc.callbacks.append(on_gc)
def timed(obj, name, key, count=None):
    f = getattr(obj, name)
    def w(*a, **k):
        t = T()
        try:
            return f(*a, **k)
        finally:
            acc[key] += T() - t
            if count:
                n[count] += 1
    setattr(obj, name, w)
t0 = T()
sys.argv = ["llamapy"] + sys.argv[1:]
import llamapy.cli as cli
import llamapy.cli.gcpause as gcpause
if cli._subcommand(sys.argv[1:]) in cli._GC_PAUSE:
    gcpause.pause()
if cli._subcommand(sys.argv[1:]) in cli._FAST_EXIT:
    cli._KEEP = []  # as entry(): the model is kept to the fast exit, not freed on the way out
cli._prefetch_model(sys.argv[1:])  # as main(): the page-cache and mapping thread
parser = cli.build_parser(cli._subcommand(sys.argv[1:]))
marks["imports"] = T()
import numba.core.dispatcher as D
import llamapy.generation as g
import llamapy.model.model as mm
import llamapy.context as cx
import llamapy.ggml.cpu.repack as rp
timed(D.Dispatcher, "_compile_for_args", "kernel loads", "kernels loaded")
timed(rp, "repacked", "repack", "repacked tensors")
timed(mm, "_load_vocab", "vocab")
load = mm.Model.load.__func__
def model_load(cls, *a, **k):
    marks["before load"] = T()
    try:
        return load(cls, *a, **k)
    finally:
        marks["model load"] = T()
mm.Model.load = classmethod(model_load)
ctx_init = cx.Context.__init__
def context_init(self, *a, **k):
    ctx_init(self, *a, **k)
    marks["context"] = T()
cx.Context.__init__ = context_init
gen = g.generate
def generate(*a, **k):
    marks["before generate"] = T()
    first = True
    for s in gen(*a, **k):
        if first:
            marks["first token"] = T()
            first = False
        yield s
    marks["other tokens"] = T()
g.generate = generate
args = parser.parse_args(sys.argv[1:])
marks["arguments"] = T()
try:
    rc = args.func(args)
finally:
    gcpause.end()
end = T()
out = {"python start": t0, "imports": marks["imports"] - t0}
out["model load"] = marks["model load"] - marks["before load"]
out["  of it: vocabulary"] = acc["vocab"]
out["context"] = marks["context"] - marks["model load"]
out["first token"] = marks["first token"] - marks["before generate"]
out["  of it: repacking"] = acc["repack"]
out["  of it: kernel loads"] = acc["kernel loads"]
out["other tokens"] = marks["other tokens"] - marks["first token"]
out["the rest"] = end - t0 - sum(v for k, v in out.items() if not k.startswith(" ") and k != "python start")
out["  of it: arguments"] = marks["before load"] - marks["arguments"]
out["  of it: prompt set-up"] = marks["before generate"] - marks["context"]
out["  of it: after the tokens"] = end - marks["other tokens"]
out["garbage collections"] = acc["gc"]
out["total"] = end
print("\nPHASES " + json.dumps({"ms": {k: v * 1000 for k, v in out.items()}, "n": n}), file=sys.stderr)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--wall", action="store_true", help="wall-clock time from the process's launch, not CPU time"
    )
    ap.add_argument("argv", nargs=argparse.REMAINDER, help="-- then the llamapy arguments (run ...)")
    a = ap.parse_args()
    argv = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
    if not argv or argv[0] != "run":
        ap.error("give the command after --, e.g. -- run -m FILE -p Hello -n 16 -t 1")
    env = dict(os.environ, LLAMAPY_QUIET="1")
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # a run without .pyc files spends ~0.5 s compiling Python
    rows = []
    for i in range(a.runs + 1):  # the first run warms the caches (page cache, .pyc, Numba)
        if a.wall:
            env["PHASES_LAUNCH"] = repr(time.time())
        p = subprocess.run([sys.executable, "-c", CHILD, *argv], env=env, capture_output=True, text=True)
        if p.returncode:
            raise SystemExit(p.stderr)
        if i:
            line = next(x for x in p.stderr.splitlines() if x.startswith("PHASES "))
            rows.append(json.loads(line[7:]))
    print(
        f"# llamapy {' '.join(argv)}: {'wall ms from launch' if a.wall else 'CPU ms (process_time)'}, median of {a.runs}; load {os.getloadavg()[0]:.1f}"
    )
    for k in rows[0]["ms"]:
        print(f"{k:26s} {statistics.median(r['ms'][k] for r in rows):8.1f}")
    for k in rows[0]["n"]:
        print(f"{k:26s} {statistics.median(r['n'][k] for r in rows):8.0f}")


if __name__ == "__main__":
    main()
