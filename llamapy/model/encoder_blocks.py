"""The BERT-shaped encoder pieces bert, nomic-bert, jina-bert-v2 and modern-bert share (llama.cpp's
``src/models/bert.cpp``): the encoder hparams (``read_encoder_hparams``), the post-norm layers' tensors
(``load_bert_tensors``) and graph (``build_bert``), and the bidirectional attention (``bert_attention``)."""

from __future__ import annotations

import numpy as np

from .._dataclass import dataclass
from ..ggml import ops
from ..ggml.tensor import Tensor
from ..ggml.types import GGMLType
from .arch import Architecture
from .blocks import GraphBuilder, Outputs, TensorLoader
from .hparams import HParams, MetaReader

__all__ = [
    "BertArchitecture",
    "BertLayout",
    "bert_attention",
    "build_bert",
    "load_bert_tensors",
    "read_encoder_hparams",
]


@dataclass(frozen=True)
class BertLayout:
    """A BERT-shaped encoder's layout, read by both ``load_bert_tensors`` and ``build_bert``."""

    positions: bool = True  # learned absolute positions (position_embd)
    ffn: str = (
        "seq"  # "seq" up -> GELU -> down, "swiglu" gate/up/down, "geglu" gelu(gate) * up (gate fused in up)
    )
    ffn_biases: bool = True  # ffn_up.bias / ffn_down.bias required


class BertArchitecture(Architecture):
    """An encoder loaded and built from its ``layout`` (MoE layers: the family's ``moe_ffn``)."""

    layout: BertLayout = BertLayout()

    def load_tensors(self, t: TensorLoader) -> None:
        load_bert_tensors(self, t)
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        return build_bert(self, g)


def read_encoder_hparams(hp: HParams, md: MetaReader) -> None:
    """What every encoder family reads: non-causal attention (unless the file says otherwise), the
    token-type count of the vocabulary (``tokenizer.ggml.token_type_count``)."""
    hp.causal_attn = bool(md.boolean("attention.causal", False))
    n_types = md.md.get("tokenizer.ggml.token_type_count", 0)
    if isinstance(n_types, bool) or not isinstance(n_types, (int, np.integer)) or n_types < 0:
        raise md._err(f"metadata key 'tokenizer.ggml.token_type_count' = {n_types!r} is not a count")
    hp.n_token_types = int(n_types)


def load_bert_tensors(arch: BertArchitecture, t: TensorLoader) -> None:
    """Embeddings (+ token types, + absolute positions), their LayerNorm, and per layer: fused or
    separate q/k/v (biases optional), output projection, post-attention and post-FFN LayerNorms, and
    the FFN: ``"seq"`` (up -> GELU -> down), ``"swiglu"`` (gate, up, down), ``"moe"`` handled by the
    caller (layers where ``arch.layer_moe`` is true)."""
    hp = arch.hp
    positions, ffn, ffn_biases = arch.layout.positions, arch.layout.ffn, arch.layout.ffn_biases
    n_embd = hp.n_embd
    t("token_embd.weight", (hp.n_vocab, n_embd))
    t("token_types.weight", (hp.n_token_types, n_embd) if hp.n_token_types else None, required=False)
    if positions:
        t("position_embd.weight", (hp.n_ctx_train, n_embd))
    t("token_embd_norm.weight", (n_embd,))
    t("token_embd_norm.bias", (n_embd,))
    for il in range(hp.n_layer):
        nkv = hp.n_embd_k_gqa(il)
        if t.layer(il, "attn_qkv.weight", (n_embd + 2 * nkv, n_embd), required=False) is not None:
            t.layer(il, "attn_qkv.bias", (n_embd + 2 * nkv,), required=False)
        else:
            for name, n in (("attn_q", n_embd), ("attn_k", nkv), ("attn_v", nkv)):
                t.layer(il, f"{name}.weight", (n, n_embd))
                t.layer(il, f"{name}.bias", (n,), required=False)
        t.layer(il, "attn_output.weight", (n_embd, n_embd))
        t.layer(il, "attn_output.bias", (n_embd,), required=False)
        t.layer(il, "attn_output_norm.weight", (n_embd,))
        t.layer(il, "attn_output_norm.bias", (n_embd,))
        if not arch.layer_moe(il):
            n_ff = hp.n_ff[il]
            gate = None
            if ffn in ("swiglu", "geglu"):  # geglu: a separate gate or [gate | up] fused in ffn_up
                gate = t.layer(il, "ffn_gate.weight", (n_ff, n_embd), required=ffn == "swiglu")
            n_up = n_ff if gate is not None or ffn == "seq" else 2 * n_ff
            t.layer(il, "ffn_up.weight", (n_up, n_embd))
            t.layer(il, "ffn_up.bias", (n_up,), required=ffn_biases)
            t.layer(il, "ffn_down.weight", (n_embd, n_ff))
            t.layer(il, "ffn_down.bias", (n_embd,), required=ffn_biases or ffn == "geglu")
        t.layer(il, "layer_output_norm.weight", (n_embd,))
        t.layer(il, "layer_output_norm.bias", (n_embd,))


