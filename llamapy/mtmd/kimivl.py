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

Preprocessing is llama.cpp's ``mtmd_image_preprocessor_dyn_size`` with ``set_limit_image_tokens(8, 1024)``:
sides multiples of ``patch_size * 2`` keeping the aspect ratio (``qwen2vl.smart_resize``), bicubic, fitted and
centred on black (``kimik25.preprocess``, with the limits in ``hparams.extra``). (The official processor crops odd sides down to a multiple of 28 instead, and rescales only
above 4096 patches: the same images at sides multiple of 28 and up to 1024 tokens, other sizes differ.)
Tokens: ``<|media_start|>`` ... ``<|media_end|>``, as llama.cpp.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .audio_encoder import gelu_erf
from .clip import Projector, register_projector
from .errors import MtmdError
from .kimik25 import _n_tokens, build_moonvit, load_moonvit, merge_factor, preprocess

if TYPE_CHECKING:
    from ..ggml.tensor import Tensor
    from ..model.blocks import TensorLoader
    from .clip import ClipModel

__all__ = ["KIMIVL"]

KIMIVL = "kimivl"
MIN_TOKENS, MAX_TOKENS = 8, 1024  # llama.cpp's set_limit_image_tokens(8, 1024)
MERGER_EPS = 1e-5  # the projector's LayerNorm (HF's pre_norm, llama.cpp's hard-coded 1e-5)


def _load(m: ClipModel, t: TensorLoader) -> None:
    hp = m.hparams
    hp.n_merge = merge_factor(m)
    e, p = hp.n_embd, hp.patch_size
    hp.extra.setdefault("image_min_tokens", MIN_TOKENS)
    hp.extra.setdefault("image_max_tokens", MAX_TOKENS)
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


def _build(m: ClipModel, inp_raw: Tensor) -> Tensor:
    return build_moonvit(m, inp_raw, merger_eps=MERGER_EPS, interleaved_rope=True, act=gelu_erf)


register_projector(Projector(KIMIVL, _load, _build, _n_tokens, resample="bicubic", preprocess=preprocess))
