"""Mamba2: every layer a Mamba2 mixer, converted as llama.cpp's ``Mamba2Model``: ``A_log`` ->
``ssm_a = -exp(A_log)`` and ``D`` as ``[n_head, 1]``, the conv kernel squeezed, the gated norm's weight as
``[n_group, d_inner / n_group]``; ``head_count`` 0 (no attention)."""

from __future__ import annotations

from typing import Any

import numpy as np

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.hf_tiny import Family

_LAYER = {
    "norm.weight": "attn_norm.weight",
    "mixer.in_proj.weight": "ssm_in.weight",
    "mixer.conv1d.weight": "ssm_conv1d.weight",
    "mixer.conv1d.bias": "ssm_conv1d.bias",
    "mixer.dt_bias": "ssm_dt.bias",
    "mixer.A_log": "ssm_a",
    "mixer.D": "ssm_d",
    "mixer.norm.weight": "ssm_norm.weight",
    "mixer.out_proj.weight": "ssm_out.weight",
}
_TOP = {"backbone.embeddings.weight": "token_embd.weight", "backbone.norm_f.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}  # fmt: skip


def convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, w in sd.items():
        w = np.asarray(w, dtype=np.float32)
        if name in _TOP:
            out[_TOP[name]] = w
            continue
        il, rest = name[len("backbone.layers.") :].split(".", 1)
        if rest == "mixer.A_log":
            w = -np.exp(w).reshape(-1, 1)
        elif rest == "mixer.D":
            w = w.reshape(-1, 1)
        elif rest == "mixer.conv1d.weight":
            w = w.reshape(w.shape[0], w.shape[-1])
        elif rest == "mixer.norm.weight":
            w = w.reshape(cfg.n_groups, -1)
        out[f"blk.{il}.{_LAYER[rest]}"] = np.ascontiguousarray(w)
    return out


def metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    a = family.arch
    d_inner = cfg.num_heads * cfg.head_dim
    return {
        "general.name": f"tiny-{family.name}",
        "general.file_type": hf_tiny.FILE_TYPES[ftype],
        f"{a}.vocab_size": cfg.vocab_size,
        f"{a}.context_length": hf_tiny.N_CTX,
        f"{a}.embedding_length": cfg.hidden_size,
        f"{a}.block_count": cfg.num_hidden_layers,
        f"{a}.feed_forward_length": 0,
        f"{a}.attention.head_count": 0,
        f"{a}.attention.layer_norm_rms_epsilon": float(cfg.layer_norm_epsilon),
        f"{a}.ssm.conv_kernel": cfg.conv_kernel,
        f"{a}.ssm.inner_size": d_inner,
        f"{a}.ssm.state_size": cfg.state_size,
        f"{a}.ssm.time_step_rank": cfg.num_heads,
        f"{a}.ssm.group_count": cfg.n_groups,
    }


def _hf_model(cfg: Any) -> Any:
    """The transformers model, its ``hidden_states`` in the usual order (embeddings, each layer's output
    but the last, the final norm): Mamba2Model lists each layer's output then the final norm."""
    import torch
    import transformers

    m = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    seen: dict[str, Any] = {}
    m.backbone.embeddings.register_forward_hook(lambda mod, args, out: seen.__setitem__("emb", out))

    def fix(mod: Any, args: Any, kwargs: Any, out: Any) -> Any:
        if getattr(out, "hidden_states", None) is not None:
            hs = out.hidden_states
            out.hidden_states = (seen["emb"], *hs[:-2], hs[-1])
        return out

    m.backbone.register_forward_hook(fix, with_kwargs=True)
    return m


hf_tiny.register(
    Family(
        "mamba2",
        "mamba2",
        "Mamba2Config",
        dict(
            vocab_size=hf_tiny.N_VOCAB,
            hidden_size=64,
            num_hidden_layers=3,
            state_size=16,
            num_heads=8,
            head_dim=16,
            n_groups=2,
            expand=2,
            conv_kernel=4,
            layer_norm_epsilon=1e-6,
            tie_word_embeddings=False,
            pad_token_id=None,
            bos_token_id=None,
            eos_token_id=None,
        ),
        hf_model=_hf_model,
        convert_fn=convert,
        metadata_fn=metadata,
        f32_names=("conv1d.weight", "ssm_a", "ssm_d"),
        common_config=False,
    )
)
