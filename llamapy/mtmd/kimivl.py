"""Kimi-VL vision (llama.cpp's projector type ``kimivl``, ``tools/mtmd/models/kimivl.cpp``): MoonViT at the
image's own size, pixel unshuffle 2 x 2, LayerNorm and an MLP. The network is Kimi-K2.5's (``kimik25.py``,
whose graph this module reuses) for one frame; the differences are in the file and in what the oracle, Moonshot
AI's ``modeling_kimi_vl.py``, does where llama.cpp's converter and graph do otherwise:

- q / k rows: llama.cpp's converter writes them as the checkpoint has them, in MoonViT's interleaved rope
  layout (pair ``j`` = dims ``2j, 2j+1``; the column's at even ``j``, the row's at odd ``j``), and its graph
  ropes them as if split (llama.cpp issue #15600; Kimi-K2.5's converter permutes them). Here q and k are
  reordered to the split layout in the graph before the rope, which gives the official model's attention (a
  permutation applied to both leaves their dot products unchanged).
- the position table ``v.position_embd.weight`` is ``[S*S, E]`` (the converter flattens HF's ``[S, S, E]``),
  resized to the patch grid bicubically as ``F.interpolate(mode="bicubic")`` (llama.cpp: bilinear with
  antialiasing);
- the projector's GELU is the exact (erf) one, HF's ``GELUActivation`` (llama.cpp: tanh);
- the projector's LayerNorm has eps 1e-5 (as llama.cpp and HF), the blocks
  ``clip.vision.attention.layer_norm_epsilon``.

Preprocessing is the official processor's (Moonshot AI's ``image_processing_kimi_vl.py`` with the released
``preprocessor_config.json``: ``in_token_limit`` 4096, ``pad_input`` true, mean = std = 0.5): an image of more than
4096 patches (``(w // p) * (h // p)``) is scaled by ``sqrt(4096 / patches)`` (sides ``int(side * scale)``, Pillow
bicubic), then padded with black on the right and at the bottom up to multiples of ``patch_size * 2``; sides of
512 patches or more are refused (the processor's "Exceed pos emb"). llama.cpp instead resizes every image to
sides multiples of 28 between 8 and 1024 tokens (``mtmd_image_preprocessor_dyn_size``, bicubic, centred on
black): the same pixels only for images already at multiples of 28 and within its limits. The limit is
``clip.vision.image_max_pixels / patch_size**2`` where the file has it (a release with another ``in_token_limit``).
Tokens: ``<|media_start|>`` ... ``<|media_end|>``, as llama.cpp.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from .audio_encoder import gelu_erf
from .clip import Projector, register_projector
from .errors import MtmdError
from .image import Bitmap, _normalize, _resize
from .kimik25 import _n_tokens, build_moonvit, load_moonvit, merge_factor

if TYPE_CHECKING:
    from ..ggml.tensor import Tensor
    from ..model.blocks import TensorLoader
    from .clip import ClipModel

__all__ = ["KIMIVL", "official_size", "preprocess"]

KIMIVL = "kimivl"
IN_TOKEN_LIMIT = 4096  # patches before the merge (the released preprocessor_config.json's in_token_limit)
MAX_SIDE_PATCHES = (
    512  # MoonViT's rope table (Rope2DPosEmb(..., 512, 512)): the processor refuses 512 and more
)
MERGER_EPS = 1e-5  # the projector's LayerNorm (HF's pre_norm, llama.cpp's hard-coded 1e-5)


def _load(m: ClipModel, t: TensorLoader) -> None:
    hp = m.hparams
    hp.n_merge = merge_factor(m)
    e, p = hp.n_embd, hp.patch_size
    hi = m.metadata.get(
        "clip.vision.image_max_pixels", 0
    )  # in_token_limit * p * p where a converter writes it
    hp.extra["in_token_limit"] = max(hi // (p * p), 1) if isinstance(hi, int) and hi > 0 else IN_TOKEN_LIMIT
    t("v.patch_embd.weight", (e, 3, p, p))
    t("v.patch_embd.bias", (e,), required=False)
    tab = t("v.position_embd.weight", None)
    shape = None if tab is None else tuple(tab.shape)
    side = math.isqrt(shape[0]) if shape and len(shape) == 2 else 0
    if shape is None or len(shape) != 2 or shape[1] != e or side * side != shape[0]:
        raise MtmdError(f"{m.path}: tensor 'v.position_embd.weight' has shape {shape}; "
                        f"expected (side * side, {e}): Kimi-VL's square position table, flattened")  # fmt: skip
    hp.extra["pos_hw"] = (side, side)
    load_moonvit(m, t)


def official_size(w: int, h: int, p: int, k: int, limit: int = IN_TOKEN_LIMIT) -> tuple[int, int, int, int]:
    """``(rw, rh, pw, ph)``: the size the image is resized to and the padded size (see the module docstring)."""
    n = (w // p) * (h // p)
    if n > limit:
        s = math.sqrt(limit / n)
        w, h = int(w * s), int(h * s)
    a = p * k
    return w, h, -(-w // a) * a, -(-h // a) * a


def preprocess(m: ClipModel, bmp: Bitmap, pad: bool) -> np.ndarray:
    """``F32[3, H, W]``: the official processor's rescale and bottom/right padding (``pad`` is not used: the
    released processor always pads)."""
    hp = m.hparams
    p, k = hp.patch_size, hp.n_merge
    rw, rh, pw, ph = official_size(bmp.width, bmp.height, p, k, hp.extra["in_token_limit"])
    if rw < 1 or rh < 1 or pw // p >= MAX_SIDE_PATCHES or ph // p >= MAX_SIDE_PATCHES:
        raise MtmdError(
            f"image of {bmp.width}x{bmp.height} is too elongated for Kimi-VL: {pw}x{ph} px after the resize, "
            f"and a side may have at most {MAX_SIDE_PATCHES - 1} patches of {p} px"
        )
    img = np.zeros((ph, pw, 3), dtype=np.uint8)
    img[:rh, :rw] = _resize(bmp.data, rw, rh, "bicubic")
    return _normalize(img, hp.image_mean, hp.image_std)


def _build(m: ClipModel, inp_raw: Tensor) -> Tensor:
    return build_moonvit(m, inp_raw, merger_eps=MERGER_EPS, interleaved_rope=True, act=gelu_erf)


register_projector(Projector(KIMIVL, _load, _build, _n_tokens, resample="bicubic", preprocess=preprocess))
