"""Whole-process start-up and peak memory: ``llamapy run -p Hello -n 16 -c 4096`` against llama.cpp's
``llama-completion`` with the same arguments, runs interleaved (issue 16, Start-up and Memory).

    python benchmarks/startup_run.py [--runs 5] [--tree DIR ...] [--model FILE ...] [--llamacpp BIN]

Each ``--tree`` is a llamapy checkout run as ``python -m llamapy`` from that directory (default: this
one), so a copy of an older revision can be compared in the same minute. Reported per command: the
fastest and the median wall time, CPU time (user + system) and peak RSS (``ru_maxrss`` of the child).
The Numba cache is warmed by one untimed run of each tree and model first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root (benchmarks.harness)
from benchmarks.harness import llamacpp_bin, machine_line  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODELS = Path.home() / ".cache" / "llamapy" / "models"
LLAMACPP = llamacpp_bin() / "llama-completion"
ARGS = ["-p", "Hello", "-n", "16", "-c", "4096", "--temp", "0"]


def run(cmd: list[str], cwd: Path) -> tuple[float, float, int]:
    """(wall s, cpu s, peak RSS MiB) of one child process."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "NUMBA_CACHE_DIR")}
    env["LLAMAPY_QUIET"] = "1"
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)  # fmt: skip
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} (in {cwd}) failed with status {os.waitstatus_to_exitcode(status)}")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss // 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument(
        "--tree", action="append", type=Path, help="llamapy checkout(s) to run (default: this one)"
    )
    ap.add_argument("--model", action="append", help="GGUF file(s) (default: SmolLM2 and Gemma 3 270M)")
    ap.add_argument("--llamacpp", type=Path, default=LLAMACPP)
    a = ap.parse_args()
    trees = a.tree or [ROOT]
    models = a.model or [
        str(MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"),
        str(MODELS / "gemma-3-270m-q4_k_m.gguf"),
    ]
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {machine_line(load_avg=True, python=True)}"
    )
    cmds: list[tuple[str, list[str], Path]] = []
    for m in models:
        for t in trees:
            cmds.append(
                (
                    f"llamapy {t.name} {Path(m).name}",
                    [sys.executable, "-m", "llamapy", "run", "-m", m, *ARGS],
                    t,
                )
            )
        if a.llamacpp.exists():
            cmds.append((f"llama.cpp {Path(m).name}", [str(a.llamacpp), "-m", m, *ARGS, "-no-cnv"], ROOT))
    for _, cmd, cwd in cmds:  # warm the page cache and the kernel cache
        run(cmd, cwd)
    res: dict[str, list[tuple[float, float, int]]] = {name: [] for name, _, _ in cmds}
    for _ in range(a.runs):
        for name, cmd, cwd in cmds:
            res[name].append(run(cmd, cwd))
    print(f"# {a.runs} interleaved runs each; load average after: {os.getloadavg()}")
    print("| command | wall min / median (s) | CPU min (s) | peak RSS (MiB) |")
    print("| --- | --- | --- | --- |")
    for name, rows in res.items():
        walls = [r[0] for r in rows]
        print(
            f"| {name} | {min(walls):.2f} / {statistics.median(walls):.2f} | {min(r[1] for r in rows):.2f} "
            f"| {max(r[2] for r in rows)} |"
        )


if __name__ == "__main__":
    main()
