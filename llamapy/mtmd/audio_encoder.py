"""The audio half of an mmproj (llama.cpp's ``clip.cpp`` with ``clip.has_audio_encoder``): the ``clip.audio.*``
hyper-parameters, the Whisper encoder (``clip_graph_whisper_enc``) and its projectors.

The encoder takes one 30 s window of log-mel ``F32[n_mel, 3000]`` (``audio.mel_chunks``): two 1-D convolutions
(kernel 3, padding 1; the second of stride 2) each followed by GELU, learned positions, pre-norm blocks
(layer norms with bias, q/v biases and no k bias, GELU FFN), then per projector:

- ``ultravox``: the post norm, frames stacked by ``clip.audio.projector.stack_factor`` (zero-padded to a whole
  stack: ``ceil(1500 / s)`` tokens, as HF's ``StackAudioFrames``), RMS norm, linear, SwiGLU with the second half
  gated (``silu(b) * a``), RMS norm, linear. (llama.cpp counts 187 tokens for a stack of 8, one fewer than its
  graph makes.)
- ``qwen2a`` (Qwen2-Audio): 2-frame average pool, the post norm, one linear with bias: 750 tokens.
- ``voxtral``: the post norm, frames stacked by 4, linear, GELU, linear: 375 tokens, as HF's
  ``VoxtralForConditionalGeneration`` and mistral-common. (llama.cpp also average-pools Voxtral's frames
  before stacking them, 187 tokens; that is its bug ggml-org/llama.cpp#25496, not followed here.)
- ``qwen2.5o`` (Qwen2.5-Omni's audio half; the mmproj also holds a ``qwen2.5vl_merger`` vision tower): as
  ``qwen2a``, but as HF's ``Qwen2_5OmniAudioEncoder`` the window is cut into chunks of ``2 * n_window`` (200)
  frames, each convolved on its own (zero padding at its edges), given positions from 0, and attending only
  within itself. (llama.cpp runs it as ``qwen2a``, whole-window; not followed here.)

GELU is the exact (erf) one, as ``ggml_gelu_erf``; it is composed here from the graph's elementwise ops with
Abramowitz-Stegun 7.1.26 (|error| < 1.5e-7), there being no erf op. Convolutions are im2col views (one strided
view of the zero-padded input) and one ``mul_mat``. Axis order is NumPy's: time-major ``[T, C]`` inside.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from .._dataclass import dataclass
from ..ggml import ops
from ..ggml.graph import Graph
from ..ggml.sched import Scheduler
from ..ggml.tensor import Tensor
from ..ggml.types import GGMLType
from ..model.blocks import TensorLoader, Weights
from ..model.hparams import MetaReader, ModelLoadError
from ..model.loader import ModelLoader
from .audio import CHUNK_FRAMES
from .errors import MtmdError

__all__ = ["AUDIO_PROJECTORS", "AudioHParams", "AudioModel", "gelu_erf", "mmproj_modalities"]

AUDIO_PROJECTORS = ("ultravox", "qwen2a", "voxtral", "qwen2.5o")
# projector type -> (text before the audio, text after it), mtmd_context's aud_beg / aud_end
AUDIO_WRAP = {
    "qwen2a": ("<|audio_bos|>", "<|audio_eos|>"),
    "qwen2.5o": ("<|audio_bos|>", "<|audio_eos|>"),
    "voxtral": ("[BEGIN_AUDIO]", ""),
    "ultravox": ("", ""),
}


@dataclass
class AudioHParams:
    projector_type: str
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    n_mel: int
    eps: float
    stack_factor: int = 0
    n_window: int = 0  # qwen2.5o: frames are convolved and attend in chunks of 2 * n_window


def mmproj_modalities(path: str | os.PathLike) -> tuple[bool, bool]:
    """(has a vision encoder, has an audio encoder) of an mmproj file."""
    try:
        md = ModelLoader(os.fspath(path)).metadata
    except ModelLoadError as e:
        raise MtmdError(f"cannot load mmproj: {e}") from None
    has_vision, has_audio = (
        bool(md.get("clip.has_vision_encoder", False)),
        bool(md.get("clip.has_audio_encoder", False)),
    )
    vtype = md.get("clip.projector_type") or md.get("clip.vision.projector_type")
    if has_vision and vtype == "gemma3nv":
        has_audio = False  # Gemma 3n's audio half (gemma3na) is not read, as llama.cpp skips it
    return has_vision, has_audio


def load_audio_hparams(metadata: dict[str, Any], where: str) -> AudioHParams:
    md = MetaReader(metadata, "clip", where=where)
    try:
        ptype = md.string("projector_type") or md.string("audio.projector_type")
        if not ptype:
            raise MtmdError(f"{where}: metadata key 'clip.projector_type' is missing")
        if ptype not in AUDIO_PROJECTORS:
            raise MtmdError(
                f"{where}: audio projector type {ptype!r} is not supported (supported: {', '.join(AUDIO_PROJECTORS)})"
            )
        hp = AudioHParams(
            projector_type=ptype,
            n_embd=md.u32("audio.embedding_length", required=True),
            n_ff=md.u32("audio.feed_forward_length", required=True),
            n_layer=md.u32("audio.block_count", required=True),
            n_head=md.u32("audio.attention.head_count", required=True),
            n_mel=md.u32("audio.num_mel_bins", required=True),
            eps=md.f32("audio.attention.layer_norm_epsilon", required=True),
            stack_factor=md.u32("audio.projector.stack_factor", 0, required=ptype in ("ultravox", "voxtral")),
            n_window=md.u32("audio.n_window", 100) if ptype == "qwen2.5o" else 0,
        )
    except ModelLoadError as e:
        raise MtmdError(str(e)) from None
    for name in ("n_embd", "n_ff", "n_layer", "n_head", "n_mel"):
        if getattr(hp, name) <= 0:
            raise MtmdError(f"{where}: clip.audio hyper-parameter {name} = {getattr(hp, name)} must be > 0")
    if hp.n_embd % hp.n_head:
        raise MtmdError(f"{where}: audio embedding length {hp.n_embd} is not a multiple of {hp.n_head} heads")
    if ptype in ("ultravox", "voxtral") and not 0 < hp.stack_factor <= 64:
        raise MtmdError(f"{where}: clip.audio.projector.stack_factor = {hp.stack_factor} must be in 1..64")
    if hp.n_window and CHUNK_FRAMES % (2 * hp.n_window):
        raise MtmdError(f"{where}: clip.audio.n_window = {hp.n_window} does not divide the 3000-frame window")
    return hp


# -- graph pieces ---------------------------------------------------------------------------------------
_ERF_P = 0.3275911
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def gelu_erf(x: Tensor) -> Tensor:
    """``x * Phi(x)`` (exact GELU): ``0.5 x + 0.5 |x| erf(|x| / sqrt 2)``, erf by A&S 7.1.26."""
    ax = ops.add(ops.relu(x), ops.relu(ops.scale(x, -1.0)))
    u = ops.scale(ax, 1.0 / math.sqrt(2.0))
    t = ops.div(ops.scale(x, 0.0, 1.0), ops.scale(u, _ERF_P, 1.0))
    poly = ops.scale(t, _ERF_A[4])
    for a in _ERF_A[3::-1]:
        poly = ops.mul(ops.scale(poly, 1.0, a), t)
    u2 = ops.mul(u, u)
    u2 = ops.scale(ops.relu(ops.scale(u2, -1.0, 80.0)), -1.0, 80.0)  # min(u^2, 80): exp(-80) is 0 enough
    e = ops.div(ops.sigmoid(ops.scale(u2, -1.0)), ops.sigmoid(u2))  # exp(-u^2)
    erf_abs = ops.scale(ops.mul(poly, e), -1.0, 1.0)
    return ops.add(ops.scale(x, 0.5), ops.scale(ops.mul(ax, erf_abs), 0.5))


def _linear(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    y = ops.mul_mat(w, x)
    return ops.add(y, b) if b is not None else y


def _conv1d(x: Tensor, k: Tensor, b: Tensor, stride: int, n_chunks: int = 1) -> Tensor:
    """``ggml_conv_1d_ph`` (kernel 3, padding 1) of time-major ``x [T, C]`` with ``k (D, C, 3)`` -> ``[T', D]``;
    with ``n_chunks``, each of the ``n_chunks`` equal pieces of time on its own (zero padding at its edges)."""
    t_all, c = x.shape
    d = k.shape[0]
    t_in = t_all // n_chunks
    t_out = (t_in - 1) // stride + 1
    xp = ops.pad(ops.reshape(x, (n_chunks, t_in, c)), ((0, 0), (1, 1), (0, 0)))  # [n, T + 2, C]
    # (i, t, c, j) = xp[i, stride * t + j, c]
    cols = ops.view(xp, (n_chunks, t_out, c, 3), ((t_in + 2) * c * 4, stride * c * 4, 4, c * 4))
    cols = ops.reshape(ops.cont(cols), (n_chunks * t_out, c * 3))
    y = ops.mul_mat(ops.reshape(k, (d, c * 3)), cols)
    return ops.add(y, ops.reshape(b, (d,)))


def _norm(x: Tensor, w: Tensor, b: Tensor | None, eps: float) -> Tensor:
    x = ops.mul(ops.norm(x, eps), w)
    return ops.add(x, b) if b is not None else x


def _stack(x: Tensor, s: int) -> Tensor:
    """``[T, E]`` -> ``[ceil(T / s), E * s]``: ``s`` consecutive frames side by side, zero-padded at the end."""
    t, e = x.shape
    pad = -t % s
    if pad:
        x = ops.pad(x, ((0, pad), (0, 0)))
    return ops.reshape(x, ((t + pad) // s, e * s))


class AudioModel:
    """A loaded audio mmproj: hyper-parameters, ``a.*`` / ``mm.a.*`` weights and the encoder graph."""

    def __init__(self, path: str | os.PathLike, n_threads: int | None = None, backend: str | None = None):
        self.path = os.fspath(path)
        try:
            loader = ModelLoader(self.path)
        except ModelLoadError as e:
            raise MtmdError(f"cannot load mmproj: {e}") from None
        if loader.arch != "clip":
            raise MtmdError(
                f"{self.path}: not an mmproj file (general.architecture is {loader.arch!r}, expected 'clip')"
            )
        if not loader.metadata.get("clip.has_audio_encoder", False):
            raise MtmdError(f"{self.path}: mmproj has no audio encoder (clip.has_audio_encoder is not true)")
        if loader.metadata.get(
            "clip.has_vision_encoder", False
        ):  # the vision tower's tensors are ClipModel's
            loader.used.update(n for n in loader.tensor_index if not n.startswith(("a.", "mm.a.")))
        self.metadata = loader.metadata
        self.hparams = load_audio_hparams(loader.metadata, self.path)
        tl = TensorLoader(loader)
        try:
            self._load(tl)
            loader.check_all_used()
        except ModelLoadError as e:
            raise MtmdError(str(e)) from None
        self.w = Weights(tl.tensors)
        if backend:
            from ..ggml.backend import create_backend

            self.sched = Scheduler(
                create_backend(backend, **({} if backend == "numpy" else {"n_threads": n_threads}))
            )
        else:
            self.sched = Scheduler(n_threads=n_threads)
        self._graph: tuple[Graph, Tensor, Tensor] | None = None

    # -- tensors --------------------------------------------------------------------------------------
    def _load(self, t: TensorLoader) -> None:
        hp = self.hparams
        e, ff = hp.n_embd, hp.n_ff
        t("a.conv1d.1.weight", (e, hp.n_mel, 3))
        self._bias(t, "a.conv1d.1.bias", e)
        t("a.conv1d.2.weight", (e, e, 3))
        self._bias(t, "a.conv1d.2.bias", e)
        pos = t("a.position_embd.weight", None)
        if pos is None or pos.ndim != 2 or pos.shape[1] != e or pos.shape[0] < self.n_pos:
            raise MtmdError(
                f"{self.path}: tensor 'a.position_embd.weight' has shape {getattr(pos, 'shape', None)}; expected "
                f"(>= {self.n_pos}, {e})"
            )
        for il in range(hp.n_layer):
            b = f"a.blk.{il}."
            for n in ("attn_q", "attn_k", "attn_v", "attn_out"):
                t(b + n + ".weight", (e, e))
            for n in ("attn_q", "attn_v", "attn_out"):
                t(b + n + ".bias", (e,))
            t(b + "attn_k.bias", (e,), required=False)
            for n in ("ln1", "ln2"):
                t(b + n + ".weight", (e,))
                t(b + n + ".bias", (e,))
            t(b + "ffn_up.weight", (ff, e))
            t(b + "ffn_up.bias", (ff,))
            t(b + "ffn_down.weight", (e, ff))
            t(b + "ffn_down.bias", (e,))
        t("a.post_ln.weight", (e,))
        t("a.post_ln.bias", (e,))
        kind = hp.projector_type
        if kind in ("qwen2a", "qwen2.5o"):
            self._n_mmproj_embd = self._matrix(t, "mm.a.fc.weight", e)
            t("mm.a.fc.bias", (self._n_mmproj_embd,))
        else:
            n_in = e * hp.stack_factor
            if kind == "ultravox":
                t("mm.a.norm_pre.weight", (n_in,))
            mid = self._matrix(t, "mm.a.mlp.1.weight", n_in)
            if kind == "ultravox":
                if mid % 2:
                    raise MtmdError(
                        f"{self.path}: tensor 'mm.a.mlp.1.weight' has an odd {mid} rows (SwiGLU halves)"
                    )
                mid //= 2
                t("mm.a.norm_mid.weight", (mid,))
            self._n_mmproj_embd = self._matrix(t, "mm.a.mlp.2.weight", mid)

    def _bias(self, t: TensorLoader, name: str, n: int) -> None:
        b = t(name, None)
        if b is None or tuple(b.shape) not in ((n,), (n, 1)):
            raise MtmdError(
                f"{self.path}: tensor {name!r} has shape {getattr(b, 'shape', None)}; expected ({n}, 1)"
            )

    def _matrix(self, t: TensorLoader, name: str, n_in: int) -> int:
        w = t(name, None)
        if w is None or w.ndim != 2 or w.shape[1] != n_in:
            raise MtmdError(
                f"{self.path}: tensor {name!r} has shape {getattr(w, 'shape', None)}; expected (N, {n_in})"
            )
        return int(w.shape[0])

    # -- sizes ----------------------------------------------------------------------------------------
    @property
    def n_mmproj_embd(self) -> int:
        return int(self._n_mmproj_embd)

    @property
    def n_pos(self) -> int:
        """Encoder positions of one window (the stride-2 convolution halves the 3000 frames)."""
        return (CHUNK_FRAMES - 1) // 2 + 1

    @property
    def n_tokens(self) -> int:
        """Embeddings one 30 s window becomes."""
        hp, n = self.hparams, self.n_pos
        if hp.projector_type in ("qwen2a", "qwen2.5o"):
            return n // 2
        return -(-n // hp.stack_factor)

    def check_text_model(self, n_embd_text: int, where: str = "") -> None:
        if self.n_mmproj_embd != n_embd_text:
            raise MtmdError(
                f"{self.path}: the audio projector makes embeddings of {self.n_mmproj_embd} values but the text "
                f"model{' ' + where if where else ''} takes {n_embd_text}; this mmproj is for another model"
            )

    # -- graph ----------------------------------------------------------------------------------------
    def _build(self, inp: Tensor) -> Tensor:
        hp, w = self.hparams, self.w
        e, nh = hp.n_embd, hp.n_head
        dh = e // nh
        n_chunks = CHUNK_FRAMES // (2 * hp.n_window) if hp.n_window else 1
        x = ops.cont(ops.transpose(inp))  # [3000, n_mel]
        x = gelu_erf(_conv1d(x, w["a.conv1d.1.weight"], w["a.conv1d.1.bias"], 1, n_chunks))
        x = gelu_erf(_conv1d(x, w["a.conv1d.2.weight"], w["a.conv1d.2.bias"], 2, n_chunks))
        n = x.shape[0]
        per = n // n_chunks  # positions restart in each chunk
        pos = w["a.position_embd.weight"]
        pos = ops.view(pos, (1, per, e), (0, pos.strides[0], pos.strides[1]))
        x = ops.reshape(ops.add(ops.reshape(x, (n_chunks, per, e)), pos), (n, e), name="inp_pos")
        mask = None
        if n_chunks > 1:  # block-diagonal attention: each chunk sees itself
            blk = np.arange(n) // per
            m = np.where(blk[:, None] == blk[None, :], 0.0, -np.inf).astype(np.float32)
            mask = ops.weight("a.chunk_mask", GGMLType.F32, (n, n), m)
        for il in range(hp.n_layer):
            b = f"a.blk.{il}."
            cur = _norm(x, w[b + "ln1.weight"], w[b + "ln1.bias"], hp.eps)
            q = ops.reshape(_linear(cur, w[b + "attn_q.weight"], w[b + "attn_q.bias"]), (n, nh, dh))
            k = ops.reshape(_linear(cur, w[b + "attn_k.weight"], w.get(b + "attn_k.bias")), (n, nh, dh))
            v = ops.reshape(_linear(cur, w[b + "attn_v.weight"], w[b + "attn_v.bias"]), (n, nh, dh))
            a = ops.flash_attn_ext(q, k, v, mask, 1.0 / math.sqrt(dh), name=f"a_kqv-{il}")
            a = _linear(ops.reshape(a, (n, e)), w[b + "attn_out.weight"], w[b + "attn_out.bias"])
            x = ops.add(a, x)
            cur = _norm(x, w[b + "ln2.weight"], w[b + "ln2.bias"], hp.eps)
            cur = gelu_erf(_linear(cur, w[b + "ffn_up.weight"], w[b + "ffn_up.bias"]))
            x = ops.add(x, _linear(cur, w[b + "ffn_down.weight"], w[b + "ffn_down.bias"]), name=f"a_out-{il}")
        kind = hp.projector_type
        if kind in ("qwen2a", "qwen2.5o"):  # nn.AvgPool1d(2, 2) over time
            half = n // 2
            even = ops.view(x, (half, e), (2 * e * 4, 4))
            odd = ops.view(x, (half, e), (2 * e * 4, 4), offset=e * 4)
            x = ops.scale(ops.add(even, odd), 0.5)
        x = _norm(x, w["a.post_ln.weight"], w["a.post_ln.bias"], hp.eps)
        if kind in ("qwen2a", "qwen2.5o"):
            return _linear(x, w["mm.a.fc.weight"], w["mm.a.fc.bias"])
        x = _stack(x, hp.stack_factor)
        if kind == "voxtral":
            x = gelu_erf(_linear(x, w["mm.a.mlp.1.weight"]))
            return _linear(x, w["mm.a.mlp.2.weight"])
        # ultravox
        x = ops.mul(ops.rms_norm(x, 1e-6), w["mm.a.norm_pre.weight"])
        x = _linear(x, w["mm.a.mlp.1.weight"])
        rows, two_h = x.shape
        h = two_h // 2
        first = ops.view(x, (rows, h), (two_h * 4, 4))
        second = ops.view(x, (rows, h), (two_h * 4, 4), offset=h * 4)
        x = ops.swiglu(second, first)  # ultravox's SwiGLU: silu(gate = second half) * first half
        x = ops.mul(ops.rms_norm(x, 1e-6), w["mm.a.norm_mid.weight"])
        return _linear(x, w["mm.a.mlp.2.weight"])

    def encode(self, mel: np.ndarray) -> np.ndarray:
        """Embeddings ``F32[n_tokens, n_mmproj_embd]`` of one 30 s log-mel window ``F32[n_mel, 3000]``."""
        x = np.ascontiguousarray(mel, dtype=np.float32)
        want = (self.hparams.n_mel, CHUNK_FRAMES)
        if x.shape != want:
            raise MtmdError(f"encode: the audio window must be F32{list(want)}, got shape {x.shape}")
        if self._graph is None:
            inp = ops.new_tensor(GGMLType.F32, want, "inp_mel")
            out = self._build(inp)
            self._graph = (Graph(out), inp, out)
        graph, inp, out = self._graph
        self.sched.compute(graph, {inp: x})
        return self.sched.get(out)
