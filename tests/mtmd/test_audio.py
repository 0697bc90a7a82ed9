"""Audio input: the log-mel front end against HF's WhisperFeatureExtractor, the Whisper encoder and the
ultravox / qwen2a / voxtral projectors against transformers, next-token logits with the audio in one ubatch and
split, and the decoding of WAV / FLAC / OGG / MP3."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr
import torch
from transformers import WhisperFeatureExtractor
from transformers.audio_utils import spectrogram, window_function

from llamapy.context import Context
from llamapy.model.model import Model
from llamapy.mtmd import AudioBitmap, AudioChunk, AudioError, MtmdContext, TextChunk, decode_audio
from llamapy.mtmd.audio import MEL_FLOOR, log_mel_spectrogram, mel_chunks
from llamapy.mtmd.audio_encoder import AudioModel
from tests.mtmd import audio_tiny

SR = 16000
RNG = np.random.default_rng(7)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def _signals() -> dict[str, np.ndarray]:
    t = np.arange(SR * 3 + 37) / SR
    long = np.arange(SR * 47 + 5) / SR  # > 30 s: two windows
    return {
        "tone": 0.5 * np.sin(2 * np.pi * 440 * t),
        "chirp": 0.3 * np.sin(2 * np.pi * (100 + 2000 * t) * t),
        "noise": 0.1 * RNG.standard_normal(t.shape[0]),
        "long": 0.2 * np.sin(2 * np.pi * 300 * long) + 0.05 * RNG.standard_normal(long.shape[0]),
        "odd-short": 0.5 * RNG.standard_normal(333),
        "tiny": 0.5 * RNG.standard_normal(100),  # fewer samples than the reflection needs
        "silence": np.zeros(8000),
    }


def _hf_mel(fe: WhisperFeatureExtractor, x: np.ndarray, floor: float = 1e-10) -> np.ndarray:
    """HF's ``_np_extract_fbank_features`` of ``x`` + 30 s of zeros (its ``mel_floor`` made a parameter)."""
    x = np.concatenate([x, np.zeros(max(0, 201 - x.shape[0]) + 30 * SR)]).astype(np.float32)
    spec = spectrogram(
        x, window_function(400, "hann"), frame_length=400, hop_length=160, power=2.0,
        mel_filters=fe.mel_filters, log_mel="log10", mel_floor=floor,
    )[:, :-1]  # fmt: skip
    spec = np.maximum(spec, spec.max() - 8.0)
    return (spec + 4.0) / 4.0


@pytest.mark.parametrize("n_mel", [80, 128])
def test_mel_matches_whisper_feature_extractor(n_mel: int) -> None:
    fe = WhisperFeatureExtractor(feature_size=n_mel)
    for name, x in _signals().items():
        if n_mel == 128 and name not in ("tone", "long", "tiny", "silence"):
            continue  # (the bin count only changes the filter bank)
        x = x.astype(np.float32)
        chunks = mel_chunks(x, n_mel)
        assert len(chunks) == (2 if name == "long" else 1) and all(c.shape == (n_mel, 3000) for c in chunks)
        got = np.concatenate(chunks, axis=1)
        # llama.cpp's algorithm with HF's arithmetic and llama.cpp's floor: equal everywhere
        same_floor = _hf_mel(fe, x, MEL_FLOOR)[:, : got.shape[1]]
        assert np.abs(got - same_floor).max() < 1e-4, name
        if name in ("tone", "chirp"):  # loud enough that the floors never bind: HF's numbers exactly
            assert np.abs(got - _hf_mel(fe, x)[:, : got.shape[1]]).max() < 1e-4, name
        if name == "tone":  # and HF's own __call__ (pads to 30 s)
            ref = fe(x, sampling_rate=SR, return_tensors="np").input_features[0]
            assert np.abs(got - ref).max() < 1e-4
    # the one documented difference: the floor (llama.cpp 2^-24, HF 1e-10) on silence
    sil = log_mel_spectrogram(np.zeros(8000, np.float32), n_mel)
    assert np.allclose(sil, (np.log10(MEL_FLOOR) + 4) / 4) and np.allclose(_hf_mel(fe, np.zeros(8000)), -1.5)


def test_mel_windows_follow_llama_cpp_counts() -> None:
    # n_len = (n + 30 s) / hop + 1 frames; whole 3000-frame windows only (30 s exactly: a second, silent window)
    for n, k in ((1, 1), (SR * 29, 1), (SR * 30, 2), (SR * 61, 3)):
        assert len(mel_chunks(np.full(n, 0.1, np.float32), 80)) == k
    with pytest.raises(AudioError, match="empty"):
        mel_chunks(np.zeros(0, np.float32), 80)


