"""Text and images in one prompt (llama.cpp's ``mtmd.cpp`` / ``mtmd-helper.cpp``).

``MtmdContext(mmproj, text_model)`` loads the mmproj and checks it fits the text model.
``tokenize(text, bitmaps)`` splits the prompt at each media marker (``<__media__>``) into text chunks
(token ids) and image chunks (the preprocessed image, its token count and the hash of its pixels), the
model's image marker tokens around each image (gemma3: ``<start_of_image>`` ... ``<end_of_image>``;
idefics3: ``<fake_token_around_image><global-img>`` ..., and with ``clip.vision.preproc_image_size`` SmolVLM's
tiles, each ``<fake_token_around_image><row_R_col_C>`` + a tile, then the global image; pixtral: the image
(its ``[IMG_BREAK]`` rows inside the embeddings) then ``[IMG_END]``; internvl: ``<img>`` the tiles and the
overview back to back ``</img>``; lfm2: ``<|image_start|>``, for a big image
``<|img_row_R_col_C|>`` + each 512 px tile and ``<|img_thumbnail|>`` + the thumbnail, ``<|image_end|>``; mlp: none).
``eval_chunks(ctx, chunks, n_past)`` decodes them in order into a ``Context``: text in ``n_batch``
pieces, images as embeddings (``Batch.from_embd``), with non-causal attention inside the image for the
projectors that need it (gemma3: the whole image then goes in one ubatch). Qwen-VL style projectors
(``Projector.mrope``: qwen2vl_merger, qwen2.5vl_merger): ``<|vision_start|>`` ... ``<|vision_end|>``, the
image preprocessed at its own size, its tokens at M-RoPE positions ``(n_past, n_past + row, n_past + col)``
(``Batch.from_embd(mpos=)``), and the text after it at ``n_past + max(rows, cols)`` (``ImageChunk.n_pos``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import field

import numpy as np

from .._dataclass import dataclass
from ..batch import Batch
from . import llava, siglip  # noqa: F401  (register the projector types)
from .audio import AudioBitmap, AudioError, decode_audio, is_audio, mel_chunks
from .audio_encoder import AUDIO_WRAP, AudioModel, mmproj_modalities
from .clip import ClipModel
from .embd_cache import DEFAULT_CACHE_MB, EmbeddingCache, chunk_key
from .errors import MtmdError
from .image import DEFAULT_MAX_PIXELS, Bitmap, idefics3_frames, load_image, preprocess_fixed

__all__ = ["MEDIA_MARKER", "ImageChunk", "MtmdContext", "TextChunk"]

MEDIA_MARKER = "<__media__>"  # mtmd_default_marker()
# projector type -> (text before the image, text after it)
_IMAGE_WRAP = {
    "gemma3": ("<start_of_image>", "<end_of_image>"),
    "gemma3nv": ("<start_of_image>", "<end_of_image>"),  # Gemma 3n: MobileNetV5, 256 tokens (gemma3nv.py)
    "idefics3": ("<fake_token_around_image><global-img>", "<fake_token_around_image>"),  # one global image
    "pixtral": ("", "[IMG_END]"),  # [IMG_BREAK] rows are inside the embeddings (pixtral.py)
    "internvl": ("<img>", "</img>"),  # the tiles, then the overview, back to back (internvl.pieces)
    "lfm2": ("<|image_start|>", "<|image_end|>"),  # tiles + thumbnail when big (lfm2.pieces)
    "llama4": ("<|image_start|>", "<|image_end|>"),  # tiles, <|image|> + overview (llama4.pieces)
    "gemma4v": ("<|image>", "<image|>"),
    "kimik25": ("<|media_begin|>", "<|media_end|>"),
    "kimivl": ("<|media_start|>", "<|media_end|>"),
    "glm4v": ("<|begin_of_image|>", "<|end_of_image|>"),  # M-RoPE positions as Qwen-VL
}
_MROPE_WRAP = ("<|vision_start|>", "<|vision_end|>")  # Qwen-VL style projectors (Projector.mrope)


@dataclass
class TextChunk:
    tokens: list[int]

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def n_pos(self) -> int:
        return len(self.tokens)


@dataclass
class ImageChunk:
    id: str  # sha256 of the bitmap's pixels (the prompt cache's key)
    n_tokens: int
    pixels: np.ndarray  # F32[3, H, W], preprocessed
    non_causal: bool = False
    embd: np.ndarray | None = field(default=None, repr=False)  # set by MtmdContext.encode
    # M-RoPE (Projector.mrope): the merged grid, tokens row-major; token i sits at (t, h, w) =
    # (n_past, n_past + i // nx, n_past + i % nx) and the image takes max(nx, ny) positions
    mrope: bool = False
    nx: int = 0
    ny: int = 0

    @property
    def n_pos(self) -> int:
        return max(self.nx, self.ny) if self.mrope else self.n_tokens

    def mpos(self, n_past: int) -> np.ndarray:
        """int32[n_tokens, 4]: each token's (t, h, w, e) positions from ``n_past`` (M-RoPE images)."""
        row, col = np.divmod(np.arange(self.n_tokens, dtype=np.int32), max(self.nx, 1))
        out = np.zeros((self.n_tokens, 4), dtype=np.int32)
        out[:, 0], out[:, 1], out[:, 2] = n_past, n_past + row, n_past + col
        return out


