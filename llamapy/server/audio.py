"""OpenAI's ``POST /v1/audio/transcriptions`` on a model whose mmproj has an audio encoder (llama-server has no
such route): the multipart form's ``file`` (WAV, FLAC, OGG or MP3), ``model``, ``prompt``, ``language``,
``temperature`` and ``response_format`` (``json``, ``text``, ``srt``, ``vtt``, ``verbose_json``).

The audio goes through the chat path as one user message (an ``input_audio`` part and an instruction: "Transcribe
the audio", the language and the prompt as context), greedy unless ``temperature`` is given, at most 16 tokens per
second of audio + 64; the answer's text is the transcript. ``json`` and ``text`` transcribe the clip in one
pass (it must fit in a slot's context: else a 400 with the token count).

The model has no timestamp tokens, so ``srt`` / ``vtt`` / ``verbose_json`` take their segments from the
encoder's windows: the clip is cut into 30 s windows (the ``mtmd`` Whisper front end's ``CHUNK_FRAMES``),
each transcribed on its own, one segment per window with its ``start`` / ``end`` in seconds (``[0, 30]``,
``[30, 60]``, ... the last ending at the clip's duration; a clip up to 30 s is one segment), the full text
their transcripts joined. Each window must fit in the context, the whole clip need not. Bad input is a 400
in OpenAI's error shape: no file, not an audio file, an undecodable one, a model without an audio encoder,
``stream``, an unknown ``response_format``.
"""

from __future__ import annotations

import base64
import io
import math
from typing import Any

import numpy as np
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

__all__ = ["add_routes", "srt", "transcription_prompt", "vtt", "windows"]

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


Segment = tuple[float, float, str]  # start and end in seconds, text


def _segments(text_or_segments: str | list[Segment], seconds: float) -> list[Segment]:
    if isinstance(text_or_segments, str):
        return [(0.0, seconds, text_or_segments)]
    return text_or_segments


def srt(text: str | list[Segment], seconds: float = 0.0) -> str:
    """SubRip cues: one per segment (a text: one spanning ``seconds``)."""
    return "".join(
        f"{i}\n{_stamp(a, ',')} --> {_stamp(b, ',')}\n{t.strip()}\n\n"
        for i, (a, b, t) in enumerate(_segments(text, seconds), 1)
    )


def vtt(text: str | list[Segment], seconds: float = 0.0) -> str:
    """WebVTT cues: one per segment (a text: one spanning ``seconds``)."""
    cues = (f"{_stamp(a, '.')} --> {_stamp(b, '.')}\n{t.strip()}\n\n" for a, b, t in _segments(text, seconds))
    return "WEBVTT\n\n" + "".join(cues)


def windows(samples: np.ndarray) -> list[tuple[float, float, np.ndarray]]:
    """The clip's 30 s windows (start and end seconds, 16 kHz samples): the segments of srt / vtt /
    verbose_json."""
    from ..mtmd.audio import CHUNK_FRAMES, HOP, SAMPLE_RATE

    step = CHUNK_FRAMES * HOP  # 30 s of samples
    n = int(samples.shape[0])
    return [
        (a / SAMPLE_RATE, min(a + step, n) / SAMPLE_RATE, samples[a : a + step])
        for a in range(0, max(n, 1), step)
    ]


def _wav(samples: np.ndarray) -> bytes:
    import soundfile as sf

    from ..mtmd.audio import SAMPLE_RATE

    buf = io.BytesIO()
    sf.write(buf, samples, SAMPLE_RATE, format="WAV", subtype="FLOAT")
    return buf.getvalue()


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


def _decoded(backend: Any, data: bytes, where: str) -> Any:
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
        return decode_audio(data, where)
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
        audio = await run_in_threadpool(_decoded, backend, data, filename)
        seconds = audio.seconds

        async def transcribe(clip: bytes, kind: str, secs: float) -> tuple[str, list[int], Any, list[int]]:
            part = {
                "type": "input_audio",
                "input_audio": {"data": base64.b64encode(clip).decode(), "format": kind},
            }
            text_part = {"type": "text", "text": transcription_prompt(f["language"], f["prompt"])}
            body = {"messages": [{"role": "user", "content": [part, text_part]}], "temperature": temperature}
            req = validate(ChatCompletionRequest, body)
            # a transcript is short: at most 16 tokens a second (+ 64), so that a model looping on its words stops
            budget = min(int(secs * 16) + 64, int(engine.n_ctx_slot))  # (the context ends it too)
            tokens, gp = await chat_inputs(req, m, budget, "max_tokens")
            text, _, out_tokens, final = await collect(request, engine, tokens, gp)
            return text.strip(), list(out_tokens), final, tokens

        wins = windows(audio.samples) if fmt in ("srt", "vtt", "verbose_json") else []
        if len(wins) > 1:  # one segment per 30 s window, each transcribed on its own
            segs: list[tuple[float, float, str, list[int]]] = []
            for a, b, clip in wins:
                wav = await run_in_threadpool(_wav, clip)
                t, toks, _, _ = await transcribe(wav, "wav", b - a)
                segs.append((a, b, t, toks))
            text = " ".join(t for _, _, t, _ in segs if t)
        else:
            text, out_tokens, final, tokens = await transcribe(data, _SNIFF.get(data[:4], "mp3"), seconds)
            segs = [(0.0, seconds, text, out_tokens)]
        if fmt == "text":
            return PlainTextResponse(text + "\n")
        if fmt == "srt":
            return PlainTextResponse(srt([(a, b, t) for a, b, t, _ in segs]))
        if fmt == "vtt":
            return PlainTextResponse(vtt([(a, b, t) for a, b, t, _ in segs]), media_type="text/vtt")
        if fmt == "verbose_json":
            segments = [
                {"id": i, "seek": int(round(a * 100)), "start": round(a, 3), "end": round(b, 3), "text": t,
                 "tokens": toks, "temperature": temperature, "avg_logprob": 0.0, "compression_ratio": 1.0,
                 "no_speech_prob": 0.0}
                for i, (a, b, t, toks) in enumerate(segs)
            ]  # fmt: skip
            return JSONAnswer(
                {
                    "task": "transcribe",
                    "language": f["language"] or "",
                    "duration": round(seconds, 3),
                    "text": text,
                    "segments": segments,
                    "usage": {"type": "duration", "seconds": math.ceil(seconds)},
                }
            )
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
        return JSONAnswer({"text": text, "usage": usage})
