"""llama.cpp's flags on llamapy's commands: the ones accepted without effect (``llamapy.cli.compat``), the
aliases and the ones that do something (escapes, ``-dev``, ``--display-prompt``, ``-p``/``-sysf``/``-st`` in
chat, the sampling defaults and HTTPS of serve), and llama-server's ``LLAMA_ARG_*`` variables
(``llamapy.cli.env``)."""

from __future__ import annotations

import argparse
import io

import pytest

from llamapy.cli import build_parser, main
from llamapy.cli.common import llama_kwargs
from llamapy.cli.env import SERVE_ENV, variables, with_env
from llamapy.cli.run import read_prompt
from tests.cli.test_run import llamapy_cmd, run_inprocess


def parse(*argv: str) -> argparse.Namespace:
    return build_parser(argv[0]).parse_args(list(argv))


def values(args: argparse.Namespace) -> dict:
    return {k: v for k, v in vars(args).items() if not isinstance(v, argparse.ArgumentParser)}


# a llama.cpp command line's flags that change nothing in llamapy's output
NO_EFFECT = [
    "-tb", "4", "-C", "ff", "--cpu-strict", "1", "--prio", "2", "--poll", "50", "--numa", "distribute",
    "-ot", "exps=CPU", "-cmoe", "-ncmoe", "2", "--no-op-offload", "-fit", "off", "--swa-full", "--check-tensors",
    "--log-disable", "--log-file", "x.log", "-lv", "3", "--no-perf", "--log-colors", "off",
]  # fmt: skip


def test_paired_flags_keep_their_defaults():
    """A flag pair on one destination (``--slots``/``--no-slots``...): argparse takes the default of the first
    one added, so an on-switch added first must say the default itself (the server lost /slots and its
    chat page by default)."""
    serve = parse("serve", "-m", "x.gguf")
    assert (serve.no_slots, serve.no_webui, serve.escape) == (False, False, True)
    off = parse("serve", "-m", "x.gguf", "--no-slots", "--no-webui")
    assert (off.no_slots, off.no_webui) == (True, True)
    run = parse("run", "-m", "x.gguf", "-p", "hi")
    assert (run.display_prompt, run.escape, run.context_shift, run.use_mmap) == (
        False, True, False, True,
    )  # fmt: skip


@pytest.mark.parametrize("command", ["run", "chat", "serve", "embed", "perplexity", "imatrix", "tokenize"])
def test_no_effect_flags_parse_and_set_nothing(command):
    need = ["-f", "text.txt"] if command == "perplexity" else []  # (its one required flag)
    base = parse(command, *need)
    args = parse(command, *need, *NO_EFFECT)
    assert values(args) == values(base)  # nothing on the namespace changed


@pytest.mark.parametrize("command", ["run", "chat"])
def test_completion_and_cli_flags(command):
    args = parse(command, "--temperature", "0.3", "-hft", "tok", "-kvo", "--no-context-shift", "--log-verbose",
                 "-mm", "proj.gguf", "--draft", "5", "-co", "on", "--simple-io", "-np", "4", "--no-warmup")  # fmt: skip
    assert (args.temp, args.hf_token, args.offload_kqv, args.context_shift) == (0.3, "tok", True, False)
    assert (args.verbose, args.mmproj, args.spec_n_max) == (True, "proj.gguf", 5)
    assert parse(command, "-nkvo").offload_kqv is False


def test_split_mode_warns_one_line_as_llamacpp(capsys):
    parse("run", "-sm", "row", "-ts", "3,1")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "split mode has no effect" in err[0] and "tensor split" in err[1]
    parse("serve", "-ngl", "99")
    assert "on the CPU" in capsys.readouterr().err
    parse("serve", "-ngl", "0", "-dev", "none")
    assert capsys.readouterr().err == ""


def test_device_none_keeps_every_layer_on_the_cpu():
    assert llama_kwargs(parse("run", "-ngl", "99", "-dev", "none"))["n_gpu_layers"] == 0
    kw = llama_kwargs(parse("run", "-ngl", "99", "-dev", "CUDA1"))
    assert (kw["n_gpu_layers"], kw["main_gpu"]) == (99, 1)
    assert llama_kwargs(parse("run", "-ngl", "99", "-mg", "2"))["main_gpu"] == 2


def test_flags_that_change_results_stay_errors():
    for flags in (["--control-vector", "cv.gguf"], ["-gan", "4"], ["-dev", "vulkan0"], ["-cnv"]):
        r = llamapy_cmd("run", "-p", "x", *flags)
        assert r.returncode == 2 and "error:" in r.stderr, flags


