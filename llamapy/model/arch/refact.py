"""Refact (Refact-1.6B): LLaMA's layout without rope: ALiBi (max bias 8, fixed as llama.cpp does: the
files carry no key) over multi-query attention, RMS norms, a SwiGLU feed-forward, output tied to the
embeddings unless the file has ``output.weight`` (llama.cpp's ``refact``)."""

from __future__ import annotations

import math

from ..blocks import GraphBuilder, Outputs, Rope
from ..dense_blocks import DenseArchitecture, DenseLayout
from ..hparams import HParams, MetaReader
from . import register

MAX_ALIBI_BIAS = 8.0  # llama.cpp: "TODO: become GGUF KV parameter"


@register("refact")
class Refact(DenseArchitecture):
    layout = DenseLayout()  # its graph (ALiBi, no rope) is its own; the tensors are llama's

    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.f_max_alibi_bias = MAX_ALIBI_BIAS

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        return None  # ALiBi

    def build(self, g: GraphBuilder) -> Outputs:
        hp = self.hp
        x = g.embed(self.w["token_embd.weight"])
        for il, blk in enumerate(self.blocks):
            h = g.build_norm(x, blk["attn_norm.weight"], name="attn_norm", il=il)
            h = g.attention(h, blk, il, kq_scale=1.0 / math.sqrt(hp.heads(il).n_embd_head_k))
            h, x = g.select_outputs(il, h, x)
            x = g.cb(x + h, "ffn_inp", il)
            h = g.build_norm(x, blk["ffn_norm.weight"], name="ffn_norm", il=il)
            x = g.cb(x + g.build_ffn(h, blk, il), "l_out", il)
        return g.output(x, self.w["output_norm.weight"], self.output_weight())
