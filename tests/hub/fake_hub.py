"""A local fake of the few Hugging Face Hub endpoints ``huggingface_hub`` uses to list and download files,
over real HTTP on 127.0.0.1:

- ``GET /api/models/{user}/{repo}/tree/{rev}``: the file list (404 ``RepoNotFound`` for an unknown repo);
- ``HEAD``/``GET /{user}/{repo}/resolve/{rev}/{path}``: ``ETag`` (the sha256, as for LFS files),
  ``X-Repo-Commit``, ``Content-Length``, ``Accept-Ranges``; ``Range: bytes=N-`` answers 206.

A file can be served ``cut`` (the first GET without a Range sends half its body, then drops the
connection) or ``corrupt`` (other bytes of the same size than its etag says).
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class FakeFile:
    data: bytes
    cut: bool = False  # the first full GET stops half-way
    corrupt: bool = False  # the served bytes are not the ones the etag names

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def served(self) -> bytes:
        if not self.corrupt:
            return self.data
        return bytes(b ^ 0xFF for b in self.data[:64]) + self.data[64:]


@dataclass
class FakeHub:
    repos: dict[str, dict[str, FakeFile]] = field(default_factory=dict)
    log: list[tuple[str, str, str | None]] = field(default_factory=list)  # (method, path, Range)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def gets(self, filename: str) -> list[str | None]:
        """The Range header of each GET of ``filename`` (None: a full GET)."""
        return [r for m, p, r in self.log if m == "GET" and p.endswith("/" + filename)]

    def start(self) -> FakeHub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: object) -> None:
                pass

            def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _error(self, status: int, code: str, msg: str) -> None:
                body = json.dumps({"error": msg}).encode()
                self._send(status, body, {"X-Error-Code": code, "X-Error-Message": msg,
                                          "Content-Type": "application/json"})  # fmt: skip

            def do_HEAD(self) -> None:
                self.do_GET()

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                hub.log.append((self.command, path, self.headers.get("Range")))
                m = re.match(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)$", path)
                if m:
                    files = hub.repos.get(m.group(1))
                    if files is None:
                        return self._error(404, "RepoNotFound", "Repository not found")
                    tree = [
                        {"type": "file", "path": p, "size": len(f.data), "oid": f.sha256[:40],
                         "lfs": {"oid": f.sha256, "size": len(f.data), "pointerSize": 134}}
                        for p, f in sorted(files.items())
                    ]  # fmt: skip
                    return self._send(200, json.dumps(tree).encode(), {"Content-Type": "application/json"})
                m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
                if not m:
                    return self._error(404, "NotFound", f"no route {path}")
                files = hub.repos.get(m.group(1))
                if files is None:
                    return self._error(404, "RepoNotFound", "Repository not found")
                f = files.get(m.group(3))
                if f is None:
                    return self._error(404, "EntryNotFound", f"{m.group(3)} does not exist")
                body = f.served()
                headers = {"ETag": f'"{f.sha256}"', "X-Repo-Commit": COMMIT, "Accept-Ranges": "bytes",
                           "Content-Type": "application/octet-stream"}  # fmt: skip
                rng = self.headers.get("Range")
                if self.command == "GET" and rng:
                    start = int(re.match(r"bytes=(\d+)-", rng).group(1))
                    headers["Content-Range"] = f"bytes {start}-{len(body) - 1}/{len(body)}"
                    return self._send(206, body[start:], headers)
                if self.command == "GET" and f.cut:
                    f.cut = False
                    self.send_response(200)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                self._send(200, body, headers)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
