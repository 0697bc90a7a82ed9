"""GLM-4 (0414), sandwich RMS norms (each sub-block's output is normed before its residual add, its
input too), partial rotary (normal mode over the first ``rope.dimension_count`` dims of each head),
q/k/v biases, a fused [gate | up] SwiGLU feed-forward; optional fused qkv."""

from __future__ import annotations

from ..blocks import GraphBuilder, Outputs, TensorLoader
from ..hf import HFConvert
from . import Architecture, register


@register("glm4")
class Glm4(Architecture):
    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        n_embd = hp.n_embd
        t("token_embd.weight", (hp.n_vocab, n_embd))
        t("output_norm.weight", (n_embd,))
        t("output.weight", (hp.n_vocab, n_embd), required=False)
        for il in range(hp.n_layer):
            heads = hp.heads(il)
            nq, nk, nv = heads.n_head * heads.n_embd_head_k, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il)
            t.layer(il, "attn_norm.weight", (n_embd,))
            if t.layer(il, "attn_qkv.weight", (nq + nk + nv, n_embd), required=False) is not None:
                t.layer(il, "attn_qkv.bias", (nq + nk + nv,), required=False)
            else:
                for name, n in (("attn_q", nq), ("attn_k", nk), ("attn_v", nv)):
                    t.layer(il, f"{name}.weight", (n, n_embd))
                    t.layer(il, f"{name}.bias", (n,), required=False)
            t.layer(il, "attn_output.weight", (n_embd, heads.n_head * heads.n_embd_head_v))
            t.layer(il, "post_attention_norm.weight", (n_embd,))
            t.layer(il, "ffn_norm.weight", (n_embd,))
            t.layer(il, "ffn_up.weight", (2 * hp.n_ff[il], n_embd))  # [gate | up]
            t.layer(il, "ffn_down.weight", (n_embd, hp.n_ff[il]))
            t.layer(il, "post_ffw_norm.weight", (n_embd,))
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        x = g.embed(self.w["token_embd.weight"])
        for il, blk in enumerate(self.blocks):
            h = g.build_norm(x, blk["attn_norm.weight"], name="attn_norm", il=il)
            h = g.attention(h, blk, il)
            h, x = g.select_outputs(il, h, x)
            h = g.build_norm(h, blk["post_attention_norm.weight"], name="post_attn_norm", il=il)
            x = g.cb(x + h, "ffn_inp", il)
            h = g.build_norm(x, blk["ffn_norm.weight"], name="ffn_norm", il=il)
            h = g.build_ffn(h, blk, il, act="silu")  # no ffn_gate: the fused up's first half is the gate
            h = g.build_norm(h, blk["post_ffw_norm.weight"], name="post_mlp_norm", il=il)
            x = g.cb(x + h, "l_out", il)
        return g.output(x, self.w["output_norm.weight"], self.output_weight())


def _glm4_vocab(ctx, kv) -> None:
    """Glm4Model.set_vocab: BPE; eos, unk and bos <|endoftext|>, eot <|user|> (where the files set none)."""
    eot = "<|endoftext|>"
    ctx.set_vocab("gpt2", {"eos": eot, "eot": "<|user|>", "unk": eot, "bos": eot})


def _glm4_params(ctx, kv) -> None:
    """Glm4Model.set_gguf_parameters: rope over a part of the head (half by default)."""
    hp = ctx.hparams
    rope_dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    kv.add_rope_dimension_count(int(rope_dim * ctx.rope_parameters.get("partial_rotary_factor", 0.5)))


HF_CONVERT = HFConvert("glm4", ("Glm4ForCausalLM",), vocab=_glm4_vocab, params=_glm4_params)
