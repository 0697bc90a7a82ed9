"""The garbage-collector pause of ``llamapy run``/``chat`` start-up: the command turns the collector off
until the model is loaded and back on (what start-up made frozen) before generating; the output is the
same as with the collector on throughout, an error before the load still turns it back on, and
:func:`llamapy.cli.main` called inside a longer-lived process leaves it alone."""

from __future__ import annotations

import os
import subprocess
import sys

# runs the command as ``llamapy`` does, then reports the collector's state at exit and while generating
CHILD = (
    "import atexit, gc, sys\n"
    "import llamapy.generation as g\n"
    "seen = []\n"
    "orig = g.generate\n"
    "def generate(*a, **k):\n"
    "    seen.append(gc.isenabled())\n"
    "    yield from orig(*a, **k)\n"
    "g.generate = generate\n"
    "atexit.register(lambda: print(f'\\nGC {gc.isenabled()} {gc.get_freeze_count() > 0} {seen}', file=sys.stderr))\n"
    "sys.argv = ['llamapy'] + sys.argv[1:]\n"
    "from llamapy.cli import entry\n"
    "entry()\n"
)


def _run(*argv: str, **env: str) -> subprocess.CompletedProcess:
    e = dict(os.environ, LLAMAPY_QUIET="1", LLAMAPY_FULL_EXIT="1", **env)
    return subprocess.run([sys.executable, "-c", CHILD, *argv], env=e, capture_output=True, text=True,
                          timeout=600)  # fmt: skip


def _gc_line(p: subprocess.CompletedProcess) -> str:
    return next(line for line in p.stderr.splitlines() if line.startswith("GC "))


def test_run_pauses_gc_until_the_model_is_loaded(smollm2_path) -> None:
    args = ("run", "-m", str(smollm2_path), "-p", "Hello", "-n", "8", "--temp", "0", "-t", "1")
    paused, plain = _run(*args), _run(*args, LLAMAPY_NO_GC_PAUSE="1")
    assert paused.returncode == plain.returncode == 0, paused.stderr + plain.stderr
    assert paused.stdout == plain.stdout and paused.stdout
    assert _gc_line(paused) == "GC True True [True]"  # on (start-up frozen) before the first token
    assert _gc_line(plain) == "GC True False [True]"


def test_an_error_before_the_load_turns_gc_back_on(smollm2_path) -> None:
    bad = _run("run", "-m", str(smollm2_path) + ".missing", "-p", "x")
    assert bad.returncode == 1 and "error: " in bad.stderr
    assert _gc_line(bad) == "GC True False []"


def test_main_in_process_leaves_gc_alone() -> None:
    code = (
        "import gc\nfrom llamapy.cli import main\n"
        "rc = main(['run', '-m', '/nonexistent.gguf', '-p', 'x'])\n"
        "print(rc, gc.isenabled(), gc.get_freeze_count())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, LLAMAPY_QUIET="1"),
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert out.stdout.strip().splitlines()[-1] == "1 True 0", out.stderr
