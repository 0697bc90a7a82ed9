"""llama.cpp's context-extension flags (``--rope-scaling``, ``--rope-scale``, ``--rope-freq-base``,
``--rope-freq-scale``, ``--yarn-*``) and ``--override-kv`` on ``run``, ``chat``, ``embed``, ``perplexity`` and
``serve`` (with llama-server's ``LLAMA_ARG_ROPE_*`` / ``LLAMA_ARG_YARN_*`` variables): what they pass on,
the greedy text against the API's and llama.cpp's, and bad values as ``error: ...`` with exit status 1."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from llamapy import Llama
from llamapy.cli import build_parser, main
from llamapy.cli.common import kv_overrides_arg, llama_kwargs, rope_kwargs
from llamapy.cli.env import with_env
from tests.cli.test_run import run_inprocess
from tests.test_api_rope import LLAMACPP_PLAIN, LLAMACPP_YARN, PROMPT

YARN = ["--rope-scaling", "yarn", "--rope-scale", "4", "--yarn-orig-ctx", "32"]


def parse(*argv: str) -> argparse.Namespace:
    return build_parser(argv[0]).parse_args(list(argv))


@pytest.mark.parametrize("command", ["run", "chat", "embed", "serve"])
def test_flags_become_context_params(command):
    args = parse(command, *YARN, "--rope-freq-base", "1e6", "--yarn-ext-factor", "0.5", "--yarn-attn-factor", "1",
                 "--yarn-beta-fast", "16", "--yarn-beta-slow", "2", "--override-kv", "a.b=int:1,c=str:x",
                 "--override-kv", "d=bool:false")  # fmt: skip
    assert rope_kwargs(args) == dict(
        rope_scaling_type="yarn", rope_freq_scale=0.25, rope_freq_base=1e6, yarn_orig_ctx=32,
        yarn_ext_factor=0.5, yarn_attn_factor=1.0, yarn_beta_fast=16.0, yarn_beta_slow=2.0,
    )  # fmt: skip
    assert [str(o) for o in kv_overrides_arg(args)] == ["a.b=int:1", "c=str:x", "d=bool:false"]
    if command != "serve":
        kw = llama_kwargs(args)
        assert kw["rope_freq_scale"] == 0.25 and kw["yarn_orig_ctx"] == 32 and len(kw["kv_overrides"]) == 3
    assert rope_kwargs(parse(command)) == {} and kv_overrides_arg(parse(command)) == []
    assert "kv_overrides" not in (llama_kwargs(parse(command)) if command != "serve" else {})


def test_override_kv_is_comma_separated_and_repeatable():
    args = parse("run", "--override-kv", 'a.b=int:1,"c=str:x,y"', "--override-kv", "d=bool:false")
    assert [str(o) for o in kv_overrides_arg(args)] == ["a.b=int:1", "c=str:x,y", "d=bool:false"]
    assert [str(o) for o in llama_kwargs(args)["kv_overrides"]] == ["a.b=int:1", "c=str:x,y", "d=bool:false"]


def test_rope_scale_and_rope_freq_scale_the_later_wins():
    def scale(*flags: str) -> float:
        return rope_kwargs(parse("run", *flags))["rope_freq_scale"]

    assert scale("--rope-scale", "4", "--rope-freq-scale", "0.5") == 0.5
    assert scale("--rope-freq-scale", "0.5", "--rope-scale", "4") == 0.25


def test_perplexity_flags(smollm2_path, tmp_path, capfd):
    """perplexity passes the flags to its context and --override-kv to its loader: the base given either
    way scores the same, and differently from the model's own."""
    text = tmp_path / "t.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 8)

    def ppl(*flags: str) -> str:
        rc = main(
            ["perplexity", "-m", str(smollm2_path), "-f", str(text), "-c", "32", "--chunks", "1", *flags]
        )
        out, err = capfd.readouterr()
        assert rc == 0, err
        return next(line for line in out.splitlines() if line.startswith("Final estimate"))

    by_flag = ppl("--rope-freq-base", "1000")
    assert by_flag == ppl("--override-kv", "llama.rope.freq_base=float:1000")
    assert by_flag != ppl()


