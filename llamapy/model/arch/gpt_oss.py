"""gpt-oss (llama.cpp's ``openai-moe``, ``src/models/openai-moe-iswa.cpp``): pre-norm decoder with
biases on Q/K/V/O, a learned sink logit per head in the attention softmax, sliding-window and full
layers alternating (even layers windowed), YaRN neox rope, and a mixture of experts with a biased
router, top-k then softmax over the selected logits, per-expert biases and the clamped SwiGLU
(``swiglu_oai``: alpha 1.702, limit 7). Real files store the experts as MXFP4."""

from __future__ import annotations

import math

import numpy as np

from ..blocks import GraphBuilder, Outputs, TensorLoader
from ..hf import HFConvert
from ..hparams import ROPE_NEOX, HParams, MetaReader, ModelLoadError, swa_pattern
from . import Architecture, register


@register("gpt-oss")
class GptOss(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX
        if not hp.n_expert:
            raise ModelLoadError(f"{md.where}: gpt-oss needs expert_count > 0")
        hp.n_ff_exp = md.u32("expert_feed_forward_length", required=True)
        if not hp.n_swa:
            raise ModelLoadError(f"{md.where}: gpt-oss needs {md._key('attention.sliding_window')} > 0")
        hp.swa_layers = swa_pattern(md, hp.n_layer, 2)  # llama.cpp: set_swa_pattern(2), even layers local

    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        n_embd, n_vocab, E, n_ff = hp.n_embd, hp.n_vocab, hp.n_expert, hp.n_ff_exp
        t("token_embd.weight", (n_vocab, n_embd))
        t("output_norm.weight", (n_embd,))
        t("output.weight", (n_vocab, n_embd), required=False)
        for il in range(hp.n_layer):
            nh, _, dk, dv = hp.heads(il)
            nq, nk, nv = nh * dk, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il)
            t.layer(il, "attn_norm.weight", (n_embd,))
            t.layer(il, "post_attention_norm.weight", (n_embd,))
            for name, n in (("attn_q", nq), ("attn_k", nk), ("attn_v", nv)):
                t.layer(il, f"{name}.weight", (n, n_embd))
                t.layer(il, f"{name}.bias", (n,))
            t.layer(il, "attn_output.weight", (n_embd, nh * dv))
            t.layer(il, "attn_output.bias", (n_embd,))
            t.layer(il, "attn_sinks.weight", (nh,))
            t.layer(il, "ffn_gate_inp.weight", (E, n_embd))
            t.layer(il, "ffn_gate_inp.bias", (E,))
            for name, shape in (
                ("ffn_gate_exps", (E, n_ff, n_embd)),
                ("ffn_up_exps", (E, n_ff, n_embd)),
                ("ffn_down_exps", (E, n_embd, n_ff)),
            ):
                t.layer(il, f"{name}.weight", shape)
                t.layer(il, f"{name}.bias", shape[:2])
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        hp = self.hp
        x = g.embed(self.w["token_embd.weight"])
        for il, blk in enumerate(self.blocks):
            n = g.build_norm(x, blk["attn_norm.weight"], name="attn_norm", il=il)
            kq_scale = 1.0 / math.sqrt(hp.heads(il).n_embd_head_k)  # llama.cpp: 1/sqrt(n_rot)
            h = g.attention(n, blk, il, kq_scale=kq_scale, sinks=blk["attn_sinks.weight"])
            h, x = g.select_outputs(il, h, x)
            x = g.cb(x + h, "ffn_inp", il)
            h = g.build_norm(x, blk["post_attention_norm.weight"], name="attn_post_norm", il=il)
            h = g.build_moe_ffn(h, blk, il, False, gating="softmax_weight", act="swiglu_oai")
            x = g.cb(x + h, "l_out", il)
        return g.output(x, self.w["output_norm.weight"], self.output_weight())


# ---------------------------------------------------------------------------------------------
# llamapy convert: llama.cpp's GptOssModel (MXFP4 experts repacked bit for bit, never dequantized)


