"""HTTP errors with OpenAI-style bodies: ``{"error": {"message", "type", "code", "param"}}``."""

from __future__ import annotations

from typing import Any

from ..errors import LlamapyError

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


class APIError(LlamapyError):
    """An error answered to the client with ``status`` and an OpenAI-style body."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str | None = None,
        param: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _TYPES.get(status, "invalid_request_error")
        self.param = param
        self.extra = extra or {}  # more fields of the error object (llama-server's n_prompt_tokens ...)

    def body(self) -> dict[str, Any]:
        err: dict[str, Any] = {"message": self.message, "type": self.type, "code": self.status}
        if self.param is not None:
            err["param"] = self.param
        return {"error": err | self.extra}


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def not_supported(what: str, param: str | None = None) -> APIError:
    """A feature the request asks for that llamapy cannot honour yet (never ignored silently)."""
    return APIError(400, f"{what} is not supported yet", param=param)


def context_error(n_prompt: int, n_ctx_slot: int, at_least: bool = False) -> APIError:
    """A prompt past the slot's context, as llama-server answers it: type ``exceed_context_size_error``
    with ``n_prompt_tokens`` and ``n_ctx`` in the error object (``at_least``: the prompt has more than
    ``n_ctx_slot`` tokens, not counted to the end)."""
    count = f"more than {n_ctx_slot}" if at_least else str(n_prompt)
    return APIError(
        400,
        f"the prompt has {count} tokens but a slot's context holds {n_ctx_slot} (it must leave room for "
        "at least one generated token; shorten the prompt or start the server with a larger -c or fewer -np)",
        type="exceed_context_size_error",
        param="prompt",
        extra={"n_prompt_tokens": n_prompt, "n_ctx": n_ctx_slot},
    )


def error_body(status: int, message: str, type: str | None = None) -> dict[str, Any]:
    return APIError(status, message, type).body()
