"""The page's bundle is current and served: its recorded source hash matches webui/ (a stale bundle fails
here: rebuild with `cd webui && npm run build`), `/` serves it ahead of ollama's `GET /`, `HEAD /` stays
200, the page and its files need no API key while the API still does, and the CLI flags behave."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llamapy.server.app import ServerSettings, create_app
from llamapy.server.webui import BUNDLE_DIR, WebUIError, mount_webui
from tests.server.conftest import start_live, stop_live, wait_ready
from tests.server.fake_backend import FakeBackend

ROOT = Path(__file__).resolve().parents[2]
WEBUI = ROOT / "webui"
KEY = "k-webui"


def source_hash() -> str:
    """The hash webui/build.mjs records (same files, same order, same framing)."""
    files = ["build.mjs", "package.json", "package-lock.json"]
    files += [p.relative_to(WEBUI).as_posix() for p in (WEBUI / "src").rglob("*") if p.is_file()]
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(f.encode() + b"\0" + (WEBUI / f).read_bytes() + b"\0")
    return h.hexdigest()


def test_bundle_is_built_from_the_current_source():
    recorded = (BUNDLE_DIR / "SOURCE_HASH").read_text().strip()
    assert recorded == source_hash(), "the page's bundle is older than webui/: cd webui && npm run build"


def test_bundle_files_are_there_and_small():
    html = (BUNDLE_DIR / "index.html").read_text()
    refs = re.findall(r'(?:src|href|content|data-css)="webui/([^"]+)"', html)
    assert len(refs) == 4, refs  # app.js, app.css, katex.js, katex.css
    for r in refs:
        assert (BUNDLE_DIR / r).is_file(), r
    app_js = next(BUNDLE_DIR.glob("app-*.js"))
    assert app_js.stat().st_size < 300_000  # minified; KaTeX (lazy) is apart
    assert list((BUNDLE_DIR / "fonts").glob("*.woff2"))


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    settings = ServerSettings(model_path="/models/fake.gguf", api_keys=[KEY])
    backend = FakeBackend(n_ctx=256, n_seq_max=1, n_batch=64)
    srv, thread = start_live(settings, backend)
    mount_webui(srv.app)  # type: ignore[arg-type]
    wait_ready(srv.base_url)
    yield srv.base_url
    stop_live(srv, thread)


def test_root_serves_the_page_without_a_key(served):
    r = httpx.get(served + "/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "<title>llamapy</title>" in r.text
    csp = r.headers["content-security-policy"]
    assert "script-src 'self' 'sha256-" in csp and "connect-src 'self'" in csp
    assert httpx.head(served + "/").status_code == 200  # ollama clients probe HEAD /
    assert httpx.get(served + "/index.html").text == r.text
    for ref in re.findall(r'(?:src|href|data-css)="(webui/[^"]+)"', r.text):
        a = httpx.get(f"{served}/{ref}")
        assert a.status_code == 200 and len(a.content) > 1000, ref
        assert a.headers["cache-control"] == "public, max-age=31536000, immutable"  # content-hashed names
        if ref.endswith(".js"):
            assert a.headers["content-encoding"] == "gzip"
    assert httpx.get(served + "/webui/no-such-file.js").status_code == 404


def test_the_api_still_needs_the_key(served):
    assert httpx.get(served + "/v1/models").status_code == 401
    assert httpx.get(served + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert httpx.get(served + "/api/version").status_code == 401
    assert httpx.get(served + "/webui/../v1/models").status_code in (401, 404)


def test_without_the_page_root_is_ollamas():
    app = create_app(ServerSettings(model_path="/x.gguf"), lambda: FakeBackend())
    paths = [getattr(r, "path", None) for r in app.routes]
    assert "/webui" not in paths  # create_app alone serves no page (the CLI mounts it)
    mount_webui(app)
    assert [getattr(r, "path", None) for r in app.routes][:3] == ["/", "/index.html", "/webui"]


def test_webui_dir(tmp_path):
    (tmp_path / "index.html").write_text("<p>mine</p>")
    app = create_app(ServerSettings(model_path="/x.gguf"), lambda: FakeBackend())
    assert mount_webui(app, tmp_path) == tmp_path
    (tmp_path / "empty").mkdir()
    with pytest.raises(WebUIError, match="no index.html"):
        mount_webui(app, tmp_path / "empty")
    with pytest.raises(WebUIError, match="not a folder"):
        mount_webui(app, tmp_path / "missing")


def test_cli_webui_dir_without_index_is_an_error(tmp_path, smollm2_path, capsys, monkeypatch):
    import uvicorn

    from llamapy.cli import main

    monkeypatch.setattr(uvicorn.Server, "run", lambda self: pytest.fail("served without a page"))
    rc = main(["serve", "-m", str(smollm2_path), "--port", "0", "--webui-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 1 and err.strip().splitlines()[-1].startswith("error:") and "no index.html" in err, err


def test_every_bundle_file_is_package_data():
    """`pip install` ships what pyproject's package-data globs name: every file of the bundle."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    base = ROOT / "llamapy" / "server"
    shipped = {p for g in globs["llamapy.server"] for p in base.glob(g) if p.is_file()}
    assert {p for p in BUNDLE_DIR.rglob("*") if p.is_file()} <= shipped


def test_settings_placeholders_read_props_names():
    """The settings dialog's placeholders read /props' default_generation_settings.params by
    llama-server's names (temperature, repeat_penalty...): an old name leaves the placeholder empty."""
    from llamapy.server.engine import GenParams
    from llamapy.server.inputs import settings_dict

    source = (WEBUI / "src" / "settings.jsx").read_text()
    keys = re.findall(r'^\s*\["\w+", "[^"]+", "[^"]*", "(\w+)"\],', source, re.M)
    assert len(keys) >= 9
    assert set(keys) <= set(settings_dict(GenParams(), full=False))