class AudioChunk(ImageChunk):
    """One 30 s window of an audio clip: ``pixels`` holds its log-mel ``F32[n_mel, 3000]``."""


Chunk = TextChunk | ImageChunk


class MtmdContext:
    """The multimodal side of a model: its mmproj, image preprocessing and chunking."""

    def __init__(
        self,
        mmproj_path: str | os.PathLike,
        text_model: object,
        n_threads: int | None = None,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        image_pad: bool = True,
        backend: str | None = None,
        cache_mb: float = DEFAULT_CACHE_MB,
    ) -> None:
        if not 0 <= float(cache_mb) < 2**40:
            raise MtmdError(f"the mmproj embedding cache size must be 0 (off) or more MiB, got {cache_mb}")
        self.embd_cache = EmbeddingCache(int(float(cache_mb) * 2**20))  # encode once (embd_cache.py)
        self.n_encoded = 0  # encoder runs (cache misses that encoded)
        if not os.path.exists(os.fspath(mmproj_path)):
            raise MtmdError(f"{os.fspath(mmproj_path)}: mmproj file not found")
        has_vision, has_audio = mmproj_modalities(mmproj_path)
        self.audio = AudioModel(mmproj_path, n_threads=n_threads, backend=backend) if has_audio else None
        self.clip = (
            ClipModel(mmproj_path, n_threads=n_threads, backend=backend)
            if has_vision or not has_audio
            else None
        )
        self.model = text_model
        hp = text_model.hparams  # type: ignore[attr-defined]
        for enc in (self.clip, self.audio):
            if enc is not None:
                enc.check_text_model(hp.n_embd_inp, f"{getattr(text_model, 'path', '')}")
        self.vocab = text_model.vocab  # type: ignore[attr-defined]
        if self.vocab is None:
            raise MtmdError(
                f"{getattr(text_model, 'path', 'the text model')}: has no vocabulary; images need one"
            )
        self.max_pixels = max_pixels
        self.image_pad = image_pad
        self.image_wrap: tuple[str, str] = ("", "")
        self.audio_wrap = (
            AUDIO_WRAP.get(self.audio.hparams.projector_type, ("", "")) if self.audio else ("", "")
        )
        wraps = [self.audio_wrap]
        if self.clip is not None:
            ptype = self.clip.hparams.projector_type
            self.image_wrap = _IMAGE_WRAP.get(ptype, _MROPE_WRAP if self.clip.projector.mrope else ("", ""))
            wraps.append(self.image_wrap)
        for tok in (t for w in wraps for p in w for t in p.replace("><", ">\0<").split("\0")):
            if tok and (self.vocab is None or self.vocab.text_to_token(tok) < 0):
                raise MtmdError(
                    f"{os.fspath(mmproj_path)}: the projector needs the token {tok!r}, which the text model's "
                    "vocabulary lacks; this mmproj is for another model"
                )

    @property
    def support_vision(self) -> bool:
        return self.clip is not None

    @property
    def support_audio(self) -> bool:
        return self.audio is not None

    @property
    def decode_use_non_causal(self) -> bool:
        return self.clip is not None and bool(
            self.clip.hparams.extra.get("non_causal", self.clip.projector.non_causal)
        )

    # -- images and audio -----------------------------------------------------------------------------
    def bitmap_from_bytes(self, data: bytes, where: str = "image") -> Bitmap | AudioBitmap:
        """An image, or an audio clip (WAV, FLAC, OGG, MP3: told by its first bytes)."""
        if is_audio(data):
            if self.audio is None:
                raise AudioError(f"{where}: this model's mmproj has no audio encoder; it cannot take audio")
            return decode_audio(data, where)
        if self.clip is None:
            raise MtmdError(f"{where}: this model's mmproj has no vision encoder; it takes audio, not images")
        return load_image(data, self.max_pixels, where)

    def bitmap_from_file(self, path: str | os.PathLike) -> Bitmap | AudioBitmap:
        p = os.fspath(path)
        try:
            with open(p, "rb") as f:
                data = f.read()
        except OSError as e:
            raise MtmdError(f"{p}: cannot read the file: {e.strerror or e}") from None
        return self.bitmap_from_bytes(data, p)

    def _image_chunk(self, bmp: Bitmap) -> ImageChunk:
        hp = self.clip.hparams
        pr = self.clip.projector
        pad = self.image_pad and not pr.stretch
        if pr.preprocess is not None:  # the image's size follows the bitmap (Qwen-VL)
            px = pr.preprocess(self.clip, bmp, pad)
            n = self.clip.n_output_tokens(px.shape[2], px.shape[1])
            m = hp.patch_size * max(hp.n_merge, 1)
            nx, ny = px.shape[2] // m, px.shape[1] // m
            return ImageChunk(bmp.id, n, px, self.decode_use_non_causal, mrope=pr.mrope, nx=nx, ny=ny)
        px = preprocess_fixed(
            bmp,
            hp.image_size,
            hp.image_mean,
            hp.image_std,
            pad=pad,
            resample=pr.resample,
            pad_color=pr.pad_color,
        )
        n = self.clip.n_output_tokens(px.shape[2], px.shape[1])
        return ImageChunk(bmp.id, n, px, self.decode_use_non_causal)

    def _audio_pieces(self, bmp: AudioBitmap) -> list[str | ImageChunk]:
        """An audio clip: its marker tokens around one chunk per 30 s window (mtmd_tokenizer's audio branch)."""
        if self.audio is None:
            raise AudioError("this model's mmproj has no audio encoder; it cannot take audio")
        mels = mel_chunks(bmp.samples, self.audio.hparams.n_mel)
        n = self.audio.n_tokens
        out: list[str | ImageChunk] = [self.audio_wrap[0]]
        for k, mel in enumerate(mels):
            cid = hashlib.sha256(f"{bmp.id}:audio:{k}".encode()).hexdigest()
            out.append(AudioChunk(cid, n, mel))
        return [*out, self.audio_wrap[1]]

    def _media_pieces(self, bmp: Bitmap | AudioBitmap) -> list[str | ImageChunk]:
        """The text and image chunks one image becomes (its marker tokens around it)."""
        if isinstance(bmp, AudioBitmap):
            return self._audio_pieces(bmp)
        if self.clip is None:
            raise MtmdError("this model's mmproj has no vision encoder; it takes audio, not images")
        hp = self.clip.hparams
        beg, end = self.image_wrap
        longest = int(self.clip.metadata.get("clip.vision.preproc_image_size") or 0)
        if hp.projector_type in ("internvl", "lfm2", "llama4", "minicpmv4_6", "resampler"):  # tiles (.pieces)
            from . import internvl, lfm2, llama4, minicpmv, minicpmv4_6

            mods = {"internvl": internvl, "lfm2": lfm2, "llama4": llama4, "minicpmv4_6": minicpmv4_6,
                    "resampler": minicpmv}  # fmt: skip
            mod = mods[hp.projector_type]
            return [beg, *self._frame_chunks(bmp, mod.pieces(bmp, hp)), end]
        if hp.projector_type != "idefics3" or longest <= 0:
            return [beg, self._image_chunk(bmp), end]
        # SmolVLM's image splitting (HF Idefics3Processor): row-major tiles, then the global image
        frames, rows, cols = idefics3_frames(bmp, hp.image_size, longest, hp.image_mean, hp.image_std)
        n = self.clip.n_output_tokens(hp.image_size, hp.image_size)

        def chunk(k: int) -> ImageChunk:
            tid = bmp.id if k == len(frames) - 1 else hashlib.sha256(f"{bmp.id}:{k}".encode()).hexdigest()
            return ImageChunk(tid, n, frames[k], self.decode_use_non_causal)

        if rows == 0:
            return [beg, chunk(0), end]
        out: list[str | ImageChunk] = []
        for r in range(rows):
            for c in range(cols):
                out += [f"<fake_token_around_image><row_{r + 1}_col_{c + 1}>", chunk(r * cols + c)]
            out.append("\n")
        return [*out, "\n" + beg, chunk(len(frames) - 1), end]

    def _frame_chunks(self, bmp: Bitmap, pieces: list[str | np.ndarray]) -> list[str | ImageChunk]:
        """Texts and preprocessed frames of one image -> chunks; the last frame keyed by the image's id, the
        others by it and their index."""
        n = sum(isinstance(p, np.ndarray) for p in pieces)
        out: list[str | ImageChunk] = []
        for p in pieces:
            if isinstance(p, str):
                out.append(p)
                continue
            k = sum(isinstance(c, ImageChunk) for c in out)
            key = bmp.id if k == n - 1 else hashlib.sha256(f"{bmp.id}:{k}".encode()).hexdigest()
            nt = self.clip.n_output_tokens(p.shape[2], p.shape[1])
            out.append(ImageChunk(key, nt, p, self.decode_use_non_causal))
        return out

    # -- chunks ---------------------------------------------------------------------------------------
    def tokenize(
        self,
        text: str,
        bitmaps: Sequence[Bitmap | AudioBitmap] = (),
        add_special: bool = True,
        parse_special: bool = True,
        marker: str = MEDIA_MARKER,
    ) -> list[Chunk]:
        """``text`` with one ``marker`` per bitmap -> chunks (mtmd_tokenize)."""
        parts = text.split(marker)
        if len(parts) - 1 != len(bitmaps):
            raise MtmdError(
                f"the prompt has {len(parts) - 1} image marker(s) {marker!r} but {len(bitmaps)} image(s) or "
                "audio clip(s) were given"
            )
        pieces: list[str | ImageChunk] = [parts[0]]
        for bmp, part in zip(bitmaps, parts[1:], strict=True):
            pieces += [*self._media_pieces(bmp), part]
        merged: list[str | ImageChunk] = []  # neighbouring texts joined
        for p in pieces:
            if isinstance(p, str) and merged and isinstance(merged[-1], str):
                merged[-1] += p
            else:
                merged.append(p)
        chunks: list[Chunk] = []
        for k, p in enumerate(merged):
            if isinstance(p, ImageChunk):
                chunks.append(p)
                continue
            toks = self.vocab.tokenize(p, add_special=add_special and k == 0, parse_special=parse_special)
            if toks:
                chunks.append(TextChunk(list(toks)))
        return chunks

    def encode(self, chunk: ImageChunk) -> np.ndarray:
        """The image's embeddings ``F32[n_tokens, n_embd]`` (computed once per chunk)."""
        if chunk.embd is None:
            audio = isinstance(chunk, AudioChunk)
            key = chunk_key("audio" if audio else "image", chunk.pixels)
            e = self.embd_cache.get(key)
            if e is None:
                enc = self.audio if audio else self.clip
                assert enc is not None
                e = enc.encode(chunk.pixels)
                self.n_encoded += 1
                if e.shape[0] != chunk.n_tokens:
                    raise MtmdError(
                        f"encode: the projector made {e.shape[0]} tokens, expected {chunk.n_tokens}"
                    )
                e = self.embd_cache.put(key, e)
            chunk.embd = e
        return chunk.embd

    def eval_chunks(
        self,
        ctx: object,
        chunks: Sequence[Chunk],
        n_past: int,
        seq_id: int = 0,
        n_batch: int | None = None,
        logits_last: bool = True,
    ) -> int:
        """Decode ``chunks`` into ``ctx`` from position ``n_past``; returns the new n_past
        (mtmd_helper_eval_chunks). Logits are kept for the last position when ``logits_last``."""
        nb = int(n_batch or ctx.n_batch)  # type: ignore[attr-defined]
        for ci, ch in enumerate(chunks):
            last_chunk = ci == len(chunks) - 1
            if isinstance(ch, TextChunk):
                for i in range(0, ch.n_tokens, nb):
                    toks = ch.tokens[i : i + nb]
                    b = Batch.from_tokens(toks, pos0=n_past, seq_id=seq_id)
                    b.logits = np.zeros(len(toks), dtype=bool)
                    b.logits[-1] = logits_last and last_chunk and i + nb >= ch.n_tokens
                    ctx.decode(b)  # type: ignore[attr-defined]
                    n_past += len(toks)
            else:
                n_past = self._eval_image(ctx, ch, n_past, seq_id, nb, logits_last and last_chunk)
        return n_past

    def _eval_image(
        self, ctx: object, ch: ImageChunk, n_past: int, seq_id: int, nb: int, logits: bool
    ) -> int:
        embd = self.encode(ch)
        n = embd.shape[0]
        pos0 = n_past
        if ch.non_causal:
            n_ub = int(ctx.n_ubatch)  # type: ignore[attr-defined]
            if n > min(nb, n_ub):
                raise MtmdError(
                    f"an image of {n} tokens needs non-causal attention within one batch, but n_batch = {nb} "
                    f"and n_ubatch = {n_ub}; raise both to at least {n}"
                )
        saved = ctx.causal_attn  # type: ignore[attr-defined]
        try:
            if ch.non_causal:  # llama_set_causal_attn(ctx, false) for the image's decode
                ctx.set_causal_attn(False)  # type: ignore[attr-defined]
            for i in range(0, n, nb):
                e = embd[i : i + nb]
                if ch.mrope:  # all the image's tokens at t = pos0; h, w from their row and column
                    b = Batch.from_embd(e, seq_id=seq_id, mpos=ch.mpos(pos0)[i : i + nb])
                else:
                    b = Batch.from_embd(e, pos0=n_past, seq_id=seq_id)
                b.logits = np.zeros(len(e), dtype=bool)
                b.logits[-1] = logits and i + nb >= n
                ctx.decode(b)  # type: ignore[attr-defined]
                n_past += len(e)
        finally:
            ctx.set_causal_attn(saved)  # type: ignore[attr-defined]
        return pos0 + ch.n_pos
