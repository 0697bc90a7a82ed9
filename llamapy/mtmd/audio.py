"""Audio input (llama.cpp's ``mtmd-audio.cpp`` and the audio half of ``mtmd-helper.cpp``): decoding, resampling
and Whisper's log-mel front end.

- ``is_audio(data)``: WAV / FLAC / OGG / MP3 by their magic bytes (as ``audio_helpers::is_audio_file``, plus OGG).
- ``decode_audio(data)``: any of those through ``soundfile`` (libsndfile; its wheels bundle MP3), down-mixed to
  mono and resampled to 16 kHz with ``soxr``; ``AudioBitmap`` holds the samples and their hash. Both libraries
  come with ``llamapy[audio]``.
- ``log_mel_spectrogram(samples, n_mel)`` / ``mel_chunks``: ``mtmd_audio_preprocessor_whisper`` -- a periodic
  Hann window of 400, 160-sample hops, a Slaney-scale mel filter bank with Slaney area norm, the 200 samples
  before the audio reflected, 30 s of silence after it, ``log10(max(power, 2^-24))``, clamped to the maximum
  minus 8 and mapped by ``(x + 4) / 4``; then cut into whole 3000-frame (30 s) windows, the last, partial
  window dropped (it is always silence). One difference to HF's ``WhisperFeatureExtractor``: its floor is
  ``1e-10`` where llama.cpp's is ``2^-24``, which changes quiet parts (an all-silent clip is -0.806 here and
  -1.5 in HF); wherever the loudest frame is above ``log10(2^-24) + 8`` the two agree.
"""

from __future__ import annotations

import hashlib
import io
import math
from functools import lru_cache

import numpy as np

from .._dataclass import dataclass
from .errors import MtmdError

__all__ = [
    "SAMPLE_RATE", "AudioBitmap", "AudioError", "decode_audio", "is_audio", "log_mel_spectrogram", "mel_chunks",
    "mel_filters",
]  # fmt: skip

SAMPLE_RATE = 16000
N_FFT = 400
HOP = 160
CHUNK_FRAMES = 3000  # 30 s of mel frames: one encoder pass
MEL_FLOOR = 5.960464477539063e-08  # 2^-24, llama.cpp's filter_params::mel_floor
MAX_AUDIO_SECONDS = 3600.0
MAX_AUDIO_BYTES = 64 * 1024 * 1024


class AudioError(MtmdError):
    """Audio that cannot be decoded or is refused: corrupt or truncated data, an unsupported format, empty or
    too long audio, or audio given to a model whose mmproj has no audio encoder."""


def is_audio(data: bytes) -> bool:
    """WAV (RIFF/WAVE), FLAC, OGG or MP3 (ID3 tag or an MPEG frame sync), by the first bytes."""
    if len(data) < 12:
        return False
    return (
        (data[:4] == b"RIFF" and data[8:12] == b"WAVE")
        or data[:4] in (b"fLaC", b"OggS")
        or data[:3] == b"ID3"
        or (data[0] == 0xFF and (data[1] & 0xE0) == 0xE0)
    )


@dataclass
class AudioBitmap:
    """Decoded audio: mono float32 samples at 16 kHz (``mtmd_bitmap`` of an audio file)."""

    samples: np.ndarray
    id: str = ""

    def __post_init__(self) -> None:
        self.samples = np.ascontiguousarray(self.samples, dtype=np.float32).reshape(-1)
        if not self.id:
            self.id = hashlib.sha256(self.samples.tobytes()).hexdigest()

    @property
    def seconds(self) -> float:
        return self.samples.shape[0] / SAMPLE_RATE


def _libs() -> tuple[object, object]:
    try:
        import soundfile
        import soxr
    except ImportError as e:  # pragma: no cover - the extra is part of the test install
        raise AudioError(
            f"audio input needs soundfile and soxr: pip install 'llamapy[audio]' ({e})"
        ) from None
    return soundfile, soxr