def type_row0(arch: Architecture) -> Tensor | None:
    """Row 0 of ``token_types.weight`` as F32[1, n_embd] (llama.cpp adds "sentence A" to every token)."""
    w = arch.w.get("token_types.weight")
    if w is None:
        return None
    ids = ops.weight("token_type_ids0", GGMLType.I32, (1,), np.zeros(1, dtype=np.int32))
    return ops.get_rows(w, ids)


def build_bert(arch: BertArchitecture, g: GraphBuilder, *, max_bias: float = 0.0) -> Outputs:
    """Token (+ type 0, + position) embeddings -> LayerNorm; per layer: x = norm(x + attn(x)),
    x = norm(x + ffn(x)); the last layer's output is the embedding (``result_embd``). ``max_bias``:
    ALiBi (jina-bert-v2)."""
    positions, ffn = arch.layout.positions, arch.layout.ffn
    x = g.embed(arch.w["token_embd.weight"])
    row0 = type_row0(arch)
    if row0 is not None:
        x = ops.add(x, row0)
    if positions:
        x = ops.add(ops.get_rows(arch.w["position_embd.weight"], g.inp.pos), x)
    x = g.cb(x, "inp_embd")
    x = g.build_norm(x, arch.w["token_embd_norm.weight"], arch.w["token_embd_norm.bias"], "layer", "inp_norm")
    for il, blk in enumerate(arch.blocks):
        h = bert_attention(arch, g, x, il, max_bias)
        h, x = g.select_outputs(il, h, x)
        x = g.build_norm(
            ops.add(h, x),
            blk["attn_output_norm.weight"],
            blk["attn_output_norm.bias"],
            "layer",
            "ffn_inp",
            il,
        )
        if arch.layer_moe(il):
            h = arch.moe_ffn(g, x, il)  # type: ignore[attr-defined]
        elif ffn == "seq":
            h = g.build_ffn(x, blk, il, act="gelu", gated=False)
        elif ffn == "swiglu":
            h = g.build_ffn(x, blk, il, act="silu", gated=True)
        else:  # "geglu" (jina-bert-v2): gelu(gate) * up, the gate fused first in ffn_up without ffn_gate
            h = g.build_ffn(x, blk, il, act="gelu", gated=True)
        x = g.build_norm(
            ops.add(h, x),
            blk["layer_output_norm.weight"],
            blk["layer_output_norm.bias"],
            "layer",
            "l_out",
            il,
        )
    return Outputs(None, embd=g.cb(x, "result_embd"))


def bert_attention(arch: Architecture, g: GraphBuilder, x: Tensor, il: int, max_bias: float = 0.0) -> Tensor:
    """Multi-head attention over the ubatch: projections (fused or not), the layer's rope if any,
    scores scaled by 1/sqrt(head size), ALiBi when ``max_bias``."""
    blk = arch.blocks[il]
    q, k, v = g.qkv(x, blk, il)
    rope = arch.layer_rope(il, g.inp.n_ctx)
    if rope is not None:
        q, k = rope.apply(q, g.inp.pos), rope.apply(k, g.inp.pos)
    q, k, v = g.cb(q, "Qcur", il), g.cb(k, "Kcur", il), g.cb(v, "Vcur", il)
    out = g.build_attn(q, k, v, il, 1.0 / float(np.sqrt(arch.hp.n_embd_head_k)), max_bias=max_bias)
    return g.cb(g.mm(blk["attn_output.weight"], out, blk.get("attn_output.bias")), "attn_out", il)
