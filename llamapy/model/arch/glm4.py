"""GLM-4 (0414), sandwich RMS norms (each sub-block's output is normed before its residual add, its
input too), partial rotary (normal mode over the first ``rope.dimension_count`` dims of each head),
q/k/v biases, a fused [gate | up] SwiGLU feed-forward; optional fused qkv.

GLM-4.1V / GLM-4.6V's text model is this one with M-RoPE: when the file has ``rope.dimension_sections``
(HF's ``mrope_section``) the rotary pairs take the t/h/w positions of image tokens section by section
(``GGML_ROPE_TYPE_MROPE``, neox pairs: llama.cpp's converter permutes the q/k rows of each head's rotary
part from GLM's adjacent pairs to neox order, ``Glm4Model.normal_to_neox``)."""

from __future__ import annotations

from ...ggml import ops
from ..blocks import GraphBuilder, Outputs, Rope, SectionRope, TensorLoader
from ..hf import HFConvert
from ..hparams import ROPE_NEOX, HParams, MetaReader, ModelLoadError
from . import Architecture, register


@register("glm4")
class Glm4(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        secs = md.raw("rope.dimension_sections")
        if secs is None:
            return
        s = tuple(int(x) for x in secs)
        if not 1 <= len(s) <= 4 or min(s) < 0 or not 0 < sum(s) <= hp.n_rot // 2:
            raise ModelLoadError(
                f"{md.where}: {md.arch}.rope.dimension_sections {list(s)} must be up to 4 non-negative "
                f"counts of rotary dim pairs, together 1..{hp.n_rot // 2} (rope.dimension_count {hp.n_rot})"
            )
        hp.rope_type = ROPE_NEOX  # M-RoPE (GLM-4.1V): neox pairs, the q/k rows permuted by the converter
        hp.rope_sections = s + (0,) * (4 - len(s))

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        r = super().layer_rope(il, n_ctx)
        if not self.hp.rope_sections or r is None:
            return r
        fields = {k: getattr(r, k) for k in r.__dataclass_fields__}
        return SectionRope(**fields, sections=self.hp.rope_sections, section_mode=ops.ROPE_MROPE)

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