def test_run_greedy_equals_the_api_and_llama_cpp(smollm2_path, capfd):
    common = ["-m", str(smollm2_path), "-p", PROMPT, "-n", "16", "--temp", "0", "-c", "256", "--ignore-eos"]
    rc, out, err = run_inprocess(capfd, *common, *YARN)
    assert rc == 0, err
    llm = Llama(str(smollm2_path), n_ctx=256, verbose=False, rope_scaling_type="yarn", rope_freq_scale=0.25,
                yarn_orig_ctx=32)  # fmt: skip
    api = llm.create_completion(PROMPT, max_tokens=16, temperature=0.0)["choices"][0]["text"]
    assert out == api == LLAMACPP_YARN
    rc, plain, err = run_inprocess(capfd, *common)
    assert rc == 0 and plain == LLAMACPP_PLAIN != out
    # the same scaling as metadata overrides: the same text
    kv = "llama.rope.scaling.type=str:yarn,llama.rope.scaling.factor=float:4,llama.context_length=int:32"
    rc, out2, err = run_inprocess(capfd, *common, "--override-kv", kv)
    assert rc == 0 and out2 == out, err


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--rope-scaling", "ntk"], "--rope-scaling 'ntk'"),
        (["--rope-scale", "abc"], "--rope-scale 'abc': not a number"),
        (["--rope-scale", "-2"], "--rope-scale '-2'"),
        (["--rope-scale", "0"], "--rope-scale '0'"),
        (["--rope-freq-scale", "-0.5"], "--rope-freq-scale '-0.5'"),
        (["--rope-freq-base", "nan"], "--rope-freq-base 'nan'"),
        (["--rope-freq-base=-1e4"], "--rope-freq-base '-1e4'"),
        (["--yarn-orig-ctx", "1.5"], "--yarn-orig-ctx '1.5': not an integer"),
        (["--yarn-orig-ctx", "-32"], "--yarn-orig-ctx '-32'"),
        (["--yarn-beta-fast", "fast"], "--yarn-beta-fast 'fast'"),
        (["--override-kv", "a.b=int:x"], "--override-kv: KV override 'a.b=int:x'"),
        (["--override-kv", "a.b"], "--override-kv: malformed KV override 'a.b'"),
        (["--override-kv", "a=double:1"], "--override-kv: malformed KV override"),
    ],
)
@pytest.mark.parametrize("command", ["run", "perplexity"])
def test_bad_values_are_one_line_errors(command, flags, named, tmp_path, capfd):
    """Checked before the model is looked at (the file does not exist): ``error: ...``, exit status 1."""
    need = ["-f", str(tmp_path / "t.txt")] if command == "perplexity" else ["-p", "x"]
    rc = main([command, "-m", str(tmp_path / "missing.gguf"), *need, *flags])
    out, err = capfd.readouterr()
    assert rc == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], err


def test_override_of_the_wrong_type_is_one_line_error(smollm2_path, capfd):
    rc = main(
        ["run", "-m", str(smollm2_path), "-p", "x", "-n", "1", "--override-kv", "llama.rope.freq_base=int:5"]
    )
    _, err = capfd.readouterr()
    assert rc == 1 and err.startswith("error: ") and "'llama.rope.freq_base' is a float, not int" in err