def decode_audio(
    data: bytes,
    where: str = "audio",
    max_seconds: float = MAX_AUDIO_SECONDS,
    max_bytes: int = MAX_AUDIO_BYTES,
) -> AudioBitmap:
    """``data`` (WAV, FLAC, OGG or MP3) as 16 kHz mono; ``AudioError`` when it cannot be used."""
    sf, soxr = _libs()
    if len(data) > max_bytes:
        raise AudioError(f"{where}: the audio is larger than {max_bytes} bytes")
    if not data:
        raise AudioError(f"{where}: the audio is empty")
    try:
        with sf.SoundFile(io.BytesIO(data)) as f:  # type: ignore[attr-defined]
            rate, frames, channels = int(f.samplerate), int(f.frames), int(f.channels)
            if rate <= 0 or channels <= 0:
                raise AudioError(f"{where}: the audio has {channels} channels at {rate} Hz")
            if frames > max_seconds * rate:
                raise AudioError(
                    f"{where}: the audio is {frames / rate:.1f} s long; at most {max_seconds:g} s are accepted"
                )
            # read in blocks, down-mixed and resampled as they come: memory follows the 16 kHz mono result
            rs = None
            if rate != SAMPLE_RATE:
                rs = soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32", quality="HQ")  # type: ignore[attr-defined]
            parts: list[np.ndarray] = []
            n_in = 0
            for block in f.blocks(blocksize=rate * 10, dtype="float32", always_2d=True):
                n_in += block.shape[0]
                if n_in > max_seconds * rate:
                    raise AudioError(f"{where}: the audio is longer than {max_seconds:g} s")
                if not np.isfinite(block).all():
                    raise AudioError(f"{where}: the audio has NaN or infinite samples")
                mono = block.mean(axis=1, dtype=np.float32) if channels > 1 else block[:, 0]
                parts.append(rs.resample_chunk(mono) if rs is not None else mono.copy())
            if rs is not None:
                parts.append(rs.resample_chunk(np.zeros(0, np.float32), last=True))
    except AudioError:
        raise
    except Exception as e:  # soundfile.LibsndfileError, RuntimeError, TypeError on malformed headers
        msg = str(e).strip() or type(e).__name__
        raise AudioError(
            f"{where}: cannot decode the audio (WAV, FLAC, OGG and MP3 are read): {msg}"
        ) from None
    if n_in == 0:
        raise AudioError(f"{where}: the audio has no samples")
    mono = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    return AudioBitmap(np.asarray(mono, dtype=np.float32))


