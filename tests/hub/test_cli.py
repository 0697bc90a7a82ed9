"""The Hub on the command line: ``-hf`` on run (a subprocess against the fake Hub), ``pull user/repo``,
``list``/``show``/``rm``, and the ``error: ...`` answers (unknown repo or quant, offline and not cached)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llamapy.cli import main


def llamapy(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llamapy", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=os.environ,
    )


def test_run_hf_subprocess(hf_env, fake_hub):
    p = llamapy("run", "-hf", "test/chat-GGUF:Q4_K_M", "-p", "hi", "-n", "2", "--temp", "0")
    assert p.returncode == 0, p.stderr
    assert "loaded chat-Q4_K_M.gguf" in p.stderr
    assert "[" not in p.stderr.replace("[Retry", "")  # stderr is a pipe: no progress bar
    assert fake_hub.gets("chat-Q4_K_M.gguf") == [None]
    fake_hub.log.clear()
    q = llamapy("run", "-hf", "test/chat-GGUF:Q4_K_M", "-p", "hi", "-n", "2", "--temp", "0", "--offline")
    assert q.returncode == 0, q.stderr
    assert q.stdout == p.stdout and fake_hub.log == []  # the cache, not one request


def test_cli_errors(hf_env, fake_hub, capsys):
    assert main(["run", "-hf", "test/tiny-GGUF:Q2_K", "-p", "hi", "-n", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: no GGUF file matching the quant 'Q2_K' in test/tiny-GGUF")
    assert "tiny-Q4_K_M.gguf" in err
    assert main(["run", "-hf", "test/nope", "-p", "hi"]) == 1
    assert f"error: repository test/nope not found on {fake_hub.url}" in capsys.readouterr().err
    assert main(["run", "-hf", "test/tiny-GGUF", "--offline", "-p", "hi"]) == 1
    assert "not in the cache" in capsys.readouterr().err
    assert main(["run", "-hf", "nope", "-p", "hi"]) == 1
    assert "expected user/repo[:quant]" in capsys.readouterr().err
    assert main(["run", "-hff", "x.gguf", "-p", "hi"]) == 1
    assert "-hff FILE needs -hf" in capsys.readouterr().err


def test_pull_list_show_rm(hf_env, fake_hub, capsys):
    assert main(["pull", "test/vision-GGUF"]) == 0
    out = capsys.readouterr().out.split()
    assert out[0].endswith("vision-Q8_0.gguf") and out[1].endswith("mmproj-vision-F16.gguf")
    assert main(["pull", "test/split-GGUF:q4_k_m", "-q"]) == 0
    assert main(["pull", "test/tiny-GGUF:F16", "-q"]) == 0
    assert main(["pull", "test/tiny-GGUF", "-q"]) == 0
    capsys.readouterr()

    assert main(["list", "--json"]) == 0
    listed = {m["name"]: m for m in json.loads(capsys.readouterr().out)}
    assert set(listed) >= {"test/vision-GGUF:Q8_0", "test/split-GGUF:Q4_K_M", "test/tiny-GGUF:F16",
                           "test/tiny-GGUF:Q4_K_M"}  # fmt: skip
    split = listed["test/split-GGUF:Q4_K_M"]
    assert len(split["parts"]) == len(fake_hub.repos["test/split-GGUF"])
    assert split["size"] == sum(len(f.data) for f in fake_hub.repos["test/split-GGUF"].values())
    assert split["architecture"] == "llama" and listed["test/vision-GGUF:Q8_0"]["mmproj"]
    assert main(["list"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["NAME", "QUANT", "SIZE", "ARCH", "WHERE"]
    assert any(ln.startswith("test/tiny-GGUF:F16 ") and " llama " in ln for ln in table)

    assert main(["show", "test/split-GGUF", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["architecture"] == "llama" and info["splits"] == len(fake_hub.repos["test/split-GGUF"])
    assert info["context_length"] == 256 and info["parameters"] > 0
    assert info["metadata"]["llama.block_count"] == 3
    assert main(["show", "test/tiny-GGUF"]) == 0  # no quant: Q4_K_M first, as -hf
    text = capsys.readouterr().out
    assert "tiny-Q4_K_M.gguf" in text and "architecture    llama" in text and "context length  256" in text
    assert main(["show", listed["test/tiny-GGUF:F16"]["path"]]) == 0  # a plain path works
    capsys.readouterr()
    assert main(["show", "test/tiny-GGUF:Q2_K"]) == 1
    assert "error: test/tiny-GGUF:Q2_K is not in the store" in capsys.readouterr().err

    assert main(["rm", "test/tiny-GGUF:F16"]) == 0
    assert "deleted test/tiny-GGUF:F16" in capsys.readouterr().out
    assert not Path(listed["test/tiny-GGUF:F16"]["path"]).exists()
    assert main(["list", "--json"]) == 0
    names = {m["name"] for m in json.loads(capsys.readouterr().out)}
    assert "test/tiny-GGUF:F16" not in names and "test/tiny-GGUF:Q4_K_M" in names
    assert main(["rm", "test/split-GGUF"]) == 0
    assert not (hf_env / "models--test--split-GGUF").exists()  # the last model of a repo: its folder goes
    assert main(["rm", "test/split-GGUF"]) == 1
    assert "not in the store" in capsys.readouterr().err
    f = Path(listed["test/vision-GGUF:Q8_0"]["path"])
    assert main(["rm", str(f)]) == 1 and f.exists()  # a plain file is never deleted


def test_list_empty_store(hf_env, capsys):
    assert main(["list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


@pytest.mark.parametrize("command", ["run", "chat", "serve"])
def test_hf_mmproj_turns_images_on(hf_env, command):
    from llamapy.cli import build_parser
    from llamapy.cli.common import resolve_model_args

    args = build_parser(command).parse_args([command, "-hf", "test/vision-GGUF"])
    path = resolve_model_args(args)
    assert path.name == "vision-Q8_0.gguf" and args.mmproj.endswith("mmproj-vision-F16.gguf")
    args = build_parser(command).parse_args([command, "-hf", "test/vision-GGUF", "--no-mmproj"])
    assert resolve_model_args(args).name == "vision-Q8_0.gguf" and args.mmproj is None
    args = build_parser(command).parse_args([command, "-hf", "test/vision-GGUF", "--mmproj", "/x/own.gguf"])
    resolve_model_args(args)
    assert args.mmproj == "/x/own.gguf"  # an explicit --mmproj wins


def test_m_takes_a_ref_in_tokenize(hf_env, capsys):
    assert main(["tokenize", "-m", "test/chat-GGUF:Q4_K_M", "-p", "hi", "--ids"]) == 0
    assert capsys.readouterr().out.strip().startswith("[")


def test_gguf_info_takes_a_ref(hf_env, capsys):
    assert main(["gguf", "info", "test/tiny-GGUF:Q8_0", "--no-tensors"]) == 0
    out = capsys.readouterr().out
    assert "tiny-Q8_0.gguf" in out and "architecture: llama" in out


def test_hf_on_tokenize_and_bench(hf_env, capsys):
    assert main(["tokenize", "-hf", "test/chat-GGUF", "-p", "hi", "--ids"]) == 0
    assert capsys.readouterr().out.strip().startswith("[")
    assert main(["bench", "-hf", "test/tiny-GGUF:Q8_0", "-p", "4", "-n", "2", "-r", "1", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["model_type"].startswith("llama")
    assert main(["tokenize", "-p", "hi"]) == 1
    assert "error: give a model with -m FILE or -hf USER/REPO[:QUANT]" in capsys.readouterr().err


def test_known_model_offline_and_in_the_store(smollm2_path, tmp_path, capsys):
    """The README's first command from a warm cache with the network off (--offline, HF_HUB_OFFLINE=1, an
    unreachable HF_ENDPOINT); the known model in list and show."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_CACHE=str(tmp_path))
    p = subprocess.run(
        [sys.executable, "-m", "llamapy", "run", "--offline", "-p", "Hello", "-n", "2", "--temp", "0"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "loaded SmolLM2-135M-Instruct.Q4_1.gguf" in p.stderr and p.stdout
    assert main(["list", "--json"]) == 0
    known = [m for m in json.loads(capsys.readouterr().out) if m["name"] == "smollm2-135m-instruct"]
    assert known and known[0]["source"] == "pypi" and known[0]["quant"] == "Q4_1"
    assert main(["show", "smollm2", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["architecture"] == "llama" and info["context_length"] == 8192
    assert info["quantization"] == "Q4_1" and "im_start" in info["chat_template"]
    assert info["parameter_size"] == "135M" and info["metadata"]["tokenizer.ggml.tokens"].endswith("items]")


def test_progress_bar_on_a_terminal_only(hf_env, fake_hub):
    """huggingface_hub's bar (size, rate) on stderr when it is a terminal; quiet on a pipe."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a new pty is 0 columns wide
    try:
        p = subprocess.run(
            [sys.executable, "-m", "llamapy", "pull", "test/tiny-GGUF:F16"],
            stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, timeout=300, env=os.environ,
        )  # fmt: skip
        os.close(slave)
        slave = -1
        chunks = []
        while True:
            try:
                b = os.read(master, 65536)
            except OSError:
                break
            if not b:
                break
            chunks.append(b)
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)
    err = b"".join(chunks).decode(errors="replace")
    assert p.returncode == 0, err
    assert "tiny-F16.gguf" in err and "100%" in err and "B/s" in err
    q = llamapy("pull", "test/tiny-GGUF:Q8_0")
    assert q.returncode == 0 and "%" not in q.stderr  # a pipe: one plain line per file, no bar
    assert q.stderr.strip() == "llamapy: downloading tiny-Q8_0.gguf from test/tiny-GGUF"


def test_show_bad_input(tmp_path, capsys):
    trunc = tmp_path / "trunc.gguf"
    trunc.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x01" * 20)
    for arg, msg in [
        (str(tmp_path / "nope.gguf"), "nope.gguf: not found"),
        (str(tmp_path), "a directory"),
        (str(trunc), "trunc.gguf"),
    ]:
        assert main(["show", arg]) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: ") and msg in err and "Traceback" not in err
