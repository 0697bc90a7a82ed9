"""Start-up of the command line: a subcommand imports only its own module, and the compute-and-print
subcommands leave without the interpreter's teardown, their output complete."""

from __future__ import annotations

import os
import subprocess
import sys

from llamapy.cli import SUBCOMMANDS, build_parser


def _py(code: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    e = dict(os.environ, LLAMAPY_QUIET="1", **env)
    return subprocess.run([sys.executable, *args, "-c", code] if code else [sys.executable, *args], env=e,
                          capture_output=True, text=True, timeout=600)  # fmt: skip


def test_one_subcommand_imports_only_its_module() -> None:
    code = (
        "import sys\nfrom llamapy.cli import build_parser\nbuild_parser('run').parse_args(['run', '-p', 'x'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('llamapy.cli.')))"
    )
    out = _py(code)
    assert out.returncode == 0, out.stderr
    # (gcpause: the start-up GC pause's state, a few lines every command shares; compat: the llama.cpp flags
    # accepted without effect, shared by the model commands)
    expected = ["llamapy.cli.common", "llamapy.cli.compat", "llamapy.cli.gcpause", "llamapy.cli.run"]
    assert out.stdout.strip() == str(expected)


def test_whole_parser_still_has_every_subcommand() -> None:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) == set(SUBCOMMANDS)
    assert set(next(a for a in build_parser("tokenize")._actions if a.dest == "command").choices) == {
        "tokenize"
    }


def test_fast_exit_keeps_all_output_and_status(smollm2_path) -> None:
    text = "Hello world " * 2000  # more ids than a pipe buffer holds
    args = ["-m", "llamapy", "tokenize", "-m", str(smollm2_path), "-p", text, "--ids"]
    fast, full = _py("", *args), _py("", *args, LLAMAPY_FULL_EXIT="1")
    assert fast.returncode == full.returncode == 0, fast.stderr + full.stderr
    assert (
        fast.stdout == full.stdout and fast.stdout.rstrip().endswith("]") and fast.stdout.count(",") >= 4000
    )
    bad = _py("", "-m", "llamapy", "tokenize", "-m", str(smollm2_path) + ".missing", "-p", "x")
    assert bad.returncode == 1 and bad.stderr.startswith("error: ")


def test_a_fast_exit_keeps_the_model_and_main_in_process_frees_it(smollm2_path, monkeypatch) -> None:
    """``keep_until_exit`` holds an object only when ``entry``'s immediate exit follows (freeing a model
    on the way out is moot there); ``main`` in a process that goes on (tests, callers) frees it."""
    import gc
    import weakref

    from llamapy import cli
    from llamapy.api import llama as api_llama

    made: list[weakref.ref] = []
    init = api_llama.Llama.__init__

    def tracked(self, *a, **k):  # type: ignore[no-untyped-def]
        init(self, *a, **k)
        made.append(weakref.ref(self))

    monkeypatch.setattr(api_llama.Llama, "__init__", tracked)
    assert cli._KEEP is None
    argv = ["run", "-m", str(smollm2_path), "-p", "Hi", "-n", "2", "-t", "1", "--temp", "0"]
    assert cli.main(argv) == 0
    gc.collect()
    assert len(made) == 1 and made[0]() is None  # freed
    monkeypatch.setattr(cli, "_KEEP", [])
    assert cli.main(argv) == 0
    gc.collect()
    assert len(made) == 2 and made[1]() is not None and cli._KEEP == [made[1]()]  # held for the exit
    out = _py("", "-m", "llamapy", *argv)  # and the command itself, ending that way
    assert out.returncode == 0 and out.stdout.strip(), out.stderr
