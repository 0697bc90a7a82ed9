"""A random EAGLE-3 head GGUF (``general.architecture = "eagle3"``) laid out as llama.cpp's converter
writes one (see ``llamapy/generation/eagle3.py``), for the tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llamapy.ggml.types import GGMLType
from llamapy.gguf.constants import GGUFValueType
from llamapy.gguf.writer import GGUFWriter


def write_head(
    path: Path,
    n_tgt: int = 64,
    layers: tuple[int, ...] = (1, 2, 3),
    n_draft: int = 100,
    seed: int = 0,
    tensors: dict[str, np.ndarray] | None = None,
    *,
    n: int = 64,
    nh: int = 4,
    nkv: int = 2,
    ff: int = 128,
    n_vocab: int = 256,
    llamacpp_layout: bool = False,
    extra_md: dict | None = None,
) -> Path:
    """A random head of hidden size ``n`` (``nh`` heads, ``nkv`` KV heads) for a target of hidden size
    ``n_tgt`` and ``n_vocab`` tokens, drafting over ``n_draft`` of them (``d2t``); ``tensors`` replace
    the random ones by name. ``llamacpp_layout``: the names llama.cpp's converter writes
    (``eagle3.target_layers``, ``blk.0.attn_norm_2.weight``) in place of the older ``extract_layers`` /
    ``hidden_norm``; ``extra_md`` more keys (a tokenizer, for llama.cpp)."""
    rng = np.random.default_rng(seed)
    hd = n // nh
    N = n

    def r(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    t: dict[str, np.ndarray] = {
        "fc.weight": r(N, 3 * n_tgt),
        "blk.0.attn_norm.weight": np.ones(N, np.float32),
        "blk.0.hidden_norm.weight": np.ones(N, np.float32),
        "blk.0.attn_q.weight": r(nh * hd, 2 * N),
        "blk.0.attn_k.weight": r(nkv * hd, 2 * N),
        "blk.0.attn_v.weight": r(nkv * hd, 2 * N),
        "blk.0.attn_output.weight": r(N, nh * hd),
        "blk.0.ffn_norm.weight": np.ones(N, np.float32),
        "blk.0.ffn_gate.weight": r(ff, N),
        "blk.0.ffn_up.weight": r(ff, N),
        "blk.0.ffn_down.weight": r(N, ff),
        "output_norm.weight": np.ones(N, np.float32),
        "output.weight": r(n_draft, N),
        "d2t": np.sort(rng.choice(n_vocab, n_draft, replace=False)).astype(np.int64),
    }
    t.update(tensors or {})
    if llamacpp_layout:
        t["blk.0.attn_norm_2.weight"] = t.pop("blk.0.hidden_norm.weight")
    w = GGUFWriter(path, arch="eagle3")
    md = {
        "eagle3.block_count": 1, "eagle3.context_length": 256, "eagle3.embedding_length": n,
        "eagle3.feed_forward_length": ff, "eagle3.attention.head_count": nh,
        "eagle3.attention.head_count_kv": nkv, "eagle3.attention.layer_norm_rms_epsilon": 1e-6,
        "eagle3.rope.freq_base": 10000.0, "eagle3.target_hidden_size": n_tgt,
    }  # fmt: skip
    w.add_metadata(md, int_type=GGUFValueType.UINT32)
    key = "eagle3.target_layers" if llamacpp_layout else "eagle3.extract_layers"
    w.add_metadata({key: [int(k) for k in layers]}, int_type=GGUFValueType.INT32)
    if extra_md:
        w.add_metadata(extra_md, int_type=GGUFValueType.UINT32)
    for name, arr in t.items():
        if name == "d2t":
            w.add_tensor(name, np.ascontiguousarray(arr, np.int64), ggml_type=GGMLType.I64)
        else:
            w.add_tensor(name, np.ascontiguousarray(arr, np.float32), ggml_type=GGMLType.F32)
    w.write()
    w.close()
    return path
