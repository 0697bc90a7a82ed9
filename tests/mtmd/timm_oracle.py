"""timm for the Gemma 3n vision oracle (transformers' Gemma3n builds its MobileNetV5 tower with timm).

timm imports ``torchvision`` at import time (``FrozenBatchNorm2d``, data transforms) but MobileNetV5 uses none
of it. The torchvision wheels this project can install are CUDA builds that do not load against the CPU torch
(``operator torchvision::nms does not exist``), and an installed-but-broken torchvision would also switch
transformers' image processors onto it. So timm is installed with ``--no-deps`` (``.ci/run``) and imported here
behind a placeholder ``torchvision`` that is present only while timm's modules import, then taken out of
``sys.modules`` again (transformers keeps seeing no torchvision).

``register_tiny_mnv5`` adds ``mobilenetv5_tiny_enc`` to timm's registry: timm's own ``MobileNetV5Encoder``
with a small ``arch_def`` of the same block kinds and layout as ``mobilenetv5_300m_enc`` (edge residuals,
universal inverted residuals with the stride on the middle depthwise conv, multi-query attention with and
without key/value downsampling, four stages fused by the MSFA), so that transformers' ``AutoModel`` builds it
from ``Gemma3nVisionConfig(architecture="mobilenetv5_tiny_enc")``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

import pytest

TINY = "mobilenetv5_tiny_enc"
# stage starts are stride 2 (llama.cpp's is_stage_start); "v2": key/value downsampled by 2
TINY_ARCH = [
    ["er_r1_k3_s2_e4_c8", "er_r1_k3_s1_e2_c8"],
    ["uir_r1_a3_k5_s2_e4_c16", "uir_r1_a5_k0_s1_e2_c16"],
    [
        "uir_r1_a5_k5_s2_e3_c24",
        "uir_r1_a0_k0_s1_e1_c24",
        "mqa_r1_k3_h2_v2_s1_d8_c24",
        "uir_r1_a0_k0_s1_e2_c24",
    ],
    ["uir_r1_a5_k5_s2_e3_c32", "mqa_r1_k3_h4_s1_d8_c32", "uir_r1_a0_k0_s1_e2_c32"],
]


class _Meta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        t = _Meta(name, (), {})
        setattr(cls, name, t)
        return t


class _Placeholder(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        t = _Meta(name, (), {})
        setattr(self, name, t)
        return t


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        m = _Placeholder(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def import_timm() -> Any:
    """timm, or a skip when it is not installed (a failure under CI, where .ci/run installs it)."""
    import os

    import transformers.utils

    transformers.utils.is_torchvision_available()  # decided (and cached) before the placeholder exists
    if "timm" in sys.modules:
        return sys.modules["timm"]
    try:
        import torchvision  # noqa: F401

        real = True
    except Exception:  # not installed, or a build that cannot load against this torch
        real = False
        for k in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
            del sys.modules[k]
    finder = None if real else _Finder()
    if finder is not None:
        sys.meta_path.insert(0, finder)
    try:
        import timm
        import timm.models.mobilenetv5  # noqa: F401
    except ImportError as e:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"timm is needed for the Gemma 3n vision oracle: {e}")
    finally:
        if finder is not None:
            sys.meta_path.remove(finder)
            for k in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
                del sys.modules[k]
    return timm


def register_tiny_mnv5() -> None:
    timm = import_timm()
    if TINY in timm.list_models(TINY):
        return
    from functools import partial

    from timm.layers import RmsNorm2d
    from timm.models._efficientnet_builder import decode_arch_def, round_channels
    from timm.models._registry import register_model
    from timm.models.mobilenetv5 import _GELU, MobileNetV5Encoder

    def mobilenetv5_tiny_enc(pretrained: bool = False, **kwargs: Any) -> Any:
        for k in (
            "num_classes",
            "global_pool",
            "features_only",
            "pretrained_cfg",
            "pretrained_cfg_overlay",
            "cache_dir",
        ):
            kwargs.pop(k, None)
        return MobileNetV5Encoder(
            block_args=decode_arch_def(TINY_ARCH),
            stem_size=8,
            fix_stem=True,
            pad_type="same",
            round_chs_fn=partial(round_channels, multiplier=1.0),
            norm_layer=RmsNorm2d,
            act_layer=_GELU,
            layer_scale_init_value=1e-5,
            **kwargs,
        )

    mobilenetv5_tiny_enc.__module__ = "timm.models.mobilenetv5"
    register_model(mobilenetv5_tiny_enc)


def timm_wrapper_patches() -> list[Any]:
    """``mock.patch`` objects under which transformers' ``TimmWrapperModel`` builds with this timm: its module
    imports timm only when transformers finds torchvision, and its constructor checks for both."""
    from unittest import mock

    import transformers.models.timm_wrapper.modeling_timm_wrapper as tw

    timm = import_timm()
    return [
        mock.patch.object(tw, "timm", timm, create=True),
        mock.patch.object(tw, "requires_backends", lambda *a, **k: None),
    ]
