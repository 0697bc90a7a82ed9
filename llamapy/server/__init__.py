"""The OpenAI-compatible HTTP server (``llamapy serve``): FastAPI app, engine with parallel slots and
continuous batching, request schemas and metrics.

    from llamapy.server import ServerSettings, create_app
    from llamapy.server.backend import ContextBackend

    app = create_app(ServerSettings(model_path=path), lambda: ContextBackend(path, n_seq_max=4))
"""

from .app import ServerSettings, create_app
from .engine import Engine, Event, GenParams, Task
from .errors import APIError

__all__ = ["APIError", "Engine", "Event", "GenParams", "ServerSettings", "Task", "create_app"]
