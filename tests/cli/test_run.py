"""``llamapy run``: as a subprocess (usage errors, a missing model, the greedy text), and in-process
for llama.cpp's reference prompts and seeded sampling."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from llamapy import Llama
from llamapy.cli import main
from llamapy.cli.run import repack_pays
from tests.test_api import assert_greedy_like_reference
from tests.util import ROOT, shared_path

N_PREDICT = 16


def llamapy_cmd(*args: str, stdin: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "llamapy", *args],
        input=stdin,
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=env,
        cwd=ROOT,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--bogus-flag"],
        ["run", "-p", "x", "--temp", "warm"],
        ["run", "-p", "x", "-c", "-5"],
        ["run", "-p", "x", "--mirostat", "3"],
        ["run", "-p", "x", "-ctk", "q9_9"],
        ["run", "-p", "x", "-f", "file.txt"],
        ["chat", "--top-k"],
    ],
)
def test_bad_flags_are_usage_errors(args):
    r = llamapy_cmd(*args)
    assert r.returncode == 2, r.stderr
    assert "usage: llamapy" in r.stderr and "error:" in r.stderr
    assert r.stdout == ""


def test_missing_model_file_is_one_line_error(tmp_path):
    r = llamapy_cmd("run", "-m", str(tmp_path / "missing.gguf"), "-p", "hi")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "missing.gguf" in lines[0]
    assert r.stdout == ""


def test_not_a_gguf_file_is_one_line_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    r = llamapy_cmd("run", "-m", str(bad), "-p", "hi")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")


def test_bad_prefetch_setting_is_one_line_error(smollm2_path, monkeypatch):
    monkeypatch.setenv("LLAMAPY_X8_PREFETCH", "2k")
    r = llamapy_cmd("run", "-m", str(smollm2_path), "-p", "hi", "-n", "2")
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: LLAMAPY_X8_PREFETCH='2k'"), r.stderr
    assert r.stdout == ""


def test_run_subprocess_streams_only_generated_text(smollm2_path):
    r = llamapy_cmd(
        "run", "-m", str(smollm2_path), "-p", "The capital of France is", "-n", "4", "--temp", "0"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(" Paris")  # only the generated text, not the prompt
    assert "The capital" not in r.stdout
    assert "generated 4 tokens" in r.stderr  # timings on stderr


def run_inprocess(capfd, *args: str) -> tuple[int, str, str]:
    rc = main(["run", *args])
    out, err = capfd.readouterr()
    return rc, out, err


@pytest.mark.parametrize(
    ("model", "ref_dir"), [("smollm2_path", "smollm2-135m-q4_1"), ("gemma3_path", "gemma3-270m-q4_k_m")]
)
def test_run_greedy_reference_prompts(model, ref_dir, request, capfd):
    """``run --temp 0`` prints llama.cpp's greedy text (first 16 tokens) for the reference prompts."""
    path = request.getfixturevalue(model)
    z = np.load(shared_path("reference", ref_dir, "logits.npz"))
    prompts = json.loads(shared_path("reference", "prompts.json").read_text())
    llm = Llama(
        str(path), n_ctx=256, verbose=False
    )  # for the near-tie check (see assert_greedy_like_reference)
    for i, prompt in enumerate(prompts):
        rc, out, err = run_inprocess(capfd, "-m", str(path), "-p", prompt, "-n", str(N_PREDICT), "--temp", "0", "-c", "256")  # fmt: skip
        assert rc == 0, err
        ref = z[f"p{i}_greedy"][:N_PREDICT].tolist()
        ids = z[f"p{i}_ids"].tolist()
        llm.ctx.repack = repack_pays(len(ids), N_PREDICT)  # the near ties of the kernels the run used
        assert_greedy_like_reference(llm, ids, ref, out)


def test_run_same_seed_same_text(smollm2_path, capfd, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Once upon a time", encoding="utf-8")
    common = ["-m", str(smollm2_path), "-f", str(prompt), "-n", "6", "--temp", "1.5", "-c", "256"]
    texts = [run_inprocess(capfd, *common, "--seed", str(s))[1] for s in (42, 42, 7)]
    assert texts[0] == texts[1] and texts[0]
    assert texts[2] != texts[0]  # another seed, other draws


def test_run_stop_string_and_context_full(smollm2_path, capfd):
    rc, out, _ = run_inprocess(capfd, "-m", str(smollm2_path), "-p", "1, 2, 3, 4, 5,", "-n", "8", "--temp", "0",
                               "-r", "7", "-c", "256")  # fmt: skip
    assert rc == 0 and out == " 6, "  # generation stops before the stop text
    rc = main(["run", "-m", str(smollm2_path), "-p", "1, 2, 3, " * 90, "-n", "4", "-c", "256"])
    err = capfd.readouterr().err
    assert rc == 1 and "error: " in err and "context" in err


def test_run_with_json_schema_and_grammar_flags(smollm2_path, tmp_path):
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    r = llamapy_cmd("run", "-m", str(smollm2_path), "-p", "Answer in JSON:", "-n", "20", "--temp", "0",
                    "-j", json.dumps(schema))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) in ({"ok": True}, {"ok": False})
    gf = tmp_path / "yn.gbnf"
    gf.write_text('root ::= ("yes" | "no") "!"')
    r = llamapy_cmd(
        "run", "-m", str(smollm2_path), "-p", "Is water wet?", "--grammar-file", str(gf), "--temp", "0"
    )
    assert r.returncode == 0 and r.stdout in ("yes!", "no!"), r.stderr


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--grammar", "root ::= undefined_rule"], "undefined_rule"),
        (["-j", "{not json"], "JSON"),
        (["--grammar-file", "/no/such/file.gbnf"], "file.gbnf"),
    ],
)
def test_bad_grammar_flags_are_one_line_errors(smollm2_path, flags, fragment):
    r = llamapy_cmd("run", "-m", str(smollm2_path), "-p", "x", *flags)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines()[-1].startswith("error: ") and fragment in r.stderr


def test_repack_flags_and_when_a_run_repacks():
    """``--repack`` / ``--no-repack`` (``-nr``, llama.cpp's); unset, ``run`` repacks only when its prompt and
    ``-n`` add up to ``REPACK_MIN_TOKENS`` (or ``-n -1``)."""
    from llamapy.cli import build_parser
    from llamapy.cli.common import REPACK_MIN_TOKENS, llama_kwargs

    p = build_parser()
    for flags, want in (([], None), (["--repack"], True), (["--no-repack"], False), (["-nr"], False)):
        a = p.parse_args(["run", "-p", "x", *flags])
        assert a.repack is want
        assert llama_kwargs(a)["repack"] is (want is not False)
    assert repack_pays(1, -1) and not repack_pays(1, 16)
    assert repack_pays(REPACK_MIN_TOKENS - 16, 16) and not repack_pays(REPACK_MIN_TOKENS - 17, 16)


def test_short_run_reads_the_file_rows_long_prompt_repacks(smollm2_path, capfd, monkeypatch):
    import llamapy.cli.common as common

    loaded = []
    real = common.load_llama
    monkeypatch.setattr(common, "load_llama", lambda args: loaded.append(real(args)) or loaded[-1])
    cases = [("Hello", [], False), ("Hello", ["--repack"], True), ("1, 2, 3, " * 20, [], True),
             ("1, 2, 3, " * 20, ["-nr"], False)]  # fmt: skip
    for prompt, flags, want in cases:
        rc, out, err = run_inprocess(
            capfd, "-m", str(smollm2_path), "-p", prompt, "-n", "2", "-c", "256", *flags
        )
        assert rc == 0, err
        assert loaded[-1].ctx.repack is want
