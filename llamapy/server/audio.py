"""OpenAI's ``POST /v1/audio/transcriptions`` on a model whose mmproj has an audio encoder (llama-server has no
such route): the multipart form's ``file`` (WAV, FLAC, OGG or MP3), ``model``, ``prompt``, ``language``,
``temperature`` and ``response_format`` (``json``, ``text``, ``srt``, ``vtt``, ``verbose_json``).

The audio goes through the chat path as one user message (an ``input_audio`` part and an instruction: "Transcribe
the audio", the language and the prompt as context), greedy unless ``temperature`` is given, at most 16 tokens per
second of audio + 64; the answer's text is the transcript. The model has no timestamps: ``srt`` / ``vtt`` / ``verbose_json`` hold one segment spanning the
whole clip. Bad input is a 400 in OpenAI's error shape: no file, not an audio file, an undecodable one, a model
without an audio encoder, ``stream``, an unknown ``response_format``.
"""

from __future__ import annotations

import base64
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from .errors import bad_request
from .formats import JSONAnswer
from .inputs import chat_inputs, no_completions
from .schemas import ChatCompletionRequest, validate
from .state import ServerState
from .stream import collect

__all__ = ["add_routes", "srt", "transcription_prompt", "vtt"]

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
_FIELDS = ("file", "model", "prompt", "language", "temperature", "response_format", "stream", "chunking_strategy",
           "timestamp_granularities[]", "include[]", "known_speaker_names[]", "known_speaker_references[]")  # fmt: skip
_SNIFF = {b"RIFF": "wav", b"fLaC": "flac", b"OggS": "ogg"}


def transcription_prompt(language: str | None, prompt: str | None) -> str:
    """The instruction that goes with the audio."""
    text = "Transcribe the audio" + (f" (language: {language})" if language else "") + "."
    if prompt:
        text += f" Context and spelling hints: {prompt}"
    return text


