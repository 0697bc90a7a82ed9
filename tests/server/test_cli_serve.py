"""`llamapy serve` as a command: usage errors exit 2, a missing model is a one-line error and exit 1."""

from __future__ import annotations

import subprocess
import sys

from llamapy.cli import build_parser


def serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llamapy", "serve", *args], capture_output=True, text=True, timeout=60
    )


def test_flags_parse_like_llama_cpp(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# comment\nk1\n\nk2\n")
    args = build_parser().parse_args(
        [
            "serve",
            "-m",
            "x.gguf",
            "-np",
            "4",
            "-c",
            "2048",
            "--api-key",
            "k0",
            "--api-key-file",
            str(keys),
            "--cors-origin",
            "*",
            "--metrics",
            "--slots-verbose",
            "-t",
            "2",
            "--port",
            "0",
        ]
    )
    from llamapy.cli.serve import _api_keys

    assert (args.parallel, args.ctx_size, args.threads, args.port, args.metrics) == (4, 2048, 2, 0, True)
    assert _api_keys(args) == ["k0", "k1", "k2"] and args.cors_origin == ["*"]


def test_bad_flags_exit_2():
    for args in (["--port", "eighty"], ["-np", "0"], ["--bogus"]):
        r = serve(*args)
        assert r.returncode == 2 and "usage:" in r.stderr, (args, r.stderr)


def test_missing_model_is_one_line_error(tmp_path):
    r = serve("-m", str(tmp_path / "nope.gguf"), "--port", "0")
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0 and "nope.gguf" in r.stderr and r.stderr.startswith("error:")
