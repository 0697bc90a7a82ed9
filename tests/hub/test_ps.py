"""``llamapy ps`` against a running server over a real socket (the app over the fake backend), and its
error when no server answers."""

from __future__ import annotations

import json
import socket

import pytest

from llamapy.cli import main
from llamapy.server.app import ServerSettings
from tests.server.conftest import start_live, stop_live, wait_ready
from tests.server.fake_backend import FakeBackend


@pytest.fixture(scope="module")
def server():
    srv, thread = start_live(ServerSettings(model_path="/models/fake-Q4_K_M.gguf"), FakeBackend(n_ctx=512))
    wait_ready(srv.base_url)
    yield srv
    stop_live(srv, thread)


def test_ps_lists_the_loaded_model(server, capsys):
    assert main(["ps", "--url", server.base_url, "--json"]) == 0
    models = json.loads(capsys.readouterr().out)
    assert len(models) == 1 and models[0]["name"] and models[0]["context_length"] > 0
    assert main(["ps", "--url", server.base_url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "SIZE", "CONTEXT", "QUANT", "UNTIL"]
    assert lines[1].startswith(models[0]["name"])


def test_ps_without_a_server(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    assert main(["ps", "--url", f"http://127.0.0.1:{port}"]) == 1
    assert f"error: no server at http://127.0.0.1:{port}" in capsys.readouterr().err
