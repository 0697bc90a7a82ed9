"""GLM-4.5 / GLM-4.5-Air (llama.cpp's ``glm4moe``), pre-norm decoder with q/k/v biases, optional
per-head q/k RMS norms, partial neox rotary; the first ``leading_dense_block_count`` layers dense,
the others a sigmoid-routed mixture of experts (selection on scores + ``exp_probs_b``, weights
renormalized and scaled) plus shared experts. The trailing next-token-prediction (MTP) layers are
skipped: their tensors are accepted, not loaded, and the graph runs the trunk only. The MoE pieces
DeepSeek V2/V3 share with it are in ``llamapy/model/moe_blocks.py``. GLM-4.5V's text model is this one with
M-RoPE when the file has ``rope.dimension_sections`` (neox pairs already: no q/k permutation)."""

from __future__ import annotations

from ...ggml import ops
from ..blocks import GraphBuilder, Outputs, Rope, SectionRope, TensorLoader
from ..hf import HFConvert
from ..hparams import ROPE_NEOX, HParams, MetaReader, ModelLoadError
from ..moe_blocks import GATING_SIGMOID, build_moe_layer, load_moe_layer, read_moe_routing, skip_nextn_tensors
from . import Architecture, register


@register("glm4moe")
class Glm4Moe(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX
        read_moe_routing(hp, md, GATING_SIGMOID)
        if not hp.n_ff_exp:
            raise ModelLoadError(f"{md.where}: glm4moe needs expert_feed_forward_length")
        secs = md.raw("rope.dimension_sections")  # GLM-4.5V: M-RoPE
        if secs is not None:
            s = tuple(int(x) for x in secs)
            if not 1 <= len(s) <= 4 or min(s) < 0 or not 0 < sum(s) <= hp.n_rot // 2:
                raise ModelLoadError(
                    f"{md.where}: {md.arch}.rope.dimension_sections {list(s)} must be up to 4 non-negative "
                    f"counts of rotary dim pairs, together 1..{hp.n_rot // 2} (rope.dimension_count {hp.n_rot})"
                )
            hp.rope_sections = s + (0,) * (4 - len(s))

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        r = super().layer_rope(il, n_ctx)
        if not self.hp.rope_sections or r is None:
            return r
        fields = {k: getattr(r, k) for k in r.__dataclass_fields__}
        return SectionRope(**fields, sections=self.hp.rope_sections, section_mode=ops.ROPE_MROPE)

    def layer_moe(self, il: int) -> bool:
        return il >= self.hp.n_layer_dense_lead

    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        n_embd = hp.n_embd
        t("token_embd.weight", (hp.n_vocab, n_embd))
        t("output_norm.weight", (n_embd,))
        t("output.weight", (hp.n_vocab, n_embd), required=False)
        self.qk_norm = t.loader.has("blk.0.attn_q_norm.weight")
        for il in range(hp.n_layer):
            heads = hp.heads(il)
            nq, nk, nv = heads.n_head * heads.n_embd_head_k, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il)
            t.layer(il, "attn_norm.weight", (n_embd,))
            for name, n in (("attn_q", nq), ("attn_k", nk), ("attn_v", nv)):
                t.layer(il, f"{name}.weight", (n, n_embd))
                t.layer(il, f"{name}.bias", (n,), required=False)
            t.layer(il, "attn_output.weight", (n_embd, heads.n_head * heads.n_embd_head_v))
            if self.qk_norm:
                t.layer(il, "attn_q_norm.weight", (heads.n_embd_head_k,))
                t.layer(il, "attn_k_norm.weight", (heads.n_embd_head_k,))
            t.layer(il, "post_attention_norm.weight", (n_embd,))  # the FFN's pre-norm in these files
            if self.layer_moe(il):
                load_moe_layer(self, t, il)
            else:
                t.layer(il, "ffn_gate.weight", (hp.n_ff[il], n_embd))
                t.layer(il, "ffn_up.weight", (hp.n_ff[il], n_embd))
                t.layer(il, "ffn_down.weight", (n_embd, hp.n_ff[il]))
        skip_nextn_tensors(self, t)
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        x = g.embed(self.w["token_embd.weight"])
        for il, blk in enumerate(self.blocks):
            h = g.build_norm(x, blk["attn_norm.weight"], name="attn_norm", il=il)
            h = g.attention(h, blk, il, qk_norm=self.qk_norm)
            h, x = g.select_outputs(il, h, x)
            x = g.cb(x + h, "ffn_inp", il)
            h = g.build_norm(x, blk["post_attention_norm.weight"], name="post_attn_norm", il=il)
            h = build_moe_layer(g, h, blk, il) if self.layer_moe(il) else g.build_ffn(h, blk, il)
            x = g.cb(x + h, "l_out", il)
        return g.output(x, self.w["output_norm.weight"], self.output_weight())


# ---------------------------------------------------------------------------------------------
# llamapy convert: llama.cpp's Glm4MoeModel


def _hf_vocab(ctx, kv) -> None:
    """ModelBase._set_vocab_glm: BPE; bos [gMASK], eot <|user|>, unk <|endoftext|>, eom <|observation|>."""
    ctx.set_vocab(
        "gpt2", {"bos": "[gMASK]", "eot": "<|user|>", "unk": "<|endoftext|>", "eom": "<|observation|>"}
    )


def _hf_params(ctx, kv) -> None:
    """Glm4MoeModel.set_gguf_parameters, after TextModel's: partial rope, the experts, sigmoid routing."""
    import gguf

    hp = ctx.hparams
    rope_dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    kv.add_rope_dimension_count(int(rope_dim * ctx.rope_parameters.get("partial_rotary_factor", 0.5)))
    if (n := hp.get("n_routed_experts")) is not None:
        kv.add_expert_count(n)
    if (n := hp.get("moe_intermediate_size")) is not None:
        kv.add_expert_feed_forward_length(n)
    if (n := hp.get("n_shared_experts")) is not None:
        kv.add_expert_shared_count(n)
    if (n := hp.get("first_k_dense_replace")) is not None:
        kv.add_leading_dense_block_count(n)
    kv.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    if (v := hp.get("routed_scaling_factor")) is not None:
        kv.add_expert_weights_scale(v)
    if (v := hp.get("norm_topk_prob")) is not None:
        kv.add_expert_weights_norm(v)
    if (n := hp.get("num_nextn_predict_layers")) is not None:
        kv.add_nextn_predict_layers(n)


def _hf_tensor(ctx, name, data, bid):
    if name.endswith("mlp.gate.e_score_correction_bias"):  # (not in older gguf-py tensor maps)
        return [(f"blk.{bid}.exp_probs_b.bias", data)]
    return [(name, data)]


HF_CONVERT = HFConvert(
    "glm4moe",
    ("Glm4MoeForCausalLM",),
    vocab=_hf_vocab,
    params=_hf_params,
    tensor=_hf_tensor,
    extra_blocks=lambda ctx, _names: ctx.hparams.get("num_nextn_predict_layers", 0),
)
