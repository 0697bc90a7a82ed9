"""mmproj files (llama.cpp's ``clip.cpp``): the ``clip.*`` hyper-parameters, the vision tower's and the
projector's weights, and ``ClipModel.encode`` (preprocessed image -> embeddings for the text model).

The keys are read as ``clip_model_loader::load_hparams`` reads them, strictly: a required key missing,
a key of the wrong type, an unknown projector type or a tensor of the wrong shape raises ``MtmdError``
naming the file and the key or tensor. Each projector type's graph lives in its own module
(``siglip.py`` for ``gemma3``) and is registered in ``PROJECTORS``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import field
from typing import Any

import numpy as np

from .._dataclass import dataclass
from ..ggml.graph import Graph
from ..ggml.sched import Scheduler
from ..ggml.tensor import Tensor
from ..model.blocks import TensorLoader, Weights
from ..model.hparams import MetaReader, ModelLoadError
from ..model.loader import ModelLoader
from .errors import MtmdError

__all__ = ["ClipHParams", "ClipModel", "PROJECTORS", "load_hparams"]

# projector type -> (load_tensors(model, tl), build(model, inp_raw) -> embeddings tensor)
PROJECTORS: dict[str, Projector] = {}


@dataclass(frozen=True)
class Projector:
    name: str
    load: Callable[[ClipModel, TensorLoader], None]
    build: Callable[[ClipModel, Tensor], Tensor]
    n_tokens: Callable[[ClipHParams, int, int], int]  # (hp, width, height) -> image tokens
    non_causal: bool = False  # mtmd_decode_use_non_causal: the image's tokens see each other
    resample: str = "bilinear"  # the preprocessing's resampling filter (image.RESAMPLE)
    stretch: bool = False  # resize to the square ignoring the aspect ratio (else: fit and pad)
    pad_color: tuple[int, int, int] = (0, 0, 0)
    # Qwen-VL style: the image's tokens take M-RoPE positions (t, h, w) and n_pos = max(rows, cols)
    mrope: bool = False
    # (model, bitmap, pad) -> F32[3, H, W] for projectors whose image size follows the image (None: fixed size)
    preprocess: Callable[[ClipModel, Any, bool], np.ndarray] | None = None


def register_projector(p: Projector) -> Projector:
    PROJECTORS[p.name] = p
    return p


@dataclass
class ClipHParams:
    projector_type: str
    image_size: int
    patch_size: int
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    projection_dim: int
    eps: float
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    ffn_op: str = "gelu_quick"  # clip.use_gelu -> "gelu", clip.use_silu -> "silu"
    n_merge: int = 0  # clip.vision.projector.scale_factor / spatial_merge_size (per projector default)
    feature_layers: tuple[int, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def n_patches_side(self) -> int:
        return self.image_size // self.patch_size


def _arr3(md: MetaReader, key: str, where: str) -> tuple[float, float, float]:
    k = f"clip.vision.{key}"
    v = md.md.get(k)
    if v is None:
        raise MtmdError(f"{where}: metadata key {k!r} is missing")
    a = np.asarray(v)
    if a.ndim != 1 or a.shape[0] < 3 or a.dtype.kind not in "fiu":
        raise MtmdError(f"{where}: metadata key {k!r} must be an array of 3 numbers, got {v!r}")
    return (float(a[0]), float(a[1]), float(a[2]))


def load_hparams(metadata: dict[str, Any], where: str) -> ClipHParams:
    """The vision hyper-parameters of an mmproj file's metadata (``clip.vision.*``)."""
    from . import (  # noqa: F401  (register them)
        gemma3nv,
        gemma4v,
        glm4v,
        internvl,
        kimik25,
        kimivl,
        lfm2,
        llama4,
        llava,
        minicpmv,
        minicpmv4_6,
        pixtral,
        qwen2vl,
        qwen3vl,
        siglip,
    )

    md = MetaReader(metadata, "clip", where=where)
    try:
        if not md.boolean("has_vision_encoder", False):
            raise MtmdError(f"{where}: mmproj has no vision encoder (clip.has_vision_encoder is not true)")
        ptype = md.string("projector_type") or md.string("vision.projector_type")
        if ptype == "qwen2.5o":  # Qwen2.5-Omni: vision and audio in one mmproj (clip.cpp's mapping)
            ptype = "qwen2.5vl_merger"
        if not ptype:
            raise MtmdError(f"{where}: metadata key 'clip.projector_type' is missing")
        if ptype not in PROJECTORS:
            raise MtmdError(
                f"{where}: projector type {ptype!r} is not supported (supported: {', '.join(sorted(PROJECTORS))})"
            )
        use_gelu, use_silu = md.boolean("use_gelu", False), md.boolean("use_silu", False)
        if use_gelu and use_silu:
            raise MtmdError(f"{where}: both clip.use_gelu and clip.use_silu are true")
        hp = ClipHParams(
            projector_type=ptype,
            image_size=md.u32("vision.image_size", required=True),
            patch_size=md.u32("vision.patch_size", required=True),
            n_embd=md.u32("vision.embedding_length", required=True),
            n_ff=md.u32("vision.feed_forward_length", required=True),
            n_layer=md.u32("vision.block_count", required=True),
            n_head=md.u32("vision.attention.head_count", required=True),
            projection_dim=md.u32("vision.projection_dim", required=True),
            eps=md.f32("vision.attention.layer_norm_epsilon", required=True),
            image_mean=_arr3(md, "image_mean", where),
            image_std=_arr3(md, "image_std", where),
            ffn_op="gelu" if use_gelu else "silu" if use_silu else "gelu_quick",
        )
        fl = md.raw("vision.feature_layer")
        if fl is not None:
            hp.feature_layers = tuple(int(x) for x in np.asarray(fl).reshape(-1))
    except ModelLoadError as e:
        raise MtmdError(str(e)) from None
    for name in ("image_size", "patch_size", "n_embd", "n_layer", "n_head"):
        if getattr(hp, name) <= 0:
            raise MtmdError(f"{where}: clip.vision hyper-parameter {name} = {getattr(hp, name)} must be > 0")
    if hp.image_size % hp.patch_size:
        raise MtmdError(
            f"{where}: image size {hp.image_size} is not a multiple of patch size {hp.patch_size}"
        )
    if hp.n_embd % hp.n_head:
        raise MtmdError(f"{where}: embedding length {hp.n_embd} is not a multiple of {hp.n_head} heads")
    if any(s == 0 for s in hp.image_std):
        raise MtmdError(f"{where}: clip.vision.image_std has a zero entry: {hp.image_std}")
    return hp


