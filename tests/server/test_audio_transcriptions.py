"""Audio on the server (``--mmproj`` of a tiny random Ultravox-style model) over a real socket with the official
openai client: ``POST /v1/audio/transcriptions`` in every ``response_format``, ``input_audio`` chat parts, and
bad input as OpenAI-shaped 400s while the server keeps serving. (The transcript of a random model is garbage;
the shapes and the flow are what is checked.)"""

from __future__ import annotations

import base64
import io
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf

from llamapy.mtmd import MtmdContext
from llamapy.server.app import ServerSettings
from llamapy.server.audio import srt, vtt, windows
from llamapy.server.backend import ContextBackend
from tests.mtmd import audio_tiny
from tests.server.conftest import LiveServer, start_live, stop_live, wait_ready


def _audio(seconds: float = 1.5, fmt: str = "WAV", rate: int = 16000) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, 0.3 * np.sin(np.arange(int(seconds * rate)) / 7), rate, format=fmt)
    return buf.getvalue()


def _serve(text: Path, mmproj: Path | None) -> tuple[LiveServer, object]:
    backend = ContextBackend(text, n_ctx=1024, n_seq_max=2, n_batch=256, n_ubatch=256)
    if mmproj is not None:
        backend.mtmd = MtmdContext(mmproj, backend.model)  # type: ignore[attr-defined]
    srv, thread = start_live(ServerSettings(model_path=str(text), warmup=False), backend)
    wait_ready(srv.base_url, timeout=120)
    return srv, thread


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("audio-server")
    _, text = audio_tiny.make_text(d)
    return text, audio_tiny.make("ultravox", d).mmproj


@pytest.fixture(scope="module")
def server(files: tuple[Path, Path]) -> Iterator[LiveServer]:
    srv, thread = _serve(*files)
    yield srv
    stop_live(srv, thread)


def _client(srv: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0, timeout=120)


def test_transcriptions_through_the_openai_client(server: LiveServer) -> None:
    c = _client(server)
    wav = _audio(1.5)
    out = c.audio.transcriptions.create(model="tiny", file=("hello.wav", wav), language="en", prompt="names")
    assert isinstance(out.text, str) and out.usage is not None and out.usage.input_tokens > 188
    text = c.audio.transcriptions.create(
        model="tiny", file=("a.flac", _audio(fmt="FLAC")), response_format="text"
    )
    assert isinstance(text, str)
    s = c.audio.transcriptions.create(model="tiny", file=("a.mp3", _audio(fmt="MP3")), response_format="srt")
    assert s.startswith("1\n00:00:00,000 --> 00:00:01,5") and s.endswith("\n\n")
    v = c.audio.transcriptions.create(model="tiny", file=("a.ogg", _audio(fmt="OGG")), response_format="vtt")
    assert v.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.5")
    verbose = c.audio.transcriptions.create(model="tiny", file=("a.wav", wav), response_format="verbose_json")
    assert (
        abs(verbose.duration - 1.5) < 0.01
        and verbose.segments
        and verbose.segments[0].end == verbose.duration
    )


def test_segments_are_the_30_s_windows(server: LiveServer) -> None:
    """A 31 s clip in verbose_json: one segment per 30 s encoder window (0-30, 30-31), each window
    transcribed on its own; srt / vtt write one cue per segment."""
    c = _client(server)
    t0 = time.monotonic()
    v = c.audio.transcriptions.create(
        model="tiny", file=("long.flac", _audio(31, fmt="FLAC")), response_format="verbose_json"
    )
    took = time.monotonic() - t0
    assert abs(v.duration - 31) < 0.01
    assert [(s.id, s.seek, s.start, s.end) for s in v.segments] == [(0, 0, 0.0, 30.0), (1, 3000, 30.0, 31.0)]
    assert v.text == " ".join(s.text for s in v.segments if s.text)
    assert all(isinstance(s.tokens, list) and s.tokens for s in v.segments)
    print(f"31 s verbose_json (2 windows) answered in {took:.1f} s")
    segs = [(0.0, 30.0, " one "), (30.0, 60.0, "two"), (60.0, 65.5, "three")]
    assert srt(segs) == (
        "1\n00:00:00,000 --> 00:00:30,000\none\n\n2\n00:00:30,000 --> 00:01:00,000\ntwo\n\n"
        "3\n00:01:00,000 --> 00:01:05,500\nthree\n\n"
    )
    assert vtt(segs) == (
        "WEBVTT\n\n00:00:00.000 --> 00:00:30.000\none\n\n00:00:30.000 --> 00:01:00.000\ntwo\n\n"
        "00:01:00.000 --> 00:01:05.500\nthree\n\n"
    )
    w = windows(np.zeros(16000 * 65, np.float32))
    assert [(x, y, len(z)) for x, y, z in w] == [
        (0.0, 30.0, 480000),
        (30.0, 60.0, 480000),
        (60.0, 65.0, 80000),
    ]


