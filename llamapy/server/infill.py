"""Fill-in-the-middle requests: llama.cpp's ``/infill`` and OpenAI ``/v1/completions`` ``suffix``, both
assembled by :func:`llamapy.api.infill.format_infill`."""

from __future__ import annotations

from typing import Any

from ..api.infill import FimError, FimTokens, format_infill
from .backend import Backend
from .errors import bad_request
from .params import check_tokens
from .schemas import InfillRequest


def fim_tokens(backend: Backend) -> FimTokens:
    try:
        return backend.fim_tokens()
    except FimError as e:
        raise bad_request(f"Infill is not supported by this model: {e}") from None


def mixed_tokens(x: Any, backend: Backend, param: str) -> list[int]:
    """llama.cpp's ``tokenize_mixed`` without special tokens: a string, or a list of strings and ids."""
    if isinstance(x, str):
        return backend.tokenize(x, add_special=False, parse_special=False)
    out: list[int] = []
    for i, part in enumerate(x):
        if isinstance(part, str):
            out += backend.tokenize(part, add_special=False, parse_special=False)
        else:
            out += check_tokens([part], backend.n_vocab, f"{param}[{i}]")
    return out


def _plain(backend: Backend):
    return lambda text: backend.tokenize(text, add_special=False, parse_special=False)


def infill_tokens(
    req: InfillRequest, backend: Backend, n_batch: int, n_ctx_slot: int, n_predict: int
) -> list[int]:
    fim = fim_tokens(backend)
    prefix = mixed_tokens(req.input_prefix, backend, "input_prefix")
    suffix = mixed_tokens(req.input_suffix, backend, "input_suffix")
    prompt = backend.tokenize(req.prompt, add_special=False, parse_special=True) if req.prompt else []
    chunks = [(c.filename, c.text) for c in req.input_extra]
    return format_infill(
        fim, _plain(backend), prefix, suffix, chunks, prompt, min(n_batch, n_ctx_slot), n_predict, n_ctx_slot
    )


def suffix_tokens(
    prompt: Any, suffix: str, backend: Backend, n_batch: int, n_ctx_slot: int, n_predict: int
) -> list[int]:
    """``/v1/completions`` with ``suffix``: the prompt is the FIM prefix (a string or token ids)."""
    fim = fim_tokens(backend)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if not isinstance(prompt, str) and not (
        isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
    ):
        raise bad_request("with 'suffix', 'prompt' must be one string or one list of token ids", "prompt")
    prefix = mixed_tokens(prompt, backend, "prompt")
    suf = backend.tokenize(suffix, add_special=False, parse_special=False)
    return format_infill(
        fim, _plain(backend), prefix, suf, [], [], min(n_batch, n_ctx_slot), n_predict, n_ctx_slot
    )
