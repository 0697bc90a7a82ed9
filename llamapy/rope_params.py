"""RoPE parameters of a context (llama.cpp's ``llama_context_params`` rope fields: ``--rope-scaling``,
``--rope-scale``, ``--rope-freq-base``, ``--rope-freq-scale``, ``--yarn-*``; llama-cpp-python's
``Llama(rope_scaling_type=..., ...)``): their checks, and the model's hparams they give
(``rope_hparams``, as llama.cpp's ``llama_context`` makes its cparams). ``context.Context`` computes with
them; the fields are ``context.ContextParams``'."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np

from .errors import LlamapyError
from .model.hparams import HParams

__all__ = [
    "ROPE_SCALING_TYPES",
    "ContextParamError",
    "check_rope_params",
    "rope_hparams",
    "rope_scaling_name",
]


class ContextParamError(LlamapyError, ValueError):
    """A context parameter of the wrong type or out of its range."""


# llama.cpp's enum llama_rope_scaling_type (UNSPECIFIED -1: the model's)
ROPE_SCALING_TYPES = {0: "none", 1: "linear", 2: "yarn", 3: "longrope"}
_ROPE_FIELDS = ("rope_freq_base", "rope_freq_scale", "yarn_ext_factor", "yarn_attn_factor", "yarn_beta_fast",
                "yarn_beta_slow")  # fmt: skip


def rope_scaling_name(v: Any) -> str | None:
    """``rope_scaling_type`` as a name (none, linear, yarn, longrope), None for unspecified (None, -1,
    "unspecified"): the model's."""
    if v is None:
        return None
    if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
        if int(v) == -1:
            return None
        if int(v) in ROPE_SCALING_TYPES:
            return ROPE_SCALING_TYPES[int(v)]
    elif isinstance(v, str):
        name = v.strip().lower()
        if name in ("unspecified", "-1"):
            return None
        if name in ROPE_SCALING_TYPES.values():
            return name
    raise ContextParamError(
        f"rope_scaling_type {v!r} is not one of none, linear, yarn, longrope (0..3; -1 or None: the model's)"
    )


def check_rope_params(p: Any) -> None:
    """The RoPE fields of ``p`` have their types and ranges (a :class:`ContextParamError` if not)."""
    rope_scaling_name(p.rope_scaling_type)
    for name in _ROPE_FIELDS:
        v = getattr(p, name)
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise ContextParamError(f"{name} = {v!r} is not a number")
        if not np.isfinite(v):
            raise ContextParamError(f"{name} = {v!r} is not a finite number")
        if name in ("rope_freq_base", "rope_freq_scale") and v < 0:
            raise ContextParamError(f"{name} = {v!r} must be positive (0: the model's)")
    v = p.yarn_orig_ctx
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 0:
        raise ContextParamError(f"yarn_orig_ctx = {v!r} must be an integer >= 0 (0: the model's)")


def rope_hparams(hp: HParams, p: Any) -> HParams | None:
    """The model's hparams with the context's RoPE parameters, as llama.cpp's ``llama_context`` makes its
    cparams from ``llama_context_params`` (None when ``p`` sets none of them: the model's as they are).

    Unset values are the model's (freq base and scale, the scaling type, the YaRN betas, the original
    context, else the training one); ``none`` forces a freq scale of 1; an unset ext factor is 1 for yarn,
    else 0; while extrapolating (ext factor != 0) the attention factor is YaRN's magnitude
    ``(1 + 0.1 ln s) / (1 + 0.1 ln(1/freq_scale))``, cancelling the one the rope op applies (1 for a
    context extended s >= 1 times; families with their own YaRN magnitude, ``rope_yarn_log_mul``, keep
    1), else the given one (default 1); either times the file's ``rope.scaling.attn_factor``. Sliding-window
    layers keep the model's base and scale (``rope_freq_base_swa``/``rope_freq_scale_swa``), as llama.cpp's."""
    check_rope_params(p)
    stype = rope_scaling_name(p.rope_scaling_type)
    unset = (p.rope_freq_base == 0 and p.rope_freq_scale == 0 and p.yarn_orig_ctx == 0 and p.yarn_ext_factor < 0
             and p.yarn_attn_factor < 0 and p.yarn_beta_fast < 0 and p.yarn_beta_slow < 0)  # fmt: skip
    if stype is None and unset:
        return None
    stype = stype or hp.rope_scaling_type
    freq_base = float(p.rope_freq_base) if p.rope_freq_base else hp.rope_freq_base
    freq_scale = float(p.rope_freq_scale) if p.rope_freq_scale else hp.rope_freq_scale
    n_ctx_orig = int(p.yarn_orig_ctx) or hp.n_ctx_orig_yarn or hp.n_ctx_train
    if stype == "none":
        freq_scale = 1.0  # never scale if the scaling type is none
    ext = float(p.yarn_ext_factor) if p.yarn_ext_factor >= 0 else (1.0 if stype == "yarn" else 0.0)
    attn = float(p.yarn_attn_factor) if p.yarn_attn_factor >= 0 else 1.0
    if ext != 0:
        factor = 1.0 / freq_scale
        if hp.rope_yarn_log_mul:
            attn = 1.0  # (deepseek2 computes YaRN's magnitude from the freq scale itself)
        else:
            mscale = 1.0 if factor <= 1.0 else 0.1 * math.log(factor) + 1.0
            attn = mscale / (1.0 + 0.1 * math.log(factor))
    out = copy.copy(hp)
    out.rope_scaling_type = stype
    out.rope_freq_base = freq_base
    out.rope_freq_scale = freq_scale
    out.n_ctx_orig_yarn = n_ctx_orig
    out.yarn_ext_factor = ext
    out.rope_attn_factor = attn * hp.rope_attn_factor
    out.yarn_beta_fast = float(p.yarn_beta_fast) if p.yarn_beta_fast >= 0 else hp.yarn_beta_fast
    out.yarn_beta_slow = float(p.yarn_beta_slow) if p.yarn_beta_slow >= 0 else hp.yarn_beta_slow
    return out