def test_run_processes_escapes_as_llamacpp(tmp_path):
    assert read_prompt(parse("run", "-p", r"a\nb\t\x41")) == "a\nb\tA"
    assert read_prompt(parse("run", "-p", r"a\nb", "--no-escape")) == r"a\nb"
    f = tmp_path / "p.txt"
    f.write_bytes(b"line\\none\n")  # -f: escapes too, and one final newline dropped (llama.cpp's read_file)
    assert read_prompt(parse("run", "-f", str(f))) == "line\none"


def test_run_display_prompt_and_escaped_stop(smollm2_path, capfd):
    common = ["-m", str(smollm2_path), "-n", "8", "--temp", "0", "-c", "256", "-no-cnv", "-ngl", "0"]
    rc, out, _ = run_inprocess(capfd, *common, "-p", r"1, 2, 3, 4, 5,", "-r", r"7", "--display-prompt")
    assert rc == 0 and out == "1, 2, 3, 4, 5, 6, "
    rc, out, _ = run_inprocess(capfd, *common, "-p", r"1,\n2,\n3,\n4,", "-r", r"\n6")
    assert rc == 0 and out == "\n5,"  # the escaped newline of -r stops it


def test_chat_prompt_file_system_file_and_single_turn(smollm2_path, tmp_path, capfd, monkeypatch):
    from llamapy.api import Llama

    prompts = []
    real = Llama.apply_chat_template

    def spy(self, messages, *a, **kw):
        prompts.append([dict(m) for m in messages])
        return real(self, messages, *a, **kw)

    monkeypatch.setattr(Llama, "apply_chat_template", spy)
    monkeypatch.setattr("sys.stdin", io.StringIO("never read\n"))
    sysf = tmp_path / "sys.txt"
    sysf.write_text("Be brief.\n", encoding="utf-8")
    rc = main(["chat", "-m", str(smollm2_path), "-n", "3", "--temp", "0", "-c", "512", "-sysf", str(sysf),
               "-p", r"Hi\nthere", "-st", "-cnv"])  # fmt: skip
    out, err = capfd.readouterr()
    assert rc == 0, err
    assert prompts == [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi\nthere"}]]
    assert out.endswith("\n") and len(out.strip().splitlines()) >= 1


def test_serve_sampling_defaults_from_llamacpp_flags():
    from llamapy.cli.serve import server_settings

    args = parse("serve", "-s", "7", "--temperature", "0.2", "--top-k", "5", "--presence-penalty", "0.5",
                 "--mirostat", "2", "--samplers", "top_k;temperature", "--no-webui", "--path", "/tmp")  # fmt: skip
    s = server_settings(args, "m.gguf", []).defaults.sampling
    assert (s.seed, s.temp, s.top_k, s.penalty_present, s.mirostat) == (7, 0.2, 5, 0.5, 2)
    assert args.webui_dir == "/tmp" and args.no_webui
    assert parse("serve", "--no-slots", "--slots").no_slots is False
    tls = parse("serve", "--ssl-key-file", "k.pem", "--ssl-cert-file", "c.pem")
    assert (tls.ssl_key_file, tls.ssl_cert_file) == ("k.pem", "c.pem")


def test_serve_https_needs_key_and_certificate(smollm2_path):
    r = llamapy_cmd("serve", "-m", str(smollm2_path), "--ssl-key-file", "k.pem", timeout=120)
    assert r.returncode == 1 and "--ssl-cert-file" in r.stderr


def test_llama_arg_environment_variables():
    env = {"LLAMA_ARG_MODEL": "m.gguf", "LLAMA_ARG_CTX_SIZE": "8192", "LLAMA_ARG_N_PARALLEL": "4",
           "LLAMA_ARG_PORT": "9000", "LLAMA_ARG_HOST": "0.0.0.0", "LLAMA_ARG_ENDPOINT_METRICS": "1",
           "LLAMA_ARG_ENDPOINT_SLOTS": "0", "LLAMA_ARG_N_GPU_LAYERS": "0", "LLAMA_API_KEY": "-secret"}  # fmt: skip
    args = parse(*with_env(["serve", "--port", "8081"], env))
    assert (args.model, args.ctx_size, args.parallel, args.host) == ("m.gguf", 8192, 4, "0.0.0.0")
    assert args.port == 8081  # the command line wins
    assert args.metrics and args.no_slots and args.api_key == ["-secret"]
    # run reads the variables of its own flags only (llama-cli's: no --port, no --api-key)
    run = with_env(["run", "-p", "x"], env)
    assert run[:3] == ["run", "--model=m.gguf", "--ctx-size=8192"] and run[-2:] == ["-p", "x"]
    assert not [a for a in run if a.startswith(("--port", "--host", "--api-key", "--metrics", "--no-slots"))]
    assert parse(*run).ctx_size == 8192
    assert with_env(["bench", "-p", "8"], env) == ["bench", "-p", "8"]  # llama-bench reads none
    assert with_env(["serve", "-c=512"], {"LLAMA_ARG_CTX_SIZE": "8192"}) == ["serve", "-c=512"]
    assert with_env(["serve"], {"LLAMA_ARG_EMBEDDINGS": "maybe"}) == ["serve"]  # neither on nor off


def test_run_reads_the_variables_of_its_flags(smollm2_path, capfd, monkeypatch):
    """As llama-cli: ``LLAMA_ARG_MODEL``, ``LLAMA_ARG_N_PREDICT``... stand for ``run``'s flags, the command line
    wins, and a server-only variable (``LLAMA_ARG_PORT``) is not read."""
    monkeypatch.setenv("LLAMA_ARG_MODEL", str(smollm2_path))
    monkeypatch.setenv("LLAMA_ARG_N_PREDICT", "3")
    monkeypatch.setenv("LLAMA_ARG_TEMPERATURE", "0")
    monkeypatch.setenv("LLAMA_ARG_PORT", "9000")
    rc, out, err = run_inprocess(capfd, "-p", "Hello", "-c", "256", "-no-cnv")
    assert rc == 0, err
    rc, out2, err = run_inprocess(
        capfd, "-m", str(smollm2_path), "-p", "Hello", "-n", "3", "--temp", "0", "-c", "256"
    )
    assert rc == 0, err
    assert out == out2 and out.strip()
    monkeypatch.setenv("LLAMA_ARG_CTX_SIZE", "nope")
    rc, out, err = run_inprocess(capfd, "-p", "Hello", "-c", "256")  # the command line's -c wins
    assert rc == 0, err
    assert out == out2
    assert set(variables("bench")) == set() and "LLAMA_ARG_PORT" not in variables("run")


def test_every_serve_variable_names_an_accepted_flag():
    opts = build_parser("serve")._subparsers._group_actions[0].choices["serve"]._option_string_actions
    for var, (names, value, neg) in SERVE_ENV.items():
        assert all(n in opts for n in names + ((neg,) if neg else ())), var
        assert all((opts[n].nargs != 0) == value for n in names), var


def test_serve_reasoning_flags_as_llama_server():
    from llamapy.cli.serve import server_settings

    def chat(*argv: str) -> tuple:
        d = server_settings(parse("serve", *argv), "m.gguf", []).defaults
        return d.reasoning, d.reasoning_format, d.chat_template_kwargs

    assert chat() == (True, "auto", {})
    assert chat("-rea", "on", "--reasoning-format", "none") == (True, "none", {"enable_thinking": True})
    kw = '{"enable_thinking": true, "x": [1]}'
    assert chat("--reasoning", "off", "--chat-template-kwargs", kw) == (
        False, "auto", {"enable_thinking": False, "x": [1]},
    )  # fmt: skip
    assert chat("--reasoning-budget", "0", "--reasoning-effort", "low") == (
        False, "auto", {"reasoning_effort": "low", "enable_thinking": False},
    )  # fmt: skip
    assert chat("--jinja", "--reasoning", "auto", "--reasoning-budget", "-1")[0] is True
    args = parse(*with_env(["serve"], {"LLAMA_ARG_REASONING": "off", "LLAMA_ARG_THINK": "deepseek"}))
    assert (args.reasoning, args.reasoning_format) == ("off", "deepseek")


@pytest.mark.parametrize(
    "argv",
    [
        ["--reasoning-budget", "512"],  # no thinking budget here: only -1 and 0
        ["--reasoning-format", "deepseek-legacy"],
        ["--reasoning", "maybe"],
        ["--chat-template-kwargs", "[1]"],
        ["--chat-template-kwargs", '{"messages": []}'],
        ["--no-jinja"],
    ],
)
def test_serve_reasoning_flags_refused(argv, capsys):
    with pytest.raises(SystemExit):
        parse("serve", *argv)
    assert argv[0] in capsys.readouterr().err


def test_serve_kv_cache_types(monkeypatch):
    import llamapy.server.backend as backend_mod
    from llamapy.cli.serve import backend_factory

    seen = {}
    monkeypatch.setattr(backend_mod, "ContextBackend", lambda path, **kw: seen.update(kw) or object())
    backend_factory(parse("serve", "-m", "m.gguf", "-ctk", "q8_0", "--cache-type-v", "q4_0"), "m.gguf")()
    assert (seen["type_k"], seen["type_v"]) == ("q8_0", "q4_0")
    backend_factory(parse("serve", "-m", "m.gguf"), "m.gguf")()
    assert (seen["type_k"], seen["type_v"]) == ("f16", "f16")