def test_gelu_erf_is_exact_gelu() -> None:
    from llamapy.ggml import ops
    from llamapy.ggml.graph import Graph
    from llamapy.ggml.sched import Scheduler
    from llamapy.ggml.types import GGMLType
    from llamapy.mtmd.audio_encoder import gelu_erf

    x = np.concatenate([np.linspace(-12, 12, 4001), [-1e4, 1e4, 0.0]]).astype(np.float32).reshape(1, -1)
    inp = ops.new_tensor(GGMLType.F32, x.shape, "x")
    out = gelu_erf(inp)
    sched = Scheduler()
    sched.compute(Graph(out), {inp: x})
    got, ref = sched.get(out), torch.nn.functional.gelu(torch.from_numpy(x).double()).numpy()
    assert np.isfinite(got).all() and np.abs(got - ref).max() < 2e-6


# -- encoders -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["ultravox", "qwen2a", "voxtral", "qwen2.5o"])
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> audio_tiny.TinyAudio:
    n_mel = 128 if request.param == "voxtral" else 80  # Voxtral / Whisper-v3 use 128 bins
    return audio_tiny.make(request.param, tmp_path_factory.mktemp(request.param), n_mel=n_mel)


def test_encoder_matches_hf(tiny: audio_tiny.TinyAudio) -> None:
    am = AudioModel(tiny.mmproj)
    assert am.hparams.projector_type == tiny.kind and am.n_mmproj_embd == audio_tiny.N_TEXT
    x = (0.3 * np.sin(2 * np.pi * 440 * np.arange(2 * SR) / SR) + 0.05 * RNG.standard_normal(2 * SR)).astype(
        np.float32
    )
    mel = mel_chunks(x, tiny.n_mel)[0]
    got = am.encode(mel)
    ref = tiny.reference(mel)
    assert got.shape == ref.shape == (am.n_tokens, audio_tiny.N_TEXT)
    assert am.n_tokens == {"ultravox": 188, "qwen2a": 750, "voxtral": 375, "qwen2.5o": 750}[tiny.kind]
    assert _rel(got, ref) < 1e-3, _rel(got, ref)


@pytest.fixture(scope="module")
def text_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    return audio_tiny.make_text(tmp_path_factory.mktemp("audio-text"))


@pytest.fixture(scope="module")
def audio_prompt(tiny: audio_tiny.TinyAudio, text_model: tuple[torch.nn.Module, Path]) -> tuple:
    """(text model, MtmdContext, chunks of a prompt with 1 s of audio, HF's next-token logits)."""
    hf, text_path = text_model
    model = Model.load(text_path)
    mt = MtmdContext(tiny.mmproj, model)
    assert mt.support_audio and not mt.support_vision
    x = (0.4 * np.sin(2 * np.pi * 220 * np.arange(SR) / SR)).astype(np.float32)
    chunks = mt.tokenize("the cat <__media__> is", [AudioBitmap(x)])
    audio = [c for c in chunks if isinstance(c, AudioChunk)]
    assert len(audio) == 1 and audio[0].n_tokens == mt.audio.n_tokens
    ids: list[int] = []
    for ch in chunks:
        ids += ch.tokens if isinstance(ch, TextChunk) else [audio_tiny.AUDIO_PAD] * ch.n_tokens
    begin = {"qwen2a": "<|audio_bos|>", "qwen2.5o": "<|audio_bos|>", "voxtral": "[BEGIN_AUDIO]"}.get(
        tiny.kind
    )
    if begin:  # the projector's marker tokens around the audio
        assert audio_tiny.SPECIALS.index(begin) in ids
    with torch.no_grad():
        emb = hf.get_input_embeddings()(torch.tensor([ids]))
        emb[0, torch.tensor(ids) == audio_tiny.AUDIO_PAD] = torch.from_numpy(tiny.reference(audio[0].pixels))
        ref = hf(inputs_embeds=emb).logits[0, -1].numpy()
    return model, mt, chunks, ref


@pytest.mark.parametrize("n_batch", [1024, 96], ids=["one-ubatch", "split"])
def test_logits_match_hf(audio_prompt: tuple, n_batch: int) -> None:
    model, mt, chunks, ref = audio_prompt
    ctx = Context(model, n_ctx=1024, n_batch=n_batch, n_ubatch=n_batch)
    n_past = mt.eval_chunks(ctx, chunks, 0)  # the audio's embeddings are computed once, kept on the chunk
    assert n_past == sum(c.n_tokens for c in chunks)
    assert _rel(ctx.get_logits()[-1], ref) < 1e-3


