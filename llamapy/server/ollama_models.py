"""ollama's view of the served models: names (``name:tag``), ``details``, ``/api/tags`` entries,
``/api/ps`` expiry, ``/api/show`` capabilities (split from :mod:`llamapy.server.ollama`)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any


def supports_thinking(template: str) -> bool:
    return any(k in template for k in ("enable_thinking", "<think>", "reasoning_content", "thinking"))


def _names(model_id: str) -> tuple[str, set[str]]:
    """The served model's ollama name (``name:tag``) and every name a request may give for it."""
    stem = model_id[:-5] if model_id.lower().endswith(".gguf") else model_id
    name = stem if ":" in stem else f"{stem}:latest"
    ok = {model_id, stem, name}
    return name, {n.lower() for n in ok}


def _details(info: dict[str, Any]) -> dict[str, Any]:
    parts = str(info.get("desc", "")).split()
    arch = str(info.get("arch", "")) or (parts[0] if parts else "")
    return {
        "parent_model": "",
        "format": "gguf",
        "family": arch,
        "families": [arch] if arch else None,
        "parameter_size": parts[1] if len(parts) > 2 else "",
        "quantization_level": parts[2] if len(parts) > 2 else "",
    }


def _jsonable(v: Any, verbose: bool) -> tuple[bool, Any]:
    if isinstance(v, bool | int | float | str):
        return True, v
    if hasattr(v, "item") and not hasattr(v, "__len__"):  # a numpy scalar
        return True, v.item()
    if isinstance(v, list | tuple) and verbose:
        items = [_jsonable(x, True) for x in v]
        return all(ok for ok, _ in items), [x for _, x in items]
    return False, None


def stamp(m: Any) -> tuple[str, str]:
    """(modified_at, digest) of a model's file; the digest names the file (path, size, mtime), not its
    bytes (hashing gigabytes per request is not worth it)."""
    p = Path(m.settings.model_path)
    try:
        st = p.stat()
        mtime, size = st.st_mtime, st.st_size
    except OSError:
        mtime, size = m.created, 0
    when = datetime.fromtimestamp(mtime, UTC).isoformat().replace("+00:00", "Z")
    return when, hashlib.sha256(f"{p.resolve()}:{size}:{mtime}".encode()).hexdigest()


def model_entry(m: Any, info: dict[str, Any] | None = None) -> dict[str, Any]:
    """A model as ``/api/tags`` lists it (``info``: the backend's, or the file's header unloaded)."""
    info = m.backend.info() if info is None else info
    name, _ = _names(m.name)
    when, digest = stamp(m)
    size = int(info.get("size") or 0)
    return {"name": name, "model": name, "modified_at": when, "size": size, "digest": digest,
            "details": _details(info)}  # fmt: skip


def _until(m: Any, keep_alive: float | None) -> str:
    seconds = 365 * 100 * 86400 if keep_alive is None or keep_alive < 0 else keep_alive
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def capabilities(backend: Any, template: str) -> list[str]:
    if backend.embeddings:
        return ["embedding"]
    caps = ["completion"]
    if "tools" in template:
        caps.append("tools")
    if supports_thinking(template):
        caps.append("thinking")
    if getattr(backend, "mtmd", None) is not None:
        caps.append("vision")
    try:
        backend.fim_tokens()
        caps.append("insert")
    except Exception:  # no fill-in-the-middle tokens
        pass
    return caps


def template_of(backend: Any) -> str:
    return str(backend.info().get("chat_template") or "")
