"""MPT: ALiBi instead of rope (a per-head linear bias on the query-key distance, slopes from
``attention.max_alibi_bias``), LayerNorms (biases optional), a fused QKV projection, a sequential
GELU MLP, output tied to the embeddings unless the file has ``output.weight``; learned position
embeddings where the file has them (llama.cpp's ``mpt``).

Not supported (refused at load, not ignored): ``attention.clamp_kqv`` (clipping of the QKV
projection) and the q/k LayerNorms (``attn_q_norm``/``attn_k_norm``) of some MPT variants."""

from __future__ import annotations

import math

from ...ggml import ops
from ..blocks import GraphBuilder, Outputs, Rope, TensorLoader
from ..hparams import HParams, MetaReader, ModelLoadError
from . import Architecture, register


@register("mpt")
class MPT(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        clamp = md.f32("attention.clamp_kqv", 0.0)
        if clamp > 0:
            raise ModelLoadError(f"{md.where}: mpt with attention.clamp_kqv = {clamp} is not supported")
        if any(hp.n_head_kv[il] != hp.n_head[il] for il in range(hp.n_layer)):
            raise ModelLoadError(f"{md.where}: mpt needs head_count_kv == head_count")

    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        n_embd, n_qkv = hp.n_embd, hp.n_embd + 2 * hp.n_embd_k_gqa(0)
        t("token_embd.weight", (hp.n_vocab, n_embd))
        t("position_embd.weight", (hp.n_ctx_train, n_embd), required=False)
        t("output_norm.weight", (n_embd,))
        t("output_norm.bias", (n_embd,), required=False)
        t("output.weight", (hp.n_vocab, n_embd), required=False)
        for il in range(hp.n_layer):
            n_ff = hp.n_ff[il]
            for name, shape, req in (
                ("attn_norm.weight", (n_embd,), True),
                ("attn_norm.bias", (n_embd,), False),
                ("attn_qkv.weight", (n_qkv, n_embd), True),
                ("attn_qkv.bias", (n_qkv,), False),
                ("attn_output.weight", (n_embd, n_embd), True),
                ("attn_output.bias", (n_embd,), False),
                ("ffn_norm.weight", (n_embd,), True),
                ("ffn_norm.bias", (n_embd,), False),
                ("ffn_up.weight", (n_ff, n_embd), True),
                ("ffn_up.bias", (n_ff,), False),
                ("ffn_down.weight", (n_embd, n_ff), True),
                ("ffn_down.bias", (n_embd,), False),
            ):
                t.layer(il, name, shape, required=req)
            for name in ("attn_q_norm.weight", "attn_k_norm.weight", "ffn_act.scales"):
                if f"blk.{il}.{name}" in t.loader.tensor_index:
                    raise ModelLoadError(f"{t.loader.path}: mpt tensor 'blk.{il}.{name}' is not supported")
        self._finish_tensors(t)

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        return None  # ALiBi (and position_embd where present)

    def build(self, g: GraphBuilder) -> Outputs:
        hp = self.hp
        x = g.embed(self.w["token_embd.weight"])
        if (pe := self.w.get("position_embd.weight")) is not None:
            x = g.cb(ops.add(x, g.cb(ops.get_rows(pe, g.inp.pos), "pos_embd")), "inpL")
        for il, blk in enumerate(self.blocks):
            h = g.build_norm(x, blk["attn_norm.weight"], blk.get("attn_norm.bias"), "layer", "attn_norm", il)
            h = g.attention(h, blk, il, kq_scale=1.0 / math.sqrt(hp.heads(il).n_embd_head_k))
            h, x = g.select_outputs(il, h, x)
            x = g.cb(x + h, "ffn_inp", il)
            h = g.build_norm(x, blk["ffn_norm.weight"], blk.get("ffn_norm.bias"), "layer", "ffn_norm", il)
            x = g.cb(x + g.build_ffn(h, blk, il, act="gelu", gated=False), "l_out", il)
        w = self.w
        return g.output(
            x,
            w["output_norm.weight"],
            self.output_weight(),
            b_norm=w.get("output_norm.bias"),
            norm_kind="layer",
        )