def test_qwen25o_one_mmproj_for_vision_and_audio(tmp_path: Path) -> None:
    """Qwen2.5-Omni: a qwen2.5vl_merger vision tower and a chunked qwen2a-style audio tower in one file."""
    from llamapy.ggml.types import GGMLType
    from llamapy.mtmd import ClipModel
    from tests.mtmd import convert

    vl = convert.make_qwen2vl(tmp_path, v25=True)
    au = audio_tiny.make("qwen2.5o", tmp_path)
    md = audio_tiny.mmproj_metadata("qwen2.5o", 80) | convert.qwen2vl_mmproj_metadata(vl.cfg, GGMLType.F32)
    md |= {"clip.projector_type": "qwen2.5o", "clip.has_audio_encoder": True}
    tensors = vl.mm_tensors(GGMLType.F32) | audio_tiny.mmproj_tensors("qwen2.5o", au.enc, au.proj)
    path = convert.write_mmproj(tmp_path / "omni.gguf", md, tensors, GGMLType.F32)
    cm, am = ClipModel(path), AudioModel(path)
    assert cm.hparams.projector_type == "qwen2.5vl_merger" and am.hparams.projector_type == "qwen2.5o"
    px = RNG.uniform(-1, 1, (3, 32, 48)).astype(np.float32)
    assert np.array_equal(cm.encode(px), ClipModel(vl.mmproj_gguf()).encode(px))
    mel = mel_chunks((0.2 * np.sin(np.arange(SR) / 3)).astype(np.float32), 80)[0]
    ref = au.reference(mel)
    assert _rel(am.encode(mel), ref) < 1e-3
    # its chunked convolutions, positions and attention matter: whole-window (llama.cpp's qwen2a graph) is off
    am.hparams.n_window, am._graph = 0, None
    assert _rel(am.encode(mel), ref) > 1e-2


# -- decoding -----------------------------------------------------------------------------------------
def _encode(x: np.ndarray, rate: int, fmt: str, subtype: str | None = None) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("fmt", "subtype", "tol"),
    [("WAV", "PCM_16", 1e-3), ("FLAC", None, 1e-3), ("OGG", "VORBIS", 0.1), ("MP3", None, 0.1)],
)
def test_decode_formats_to_16k_mono(fmt: str, subtype: str | None, tol: float) -> None:
    rate = 44100
    t = np.arange(rate) / rate
    stereo = np.stack([0.5 * np.sin(2 * np.pi * 440 * t), 0.3 * np.sin(2 * np.pi * 440 * t)], axis=1)
    bmp = decode_audio(_encode(stereo, rate, fmt, subtype), "clip")
    want = soxr.resample(stereo.mean(axis=1).astype(np.float32), rate, SR, quality="HQ")
    assert bmp.samples.dtype == np.float32 and bmp.samples.ndim == 1
    assert abs(bmp.samples.shape[0] - SR) < 0.05 * SR and abs(bmp.seconds - 1.0) < 0.05
    if fmt in ("WAV", "FLAC"):  # lossless: the down-mix, resampled by soxr
        assert np.abs(bmp.samples - want).max() < tol
    else:  # lossy codecs: the same tone's energy
        assert abs(np.sqrt(np.mean(bmp.samples[4000:12000] ** 2)) - np.sqrt(np.mean(want**2))) < tol


def test_bad_audio_is_a_typed_error() -> None:
    wav = _encode(0.1 * np.ones(16000), SR, "WAV", "PCM_16")
    for data, match in [
        (b"RIFF\x10\x00\x00\x00WAVEfmt garbage....", "cannot decode"),
        (wav[:30], "cannot decode"),  # truncated inside the header
        (b"", "empty"),
        (b"fLaC" + bytes(200), "cannot decode"),
    ]:
        with pytest.raises(AudioError, match=match):
            decode_audio(data, "clip")
    with pytest.raises(AudioError, match="at most 0.5 s"):
        decode_audio(wav, "clip", max_seconds=0.5)
    with pytest.raises(AudioError, match="larger than"):
        decode_audio(wav, "clip", max_bytes=100)
    nan = _encode(np.array([0.0, np.nan, 0.1] * 100), SR, "WAV", "FLOAT")
    with pytest.raises(AudioError, match="NaN"):
        decode_audio(nan, "clip")
