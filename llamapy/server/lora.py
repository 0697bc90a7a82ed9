"""LoRA adapters in the server, as llama-server has them: adapters loaded at start (``--lora FILE``,
``--lora-scaled FILE SCALE``, ``--lora-init-without-apply`` for scale 0), ``GET /lora-adapters`` (id,
path, scale), ``POST /lora-adapters`` (a list of ``{"id", "scale"}`` setting the global scales), and a
per-request ``lora`` list of the same shape that overrides the global scales for that request (adapters
it does not name keep their global scale).

The engine applies a request's scales while its slot is in the batch; slots whose scales differ are not
batched together, and a slot's cached prompt is not reused under other scales.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import Request

from .errors import APIError


def parse_lora_list(raw: Any, n_adapters: int, param: str = "lora") -> dict[int, float]:
    """``[{"id": 0, "scale": 0.5}, ...]`` -> {id: scale}, checked (a 400 naming the problem)."""
    if not isinstance(raw, list):
        raise APIError(400, f'\'{param}\' must be a list of {{"id", "scale"}} objects', param=param)
    out: dict[int, float] = {}
    for i, item in enumerate(raw):
        where = f"'{param}[{i}]'"
        if not isinstance(item, dict) or set(item) - {"id", "scale"} or "id" not in item:
            raise APIError(400, f"{where} must be an object with 'id' and 'scale'", param=param)
        aid, scale = item["id"], item.get("scale", 1.0)
        if not isinstance(aid, int) or isinstance(aid, bool) or not 0 <= aid < n_adapters:
            have = f"ids 0 to {n_adapters - 1}" if n_adapters else "no adapters (start it with --lora FILE)"
            raise APIError(
                400, f"{where}: no LoRA adapter with id {aid!r} (the server has {have})", param=param
            )
        if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not math.isfinite(scale):
            raise APIError(400, f"{where}: 'scale' must be a finite number, got {scale!r}", param=param)
        out[aid] = float(scale)
    return out


def n_lora_adapters(backend: Any) -> int:
    return len(_infos(backend))


def resolve(changes: dict[int, float] | None, global_scales: list[float]) -> tuple[float, ...]:
    """The scales a request runs with: the global ones, with the request's ``lora`` changes on top."""
    return tuple((changes or {}).get(i, s) for i, s in enumerate(global_scales))


def add_routes(app: Any, state: Any) -> None:
    @app.get("/lora-adapters")
    async def lora_adapters(request: Request) -> list[dict[str, Any]]:
        engine, backend = (await state.pick(request)).ready()
        return [dict(info, scale=engine.lora_scales[i]) for i, info in enumerate(_infos(backend))]

    @app.post("/lora-adapters")
    async def set_lora_adapters(request: Request) -> list[dict[str, Any]]:
        from .schemas import parse_json

        engine, backend = (await state.pick(request)).ready()
        changes = parse_lora_list(
            parse_json(await request.body(), array_ok=True), len(engine.lora_scales), "body"
        )
        scales = [changes.get(i, s) for i, s in enumerate(engine.lora_scales)]
        await _on_engine(engine, scales)
        return [dict(info, scale=scales[i]) for i, info in enumerate(_infos(backend))]


def _infos(backend: Any) -> list[dict[str, Any]]:
    fn = getattr(backend, "lora_info", None)
    return list(fn()) if fn is not None else []


async def _on_engine(engine: Any, scales: list[float]) -> None:
    import asyncio

    def apply(e: Any) -> None:
        e.lora_scales = list(scales)

    await asyncio.wrap_future(engine.call(apply))
