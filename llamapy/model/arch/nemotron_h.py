"""Nemotron-H (``nemotron_h``), Mamba2, attention and MLP layers: each layer is one mixer after an RMS norm,
with a residual: a Mamba2 mixer (layers with neither KV heads nor a feed-forward size), attention without
rope (``head_count_kv`` > 0), or a squared-ReLU MLP (``feed_forward_length`` > 0), as llama.cpp reads the
per-layer arrays."""

from __future__ import annotations

from ..nemotron_blocks import NemotronHLayers
from . import register


@register("nemotron_h")
class NemotronH(NemotronHLayers):
    """The layer stack of ``llamapy/model/nemotron_blocks.py`` with its squared-ReLU MLP layers."""