class ClipModel:
    """A loaded mmproj: hyper-parameters, weights by GGUF name (``self.w["v.blk.0.attn_q.weight"]``) and
    a scheduler that runs the encoder graph (built once per image size and reused)."""

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
        self.metadata = loader.metadata
        self.hparams = load_hparams(loader.metadata, self.path)
        self.projector = PROJECTORS[self.hparams.projector_type]
        tl = TensorLoader(loader)
        try:
            self.projector.load(self, tl)
            if loader.metadata.get("clip.has_audio_encoder", False):  # the audio half is AudioModel's
                loader.used.update(n for n in loader.tensor_index if n.startswith(("a.", "mm.a.")))
            loader.check_all_used()
        except ModelLoadError as e:
            raise MtmdError(str(e)) from None
        self.loader = loader
        self.w = Weights(tl.tensors)
        if backend:
            from ..ggml.backend import create_backend

            self.sched = Scheduler(
                create_backend(backend, **({} if backend == "numpy" else {"n_threads": n_threads}))
            )
        else:
            self.sched = Scheduler(n_threads=n_threads)
        self._graphs: dict[tuple[int, int], tuple[Graph, Tensor, Tensor]] = {}

    # -- properties -----------------------------------------------------------------------------------
    @property
    def n_mmproj_embd(self) -> int:
        """Width of the embeddings handed to the text model (clip_n_mmproj_embd)."""
        return int(self._n_mmproj_embd)

    def n_output_tokens(self, width: int, height: int) -> int:
        return self.projector.n_tokens(self.hparams, width, height)

    # -- encode ---------------------------------------------------------------------------------------
    def encode(self, pixels: np.ndarray) -> np.ndarray:
        """Embeddings ``F32[n_tokens, n_mmproj_embd]`` of one preprocessed image ``F32[3, H, W]``."""
        x = np.ascontiguousarray(pixels, dtype=np.float32)
        if x.ndim != 3 or x.shape[0] != 3:
            raise MtmdError(f"encode: the image must be F32[3, H, W], got shape {x.shape}")
        p = self.hparams.patch_size
        if x.shape[1] % p or x.shape[2] % p:
            raise MtmdError(f"encode: image {x.shape[2]}x{x.shape[1]} is not a multiple of patch size {p}")
        key = (x.shape[1], x.shape[2])
        entry = self._graphs.get(key)
        if entry is None:
            from ..ggml import ops
            from ..ggml.types import GGMLType

            inp = ops.new_tensor(GGMLType.F32, x.shape, "inp_raw")
            out = self.projector.build(self, inp)
            entry = (Graph(out), inp, out)
            self._graphs[key] = entry
        graph, inp, out = entry
        self.sched.compute(graph, {inp: x})
        return self.sched.get(out)

    def check_text_model(self, n_embd_text: int, where: str = "") -> None:
        """Refuse an mmproj whose embeddings do not fit the text model (mtmd_context's check)."""
        if self.n_mmproj_embd != n_embd_text:
            raise MtmdError(
                f"{self.path}: the mmproj makes embeddings of {self.n_mmproj_embd} values but the text model"
                f"{' ' + where if where else ''} takes {n_embd_text}; this mmproj is for another model"
            )