def _mxfp4_nibbles(blocks: np.ndarray) -> np.ndarray:
    """GptOssModel.transform_nibble_layout: HF's 16 bytes of a block (codes 2i, 2i+1 in the low, high
    nibble of byte i) -> ggml's block_mxfp4 qs (codes i and i+16 in the low, high nibble of byte i)."""
    lo, hi = blocks & 0x0F, blocks >> 4
    codes = np.stack([lo, hi], axis=-1).reshape(*blocks.shape[:-1], 32)
    return (codes[..., :16] | (codes[..., 16:] << 4)).astype(np.uint8)


def _mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """repack_mxfp4: (..., n_block, 16) codes + (..., n_block) exponents -> rows of 17-byte blocks."""
    out = np.concatenate([scales[..., None], _mxfp4_nibbles(blocks)], axis=-1)
    return np.ascontiguousarray(out.reshape(*out.shape[:-2], -1))


def _hf_extra(ctx):
    """GptOssModel.generate_extra_tensors: the MXFP4 experts first, in the checkpoint's order."""
    if not _is_mxfp4(ctx):
        return
    blocks = None
    for name, st in ctx.checkpoint.items():
        if name.endswith("mlp.experts.down_proj_blocks"):
            blocks = st.numpy()
        elif name.endswith("mlp.experts.down_proj_scales"):
            yield f"blk.{name.split('.')[2]}.ffn_down_exps.weight", _mxfp4(blocks, st.numpy())
        elif name.endswith("mlp.experts.gate_up_proj_blocks"):
            blocks = st.numpy()
        elif name.endswith("mlp.experts.gate_up_proj_scales"):
            sc, bid = st.numpy(), name.split(".")[2]
            yield f"blk.{bid}.ffn_gate_exps.weight", _mxfp4(blocks[:, ::2], sc[:, ::2])
            yield f"blk.{bid}.ffn_up_exps.weight", _mxfp4(blocks[:, 1::2], sc[:, 1::2])


def _hf_tensor(ctx, name, data, bid):
    """GptOssModel.modify_tensors: sinks as weights, gate/up interleaved (even rows gate, odd up), the
    unquantized experts transposed; the MXFP4 blocks and scales were written by ``_hf_extra``."""
    if name.endswith(("_blocks", "_scales")):
        return []
    if "sinks" in name:
        return [(name + ".weight", data)]
    if "down_proj" in name:
        if name.endswith("_bias"):
            return [(name.replace("down_proj_bias", "down_proj.bias"), data)]
        return [(name.replace("down_proj", "down_proj.weight"), np.swapaxes(data, -1, -2))]
    if "gate_up_proj" in name:
        if name.endswith("_bias"):
            return [(name.replace("gate_up_proj_bias", "gate_proj.bias"), data[..., ::2]),
                    (name.replace("gate_up_proj_bias", "up_proj.bias"), data[..., 1::2])]  # fmt: skip
        w = np.swapaxes(data, -1, -2)
        return [(name.replace("gate_up_proj", "gate_proj.weight"), w[:, ::2, :]),
                (name.replace("gate_up_proj", "up_proj.weight"), w[:, 1::2, :])]  # fmt: skip
    return [(name, data)]


def _hf_params(ctx, kv) -> None:
    if _is_mxfp4(ctx) and ctx.file_type in (0, 1, 32):  # F32, F16, BF16 files: MOSTLY_MXFP4_MOE
        kv.add_file_type(38)
    kv.add_sliding_window(ctx.hparams["sliding_window"])
    kv.add_expert_feed_forward_length(ctx.hparams["intermediate_size"])


def _is_mxfp4(ctx) -> bool:
    return (ctx.hparams.get("quantization_config") or {}).get("quant_method") == "mxfp4"


HF_CONVERT = HFConvert(
    "gpt-oss", ("GptOssForCausalLM",), params=_hf_params, tensor=_hf_tensor, extra_tensors=_hf_extra
)
