"""``llamapy chat`` on a pipe: one answer per input line, /clear, /exit, end of input."""

from __future__ import annotations

import io

from llamapy.cli import main
from llamapy.cli.chat import read_messages
from tests.cli.test_run import llamapy_cmd


def test_read_messages_lines_and_continuations():
    stream = io.StringIO("hello\nfirst line\\\nsecond line\n\n/exit\nlast without newline")
    assert list(read_messages(stream, interactive=False)) == [
        "hello",
        "first line\nsecond line",
        "",
        "/exit",
        "last without newline",
    ]
    assert list(read_messages(io.StringIO("dangling\\"), interactive=False)) == ["dangling"]


def test_chat_on_a_pipe_subprocess(smollm2_path):
    r = llamapy_cmd(
        "chat", "-m", str(smollm2_path), "-n", "6", "--temp", "0", "-c", "512",
        stdin="What is the capital of France?\n/exit\nnever read\n",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()  # an answer
    assert r.stdout.endswith("\n")
    assert "error" not in r.stderr.lower()


def test_chat_history_clear_and_system_prompt(smollm2_path, capfd, monkeypatch):
    from llamapy.api import Llama

    prompts = []
    real = Llama.apply_chat_template

    def spy(self, messages, *a, **kw):
        prompts.append([dict(m) for m in messages])
        return real(self, messages, *a, **kw)

    monkeypatch.setattr(Llama, "apply_chat_template", spy)
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\nAnd again\n/clear\nNew start\n"))
    rc = main(["chat", "-m", str(smollm2_path), "-n", "3", "--temp", "0", "-c", "512", "-sys", "Be brief."])
    out, err = capfd.readouterr()
    assert rc == 0, err
    assert len(out.splitlines()) >= 3 and out.endswith("\n")
    assert [[m["role"] for m in p] for p in prompts] == [
        ["system", "user"],
        ["system", "user", "assistant", "user"],  # history kept, with the first answer
        ["system", "user"],  # /clear forgot it
    ]
    assert prompts[1][2]["content"] and prompts[2][1]["content"] == "New start"
