"""LLaVA-style projectors over a CLIP ViT (llama.cpp's ``clip_graph_llava``): ``mlp`` (LLaVA 1.5:
linear, GELU, linear).

The CLIP tower: a class token before the patches, learned positions, a pre-layernorm, and the blocks up
to the feature layer (``clip.vision.feature_layer``, else all but the last: HF's
``vision_feature_layer=-2``); the class token is dropped (``vision_feature_select_strategy="default"``).
Preprocessing as llama.cpp's fixed-size one for these types: fit into the square, padded with the
CLIP mean colour (122, 116, 104), bicubic. Not done: ``ldp``/``ldpv2`` (MobileVLM: depthwise
convolutions, hardswish), llava-1.6's resolution candidates (``image_grid_pinpoints``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ggml import ops
from ..ggml.tensor import Tensor
from .clip import ClipHParams, Projector, register_projector
from .errors import MtmdError
from .siglip import _linear, build_vit, load_vit, patch_embed

if TYPE_CHECKING:
    from ..model.blocks import TensorLoader
    from .clip import ClipModel

PAD_COLOR = (122, 116, 104)


def _n_feature_layers(m: ClipModel) -> int:
    hp = m.hparams
    n = max(hp.feature_layers) if hp.feature_layers else hp.n_layer - 1
    if not 0 < n <= hp.n_layer:
        raise MtmdError(f"{m.path}: clip.vision.feature_layer {hp.feature_layers} is outside 1..{hp.n_layer}")
    if len(hp.feature_layers) > 1:
        raise MtmdError(f"{m.path}: several vision feature layers {hp.feature_layers} are not supported")
    return n


def _mlp_load(m: ClipModel, t: TensorLoader) -> None:
    hp = m.hparams
    t("v.class_embd", (hp.n_embd,))
    load_vit(m, t, pre_ln=True, post_ln=None, n_extra_pos=1)
    _n_feature_layers(m)
    w0 = t("mm.0.weight", None)
    if w0 is None or len(w0.shape) != 2 or w0.shape[1] != hp.n_embd:
        raise MtmdError(
            f"{m.path}: tensor 'mm.0.weight' has shape {getattr(w0, 'shape', None)}; expected (N, {hp.n_embd})"
        )
    t("mm.0.bias", (w0.shape[0],))
    w2 = t("mm.2.weight", None)
    if w2 is None or len(w2.shape) != 2 or w2.shape[1] != w0.shape[0]:
        raise MtmdError(
            f"{m.path}: tensor 'mm.2.weight' has shape {getattr(w2, 'shape', None)}; expected (n_embd, {w0.shape[0]})"
        )
    t("mm.2.bias", (w2.shape[0],))
    m._n_mmproj_embd = w2.shape[0]


def _mlp_build(m: ClipModel, inp_raw: Tensor) -> Tensor:
    w = m.w
    x = patch_embed(m, inp_raw)  # [P, E]
    n_p, e = x.shape
    cls = ops.reshape(w["v.class_embd"], (1, e))
    x = ops.concat(cls, x, axis=0)  # [1 + P, E]: the class token first, as CLIPVisionEmbeddings
    x = build_vit(m, x, w["v.position_embd.weight"], n_layer=_n_feature_layers(m))
    x = ops.cont(ops.view(x, (n_p, e), (4 * e, 4), offset=4 * e))  # drop the class token
    x = ops.gelu(_linear(x, w["mm.0.weight"], w["mm.0.bias"]))
    return _linear(x, w["mm.2.weight"], w["mm.2.bias"])


def _mlp_tokens(hp: ClipHParams, width: int, height: int) -> int:
    return (width // hp.patch_size) * (height // hp.patch_size)


register_projector(
    Projector("mlp", _mlp_load, _mlp_build, _mlp_tokens, resample="bicubic", pad_color=PAD_COLOR)
)
