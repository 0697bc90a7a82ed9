"""llamapy on Ray: a Ray Serve application of N replicas of the llamapy server behind one endpoint, with
prefix-cache-aware routing (``llamapy serve-ray``, :func:`build_app`). Needs the ``ray`` extra:
``pip install 'llamapy[ray]'``.

    import ray
    from ray import serve
    from llamapy.ray import build_app

    ray.init(num_cpus=2)
    serve.start(http_options={"port": 8000})
    serve.run(build_app("model.gguf", replicas=2, threads=1), name="llamapy", route_prefix="/")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import LlamapyError

if TYPE_CHECKING:
    from ray.serve import Application


class RayNotInstalledError(LlamapyError):
    """Ray (``ray[serve]``) is not installed."""


def require_ray() -> None:
    """Raise :class:`RayNotInstalledError`, naming the extra to install, when ``ray.serve`` is missing."""
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError as e:
        raise RayNotInstalledError(f"Ray Serve is not installed ({e}): pip install 'llamapy[ray]'") from None


def build_app(model: str, replicas: int = 1, **kwargs: Any) -> Application:
    """The Ray Serve application: see :func:`llamapy.ray.deployment.build_app`."""
    require_ray()
    from .deployment import build_app as _build

    return _build(model, replicas, **kwargs)


def from_args(args: dict[str, Any]) -> Application:
    """:func:`build_app` from a dict: the application builder for Ray Serve config files and KubeRay's
    RayService (``import_path: llamapy.ray:from_args`` with ``args: {model: ..., replicas: 2}``)."""
    args = dict(args)
    if "model" not in args:
        raise ValueError("args needs 'model': a GGUF path every node can read")
    return build_app(args.pop("model"), int(args.pop("replicas", 1)), **args)


def __getattr__(name: str) -> Any:
    """Pipeline parallel (``llamapy.ray.pipeline``), imported on first use: ``PipelineContext``,
    ``RemoteBackend``, ``PipelineError``."""
    if name in ("PipelineContext", "RemoteBackend", "PipelineError", "pipeline_context"):
        from . import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["PipelineContext", "PipelineError", "RayNotInstalledError", "RemoteBackend", "build_app", "from_args",
           "pipeline_context", "require_ray"]  # fmt: skip