def _stamp(seconds: float, sep: str) -> str:
    ms = int(round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def srt(text: str, seconds: float) -> str:
    return f"1\n{_stamp(0, ',')} --> {_stamp(seconds, ',')}\n{text.strip()}\n\n"


def vtt(text: str, seconds: float) -> str:
    return f"WEBVTT\n\n{_stamp(0, '.')} --> {_stamp(seconds, '.')}\n{text.strip()}\n\n"


def _str_field(form: Any, name: str) -> str | None:
    v = form.get(name)
    if v is None:
        return None
    if not isinstance(v, str):
        raise bad_request(f"'{name}' must be a text field, not a file", name)
    return v


async def _read_form(request: Request) -> tuple[bytes, str, dict[str, str | None]]:
    ctype = request.headers.get("content-type", "")
    if not ctype.lower().startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        raise bad_request(
            f"the body must be multipart/form-data (OpenAI's transcription form), got {ctype or 'no content type'!r}"
        )
    try:
        form = await request.form(max_files=1, max_fields=32)
    except Exception as e:  # a malformed multipart body (starlette's MultiPartException, HTTPException)
        raise bad_request(f"cannot parse the multipart form: {getattr(e, 'detail', None) or e}") from None
    for key in form.keys():
        if key not in _FIELDS:
            raise bad_request(f"unknown form field {key!r}", key)
    f = form.get("file")
    if f is None:
        raise bad_request("'file' is required: the audio file to transcribe", "file")
    if not isinstance(f, UploadFile):
        raise bad_request("'file' must be a file part (multipart with a filename)", "file")
    data = await f.read()
    fields = {
        k: _str_field(form, k) for k in ("model", "prompt", "language", "temperature", "response_format")
    }
    fields["stream"] = _str_field(form, "stream")
    return data, f.filename or "file", fields


def _audio_seconds(backend: Any, data: bytes, where: str) -> float:
    from ..mtmd import MtmdError
    from ..mtmd.audio import decode_audio, is_audio

    mt = getattr(backend, "mtmd", None)
    if mt is None or not getattr(mt, "support_audio", False):
        raise bad_request(
            "this model cannot transcribe: it needs an mmproj with an audio encoder (--mmproj FILE of "
            "an ultravox, qwen2a or voxtral model)",
            "model",
        )
    if not is_audio(data):
        raise bad_request(f"{where}: not a WAV, FLAC, OGG or MP3 file; cannot decode the audio", "file")
    try:
        return decode_audio(data, where).seconds
    except MtmdError as e:
        raise bad_request(str(e), "file") from None


def add_routes(app: FastAPI, state: ServerState) -> None:
    @app.post("/v1/audio/transcriptions")
    async def transcriptions(request: Request) -> Any:
        data, filename, f = await _read_form(request)
        fmt = (f["response_format"] or "json").strip()
        if fmt not in FORMATS:
            raise bad_request(
                f"'response_format' must be one of {', '.join(FORMATS)}, got {fmt!r}", "response_format"
            )
        if (f["stream"] or "false").strip().lower() not in ("false", "0", ""):
            raise bad_request("'stream' is not supported for transcriptions", "stream")
        temperature = 0.0
        if f["temperature"] not in (None, ""):
            try:
                temperature = float(f["temperature"])  # type: ignore[arg-type]
            except ValueError:
                raise bad_request(
                    f"'temperature' must be a number, got {f['temperature']!r}", "temperature"
                ) from None
            if not 0.0 <= temperature <= 2.0 or math.isnan(temperature):
                raise bad_request("'temperature' must be between 0 and 2", "temperature")
        if state.router is not None and not f["model"]:
            raise bad_request("'model' is required", "model")
        m = await state.pick(request, name=f["model"] if state.router is not None else None)
        engine, backend = m.ready()
        no_completions(backend)
        seconds = await run_in_threadpool(_audio_seconds, backend, data, filename)
        kind = _SNIFF.get(data[:4], "mp3")
        part = {
            "type": "input_audio",
            "input_audio": {"data": base64.b64encode(data).decode(), "format": kind},
        }
        text_part = {"type": "text", "text": transcription_prompt(f["language"], f["prompt"])}
        body = {"messages": [{"role": "user", "content": [part, text_part]}], "temperature": temperature}
        req = validate(ChatCompletionRequest, body)
        # a transcript is short: at most 16 tokens a second (+ 64), so that a model looping on its words stops
        tokens, gp = await chat_inputs(req, m, int(seconds * 16) + 64, "max_tokens")
        text, _, out_tokens, final = await collect(request, engine, tokens, gp)
        text = text.strip()
        if fmt == "text":
            return PlainTextResponse(text + "\n")
        if fmt == "srt":
            return PlainTextResponse(srt(text, seconds))
        if fmt == "vtt":
            return PlainTextResponse(vtt(text, seconds), media_type="text/vtt")
        usage = {
            "type": "tokens",
            "input_tokens": final.n_prompt,
            "input_token_details": {"audio_tokens": sum(1 for t in tokens if t < 0), "text_tokens": 0},
            "output_tokens": final.n_predicted,
            "total_tokens": final.n_prompt + final.n_predicted,
        }
        usage["input_token_details"]["text_tokens"] = (
            final.n_prompt - usage["input_token_details"]["audio_tokens"]
        )
        if fmt == "json":
            return JSONAnswer({"text": text, "usage": usage})
        segment = {
            "id": 0, "seek": 0, "start": 0.0, "end": round(seconds, 3), "text": text, "tokens": list(out_tokens),
            "temperature": temperature, "avg_logprob": 0.0, "compression_ratio": 1.0, "no_speech_prob": 0.0,
        }  # fmt: skip
        return JSONAnswer(
            {
                "task": "transcribe",
                "language": f["language"] or "",
                "duration": round(seconds, 3),
                "text": text,
                "segments": [segment],
                "usage": {"type": "duration", "seconds": math.ceil(seconds)},
            }
        )
