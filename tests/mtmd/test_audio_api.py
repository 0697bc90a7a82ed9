"""Audio through ``Llama(model, mmproj=...)`` (OpenAI ``input_audio`` parts) and ``llamapy run/chat --audio``;
bad audio, audio to a model without an audio encoder and audio longer than the context are typed errors."""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from llamapy.api import Llama
from llamapy.cli import main
from llamapy.generation.sequence import PromptTooLongError
from llamapy.model.model import Model
from llamapy.mtmd import AudioChunk, AudioError, Bitmap, MtmdContext, MtmdError
from llamapy.mtmd.audio import AudioBitmap
from tests.mtmd import audio_tiny, convert


def _wav(seconds: float = 1.0, rate: int = 16000, fmt: str = "WAV") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, 0.3 * np.sin(np.arange(int(seconds * rate)) / 5), rate, format=fmt)
    return buf.getvalue()


def _part(data: bytes, fmt: str = "wav") -> dict:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[audio_tiny.TinyAudio, torch.nn.Module, Path]:
    d = tmp_path_factory.mktemp("audio-api")
    hf, text = audio_tiny.make_text(d)
    return audio_tiny.make("qwen2a", d), hf, text


@pytest.fixture(scope="module")
def llm(files: tuple) -> Llama:
    tiny, _, text = files
    return Llama(str(text), mmproj=str(tiny.mmproj), n_ctx=1024, n_batch=256, n_ubatch=256, verbose=False)


def test_chat_with_input_audio_follows_hf_greedy(files: tuple, llm: Llama) -> None:
    tiny, hf, _ = files
    msgs = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "what is said"}, _part(_wav(fmt="FLAC"), "flac")],
        }
    ]
    out = llm.create_chat_completion(msgs, temperature=0.0, max_tokens=3)
    assert out["usage"]["completion_tokens"] == 3
    toks = llm.eval_tokens
    n_prompt = out["usage"]["prompt_tokens"]
    assert sum(t < 0 for t in toks[:n_prompt]) == 750  # one 30 s window: 750 qwen2a tokens
    assert (
        audio_tiny.SPECIALS.index("<|audio_bos|>") in toks
        and audio_tiny.SPECIALS.index("<|audio_eos|>") in toks
    )
    # HF, greedy: the audio's HF embeddings spliced into the HF text model's input
    mt = llm.mtmd
    chunk = next(
        c
        for c in mt.tokenize("<__media__>", [mt.bitmap_from_bytes(_wav(fmt="FLAC"))])
        if isinstance(c, AudioChunk)
    )
    audio = torch.from_numpy(tiny.reference(chunk.pixels))
    ids = [audio_tiny.AUDIO_PAD if t < 0 else t for t in toks]
    with torch.no_grad():
        emb = hf.get_input_embeddings()(torch.tensor([ids]))
        emb[0, torch.tensor(ids) == audio_tiny.AUDIO_PAD] = audio
        greedy = hf(inputs_embeds=emb).logits[0].argmax(-1).numpy()
    assert len(toks) - n_prompt == 2  # the generated tokens fed back (the last one is only sampled)
    assert list(toks[n_prompt:]) == list(greedy[n_prompt - 1 : -1])


def test_bad_audio_parts_are_typed_errors(llm: Llama) -> None:
    cases = [
        (_part(b"RIFF\x24\x00\x00\x00WAVEfmt garbage garbage"), "cannot decode"),
        (_part(_wav()[:40]), "cannot decode"),  # truncated
        (_part(b"\x00\x01\x02" * 10), "not a WAV, FLAC, OGG or MP3"),
        (_part(_wav(), "aac"), "format"),
        ({"type": "input_audio", "input_audio": {"data": "!!not base64!!", "format": "wav"}}, "base64"),
        ({"type": "input_audio", "input_audio": "x"}, "must be an object"),
    ]
    for part, match in cases:
        with pytest.raises(AudioError, match=match):
            llm.create_chat_completion([{"role": "user", "content": [part]}], max_tokens=1)
    # ten minutes of audio on a 1024-token context: refused before encoding, with the token count
    with pytest.raises(PromptTooLongError, match=r"has 15\d\d\d tokens but the context holds 1024"):
        llm.create_chat_completion([{"role": "user", "content": [_part(_wav(600, 8000))]}], max_tokens=1)
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(40)).decode()
    img = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + png}}
    with pytest.raises(MtmdError, match="no vision encoder"):
        llm.create_chat_completion([{"role": "user", "content": [img]}], max_tokens=1)
    out = llm.create_chat_completion([{"role": "user", "content": [_part(_wav(0.2))]}], max_tokens=1)
    assert out["usage"]["completion_tokens"] == 1  # still serving


def test_audio_to_a_vision_only_mmproj(llava_vlm: convert.TinyVLM) -> None:
    mt = MtmdContext(llava_vlm.mmproj_gguf(), Model.load(llava_vlm.text_gguf()))
    assert mt.support_vision and not mt.support_audio
    with pytest.raises(AudioError, match="no audio encoder"):
        mt.bitmap_from_bytes(_wav(), "clip.wav")
    with pytest.raises(AudioError, match="no audio encoder"):
        mt.tokenize("<__media__>", [AudioBitmap(np.zeros(1600, np.float32))])
    assert mt.tokenize("<__media__>", [Bitmap(np.zeros((8, 8, 3), np.uint8))])


def test_cli_run_and_chat_with_audio(
    files: tuple, tmp_path: Path, capfd: pytest.CaptureFixture, monkeypatch
) -> None:
    tiny, _, text = files
    wav = tmp_path / "hello.wav"
    wav.write_bytes(_wav())
    base = [
        "-m",
        str(text),
        "--mmproj",
        str(tiny.mmproj),
        "-c",
        "1024",
        "-b",
        "256",
        "-ub",
        "256",
        "--temp",
        "0",
    ]
    rc = main(["run", *base, "-n", "2", "--audio", str(wav), "-p", "transcribe"])
    out, err = capfd.readouterr()
    assert rc == 0, err
    assert re.search(r"prompt 7[5-9]\d tokens", err), err  # 750 audio tokens + markers + the text
    monkeypatch.setattr("sys.stdin", io.StringIO(f"/audio {wav}\nwhat is said\n"))
    rc = main(["chat", *base, "-n", "2"])
    out, err = capfd.readouterr()
    assert rc == 0 and "goes with the next message" in err, err
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt garbage garbage")
    rc = main(["run", *base, "-n", "2", "--audio", str(bad), "-p", "x"])
    err = capfd.readouterr().err
    assert rc == 1 and "bad.wav" in err and err.count("error:") == 1 and "Traceback" not in err


def test_audio_over_30_s_is_one_chunk_per_window(files: tuple, llm: Llama) -> None:
    tiny = files[0]
    mt = llm.mtmd
    x = (0.3 * np.sin(np.arange(35 * 16000) / 11)).astype(np.float32)
    chunks = mt.tokenize("<__media__> say", [AudioBitmap(x)])
    audio = [c for c in chunks if isinstance(c, AudioChunk)]
    assert [c.n_tokens for c in audio] == [750, 750] and audio[0].id != audio[1].id
    for c in audio:
        assert float(np.abs(mt.encode(c) - tiny.reference(c.pixels)).max()) < 1e-3