def test_input_audio_in_chat(server: LiveServer) -> None:
    c = _client(server)
    part = {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(_audio()).decode(), "format": "wav"},
    }
    msg = [{"role": "user", "content": [{"type": "text", "text": "what is said"}, part]}]
    out = c.chat.completions.create(model="tiny", messages=msg, max_tokens=3, temperature=0)
    assert out.usage.prompt_tokens > 188 and out.usage.completion_tokens == 3
    assert httpx.get(server.base_url + "/props").json()["modalities"]["audio"] is True


def test_bad_transcription_requests_are_400(server: LiveServer) -> None:
    url = server.base_url + "/v1/audio/transcriptions"
    cases = [
        (dict(files={"file": ("a.txt", b"hello, not audio at all")}, data={"model": "m"}), "not a WAV"),
        (dict(files={"file": ("a.wav", b"RIFF\x24\x00\x00\x00WAVEfmt garbage garbage")}), "cannot decode"),
        (dict(files={"file": ("a.wav", _audio()[:30])}), "cannot decode"),  # truncated header
        (dict(data={"model": "m"}, files={"x": ("y", b"")}), "unknown form field"),
        (dict(data={"model": "m", "prompt": "p"}, files={"prompt2": ("a", b"1")}), "unknown form field"),
        (dict(files={"file": ("a.wav", _audio())}, data={"response_format": "docx"}), "response_format"),
        (dict(files={"file": ("a.wav", _audio())}, data={"stream": "true"}), "'stream' is not supported"),
        (dict(files={"file": ("a.wav", _audio())}, data={"temperature": "hot"}), "'temperature'"),
        (dict(json={"file": "x"}), "multipart/form-data"),
        (dict(data={"model": "m"}), "'file' is required"),
    ]
    for kw, says in cases:
        t0 = time.monotonic()
        r = httpx.post(url, timeout=30, **kw)
        assert r.status_code == 400, (kw.keys(), r.text)
        assert says in r.json()["error"]["message"], r.text
        assert time.monotonic() - t0 < 5
    with pytest.raises(openai.BadRequestError, match="not a WAV"):
        _client(server).audio.transcriptions.create(
            model="tiny", file=("a.png", b"\x89PNG\r\n\x1a\n" + bytes(64))
        )
    # ten minutes of audio on a 1024-token slot: a 400 with the token count
    r = httpx.post(url, files={"file": ("long.flac", _audio(600, fmt="FLAC", rate=8000))}, timeout=120)
    assert r.status_code == 400 and "tokens" in r.json()["error"]["message"], r.text
    assert (
        _client(server).audio.transcriptions.create(model="tiny", file=("ok.wav", _audio(0.3))).text
        is not None
    )


def test_transcription_on_a_model_without_audio(files: tuple[Path, Path]) -> None:
    srv, thread = _serve(files[0], None)
    try:
        with pytest.raises(openai.BadRequestError, match="audio encoder"):
            _client(srv).audio.transcriptions.create(model="tiny", file=("a.wav", _audio()))
        part = {
            "type": "input_audio",
            "input_audio": {"data": base64.b64encode(_audio()).decode(), "format": "wav"},
        }
        with pytest.raises(openai.BadRequestError, match="--mmproj"):
            _client(srv).chat.completions.create(model="t", messages=[{"role": "user", "content": [part]}])
    finally:
        stop_live(srv, thread)
