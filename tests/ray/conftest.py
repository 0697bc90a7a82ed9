"""One local Ray cluster for the cluster tests (2 CPUs, a small object store, no dashboard) with the llamapy
application deployed: two replicas of SmolLM2, one thread each, behind the Serve proxy on a free port."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

APP = "llamapy"


@dataclass
class RayServe:
    base_url: str
    model: str


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")  # one cluster for the module's tests, shut down when they are done
def ray_serve(smollm2_path: Path) -> Iterator[RayServe]:
    import httpx
    import ray
    from ray import serve

    from llamapy.ray import build_app

    t0 = time.monotonic()
    # Serve's INFO lines go to the stream pytest captured when its logger was made, closed by now
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=200 << 20,
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = build_app(str(smollm2_path), 2, threads=1, parallel=2, ctx_size=2048, seed=42)
        serve.run(app, name=APP, route_prefix="/")
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(base + "/health", timeout=30).status_code == 200
        print(f"\nray serve: 2 replicas up in {time.monotonic() - t0:.1f} s")
        yield RayServe(base, str(smollm2_path))
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
