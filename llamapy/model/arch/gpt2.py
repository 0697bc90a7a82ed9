"""GPT-2: learned absolute position embeddings added to the token embeddings (no rope), LayerNorm with
biases, fused QKV with biases, a sequential GELU MLP with biases, output tied to the embeddings
unless the file has ``output.weight``."""

from __future__ import annotations

from ...ggml import ops
from ..blocks import GraphBuilder, Outputs, Rope, TensorLoader
from ..hf import HFConvert
from . import Architecture, register


@register("gpt2")
class GPT2(Architecture):
    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        n_embd, n_qkv = hp.n_embd, hp.n_embd + 2 * hp.n_embd_k_gqa(0)
        t("token_embd.weight", (hp.n_vocab, n_embd))
        t("position_embd.weight", (hp.n_ctx_train, n_embd))
        t("output_norm.weight", (n_embd,))
        t("output_norm.bias", (n_embd,))
        t("output.weight", (hp.n_vocab, n_embd), required=False)
        for il in range(hp.n_layer):
            for name, shape in (
                ("attn_norm.weight", (n_embd,)),
                ("attn_norm.bias", (n_embd,)),
                ("attn_qkv.weight", (n_qkv, n_embd)),
                ("attn_qkv.bias", (n_qkv,)),
                ("attn_output.weight", (n_embd, n_embd)),
                ("attn_output.bias", (n_embd,)),
                ("ffn_norm.weight", (n_embd,)),
                ("ffn_norm.bias", (n_embd,)),
                ("ffn_up.weight", (hp.n_ff[il], n_embd)),
                ("ffn_up.bias", (hp.n_ff[il],)),
                ("ffn_down.weight", (n_embd, hp.n_ff[il])),
                ("ffn_down.bias", (n_embd,)),
            ):
                t.layer(il, name, shape)
        self._finish_tensors(t)

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        return None  # positions come from position_embd

    def build(self, g: GraphBuilder) -> Outputs:
        x = g.embed(self.w["token_embd.weight"])
        pos = g.cb(ops.get_rows(self.w["position_embd.weight"], g.inp.pos), "pos_embd")
        x = g.cb(ops.add(x, pos), "inpL")
        for il, blk in enumerate(self.blocks):
            h = g.build_norm(x, blk["attn_norm.weight"], blk["attn_norm.bias"], "layer", "attn_norm", il)
            h = g.attention(h, blk, il)
            h, x = g.select_outputs(il, h, x)
            x = g.cb(x + h, "ffn_inp", il)
            h = g.build_norm(x, blk["ffn_norm.weight"], blk["ffn_norm.bias"], "layer", "ffn_norm", il)
            x = g.cb(x + g.build_ffn(h, blk, il, act="gelu", gated=False), "l_out", il)
        w = self.w
        return g.output(
            x, w["output_norm.weight"], self.output_weight(), b_norm=w["output_norm.bias"], norm_kind="layer"
        )


def _gpt2_params(ctx, kv) -> None:
    """GPT2Model.set_gguf_parameters."""
    hp = ctx.hparams
    kv.add_block_count(ctx.block_count)
    kv.add_context_length(hp["n_ctx"])
    kv.add_embedding_length(hp["n_embd"])
    kv.add_feed_forward_length(4 * hp["n_embd"])
    kv.add_head_count(hp["n_head"])
    kv.add_layer_norm_eps(hp["layer_norm_epsilon"])
    kv.add_file_type(ctx.file_type)


def _gpt2_tensor(ctx, name, data, bid):
    """GPT2Model.modify_tensors: HF's Conv1D weights ([in, out]) transposed."""
    if name.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")):
        data = data.T
    return [(name, data)]


HF_CONVERT = HFConvert(
    "gpt2", ("GPT2LMHeadModel",), generic_params=False, params=_gpt2_params, tensor=_gpt2_tensor
)