# -- log-mel ---------------------------------------------------------------------------------------------
@lru_cache(maxsize=4)
def mel_filters(n_mel: int, n_fft: int = N_FFT, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """``F32[n_mel, n_fft/2 + 1]``: triangles on the Slaney mel scale, Slaney area norm, 0 Hz to Nyquist
    (``mtmd_audio_cache::fill_mel_filterbank_matrix`` with its defaults; librosa's and HF's filters)."""
    lin_slope, min_log_hz = 3 / 200.0, 1000.0
    min_log_mel, log_step = min_log_hz * lin_slope, math.log(6.4) / 27.0

    def hz_to_mel(f: float) -> float:
        return f * lin_slope if f < min_log_hz else min_log_mel + math.log(f / min_log_hz) / log_step

    def mel_to_hz(m: np.ndarray) -> np.ndarray:
        return np.where(m < min_log_mel, m / lin_slope, min_log_hz * np.exp((m - min_log_mel) * log_step))

    m_lo, m_hi = hz_to_mel(0.0), hz_to_mel(0.5 * sample_rate)
    hz = mel_to_hz(m_lo + (m_hi - m_lo) * np.arange(n_mel + 2) / (n_mel + 1))
    f = np.arange(n_fft // 2 + 1) * (sample_rate / n_fft)
    left, center, right = hz[:-2, None], hz[1:-1, None], hz[2:, None]
    up = (f - left) / np.maximum(1e-30, center - left)
    down = (right - f) / np.maximum(1e-30, right - center)
    w = np.where((f >= left) & (f <= center), up, np.where((f > center) & (f <= right), down, 0.0))
    w *= 2.0 / np.maximum(1e-30, right - left)
    return w.astype(np.float32)


@lru_cache(maxsize=2)
def _hann(n: int) -> np.ndarray:
    """Periodic Hann window, float32 as ``fill_hann_window(n, true)``."""
    i = np.arange(n, dtype=np.float32)
    return (0.5 * (1.0 - np.cos(np.float32(2.0 * math.pi) * i / np.float32(n)))).astype(np.float32)


def log_mel_spectrogram(samples: np.ndarray, n_mel: int, block: int = 4096) -> np.ndarray:
    """``F32[n_mel, n_frames]`` of 16 kHz ``samples`` with 30 s of silence appended (llama.cpp's
    ``log_mel_spectrogram`` for Whisper), normalized over all frames."""
    x = np.ascontiguousarray(samples, dtype=np.float32).reshape(-1)
    if x.shape[0] == 0:
        raise AudioError("the audio is empty")
    half = N_FFT // 2
    if x.shape[0] < half + 1:  # reflection needs one sample plus half a window
        x = np.concatenate([x, np.zeros(half + 1 - x.shape[0], np.float32)])
    padded = np.concatenate([x[1 : half + 1][::-1], x, np.zeros(SAMPLE_RATE * 30 + half, np.float32)])
    n_len = (padded.shape[0] - N_FFT) // HOP + 1
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP][:n_len]
    filt = mel_filters(n_mel).astype(np.float64)
    win = _hann(N_FFT)
    out = np.empty((n_len, n_mel), np.float32)
    for i in range(0, n_len, block):
        spec = np.fft.rfft(frames[i : i + block] * win, axis=1)
        power = (spec.real**2 + spec.imag**2).astype(np.float32)
        out[i : i + block] = np.log10(np.maximum(power.astype(np.float64) @ filt.T, MEL_FLOOR))
    out = np.maximum(out, out.max() - 8.0)
    return np.ascontiguousarray(((out + 4.0) / 4.0).T)


def mel_chunks(samples: np.ndarray, n_mel: int) -> list[np.ndarray]:
    """The audio's log-mel in whole 30 s windows ``F32[n_mel, 3000]`` (mtmd_audio_preprocessor_whisper)."""
    mel = log_mel_spectrogram(samples, n_mel)
    n = mel.shape[1] // CHUNK_FRAMES
    return [np.ascontiguousarray(mel[:, k * CHUNK_FRAMES : (k + 1) * CHUNK_FRAMES]) for k in range(n)]


AUDIO_FORMATS = ("wav", "mp3", "flac", "ogg", "oga", "opus", "m4a", "webm", "pcm16")
_DECODED_FORMATS = ("wav", "mp3", "flac", "ogg", "oga", "opus")


def read_input_audio(part: object, where: str, max_bytes: int = MAX_AUDIO_BYTES) -> bytes:
    """The bytes of an OpenAI ``input_audio`` content part (``{"data": base64, "format": "wav"}``)."""
    import base64
    import binascii
    from collections.abc import Mapping

    if not isinstance(part, Mapping):
        raise AudioError(f"{where}.input_audio: must be an object with 'data' (base64) and 'format'")
    data, fmt = part.get("data"), part.get("format", "wav")
    if not isinstance(data, str) or not data:
        raise AudioError(f"{where}.input_audio.data: must be a non-empty base64 string")
    if not isinstance(fmt, str) or fmt.lower() not in _DECODED_FORMATS:
        raise AudioError(
            f"{where}.input_audio.format: {fmt!r} is not supported (supported: {', '.join(_DECODED_FORMATS)})"
        )
    if data.startswith("data:"):  # a data URL where plain base64 is expected: accepted
        data = data.partition(",")[2]
    if len(data) > max_bytes * 4 // 3 + 4:
        raise AudioError(f"{where}.input_audio.data: the audio is larger than {max_bytes} bytes")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise AudioError(f"{where}.input_audio.data: invalid base64: {e}") from None
    if not is_audio(raw):
        raise AudioError(
            f"{where}.input_audio.data: not a WAV, FLAC, OGG or MP3 file (format {fmt!r}); cannot decode the audio"
        )
    return raw
