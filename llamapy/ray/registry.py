"""Where the ingress finds its handle's router: Ray Serve builds the router in the ingress's process from
a copy of :mod:`llamapy.ray.router` (it pickles that module by value), so the routers register here, in a
module imported by name, which the ingress shares."""

from __future__ import annotations

from typing import Any

ROUTERS: dict[tuple[str, str], Any] = {}


def router_for(app_name: str, deployment: str) -> Any:
    """The router this process built for ``deployment`` of ``app_name`` (None before its first request)."""
    return ROUTERS.get((app_name, deployment))