def test_serve_env_vars_and_flags():
    env = {"LLAMA_ARG_ROPE_SCALING_TYPE": "yarn", "LLAMA_ARG_ROPE_SCALE": "4", "LLAMA_ARG_YARN_ORIG_CTX": "32",
           "LLAMA_ARG_ROPE_FREQ_BASE": "5e5", "LLAMA_ARG_YARN_EXT_FACTOR": "0.5", "LLAMA_ARG_YARN_ATTN_FACTOR": "0.9",
           "LLAMA_ARG_YARN_BETA_SLOW": "2", "LLAMA_ARG_YARN_BETA_FAST": "16"}  # fmt: skip
    args = parse(*with_env(["serve", "-m", "x.gguf"], env))
    assert rope_kwargs(args) == dict(
        rope_scaling_type="yarn", rope_freq_scale=0.25, rope_freq_base=5e5, yarn_orig_ctx=32,
        yarn_ext_factor=0.5, yarn_attn_factor=0.9, yarn_beta_fast=16.0, yarn_beta_slow=2.0,
    )  # fmt: skip
    # a flag on the command line wins over its variable (and --rope-freq-scale over LLAMA_ARG_ROPE_SCALE)
    args = parse(*with_env(["serve", "--rope-scaling", "linear", "--rope-freq-scale", "0.5"], env))
    kw = rope_kwargs(args)
    assert (kw["rope_scaling_type"], kw["rope_freq_scale"]) == ("linear", 0.5)
    assert rope_kwargs(parse(*with_env(["serve"], {"LLAMA_ARG_ROPE_FREQ_SCALE": "0.125"}))) == {
        "rope_freq_scale": 0.125
    }


def test_serve_context_gets_the_flags(smollm2_path):
    from llamapy.cli.serve import backend_factory

    args = parse(
        "serve", "-m", str(smollm2_path), "-c", "256", *YARN, "--override-kv", "general.name=str:renamed"
    )
    backend = backend_factory(args, str(smollm2_path))()
    hp = backend.ctx.impl.hp
    got = (hp.rope_scaling_type, hp.rope_freq_scale, hp.n_ctx_orig_yarn, hp.yarn_ext_factor)
    assert got == ("yarn", 0.25, 32, 1.0)
    assert backend.model.metadata["general.name"] == "renamed"
    assert backend.model.hparams.rope_freq_scale == 1.0


def test_serve_bad_value_is_a_startup_error(smollm2_path):
    r = subprocess.run(
        [sys.executable, "-m", "llamapy", "serve", "-m", str(smollm2_path), "--port", "0", "--rope-scaling", "ntk"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 1 and r.stderr.startswith("error: ") and "--rope-scaling 'ntk'" in r.stderr, (
        r.stderr
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags",
    [
        YARN,
        ["--rope-scale", "4"],  # no --rope-scaling: linear (the file names no type)
        ["--override-kv", "llama.context_length=int:32", "--rope-scaling", "yarn", "--rope-scale", "4"],
        ["--rope-freq-base", "20000"],
    ],
    ids=["yarn", "linear", "override-kv", "freq-base"],
)
def test_llama_cpp_prints_the_same_text(smollm2_path, capfd, flags):
    """llama.cpp's llama-completion with the same flags (where it is built: benchmarks/build_llamacpp.sh)."""
    from benchmarks.harness import llamacpp_tool

    exe = llamacpp_tool("llama-completion") or llamacpp_tool("llama-completion", "avx2")
    if exe is None:
        pytest.skip("llama.cpp's llama-completion is not built (benchmarks/build_llamacpp.sh)")
    common = ["-p", PROMPT, "-n", "16", "--temp", "0", "-c", "256", "--ignore-eos", "-t", "1"]
    r = subprocess.run(
        [str(exe), "-m", str(smollm2_path), *common, "-no-cnv", "--no-display-prompt", "--no-warmup", *flags],
        capture_output=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr.decode(errors="replace")[-2000:]
    ref = r.stdout.decode(errors="replace").rstrip("\n")  # (llama-completion ends with a blank line)
    rc, out, err = run_inprocess(capfd, "-m", str(smollm2_path), *common, *flags)
    assert rc == 0, err
    assert out.rstrip("\n") == ref
