"""MiMo-V2-Flash / MiMo-V2.5 (llama.cpp's ``mimo2``, ``src/models/mimo2.cpp``; transformers'
``MiMoV2FlashForCausalLM``): a pre-norm decoder whose layers are sliding-window or global by
``attention.sliding_window_pattern`` (window layers with their own KV head count, rope base
``rope.freq_base_swa`` and a learned sink logit per head), keys and queries wider than values
(``key_length`` > ``value_length``), partial neox rope, the attention output times
``attention.value_scale`` (HF scales V: the same, the output projection being linear), and a feed-forward
that is dense where the layer has no router, else a sigmoid-routed mixture of experts (selection on the
scores + ``exp_probs_b``, weights renormalized; no shared expert). Q/K/V separate or fused
(``attn_qkv``). The trailing next-token-prediction layers (``nextn_predict_layers``, three in the
released files) are not run by the trunk; :mod:`llamapy.generation.mtp` runs them as a draft."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...ggml import ops
from ..blocks import GraphBuilder, Outputs, TensorLoader
from ..hparams import ROPE_NEOX, HParams, MetaReader, ModelLoadError
from ..moe_blocks import skip_nextn_tensors
from . import Architecture, register


@register("mimo2")
class Mimo2(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX
        n_all = hp.n_layer
        pat = md.raw("attention.sliding_window_pattern")
        if pat is None or len(np.asarray(pat)) != n_all:
            raise ModelLoadError(
                f"{md.where}: mimo2 needs {md._key('attention.sliding_window_pattern')} with one entry per "
                f"block ({n_all})"
            )
        swa = [bool(x) for x in np.asarray(pat)]
        if any(swa) and not hp.n_swa:
            raise ModelLoadError(f"{md.where}: mimo2 needs {md._key('attention.sliding_window')} > 0")
        if hp.n_expert and not hp.n_ff_exp:
            raise ModelLoadError(f"{md.where}: mimo2 needs expert_feed_forward_length with experts")
        hp.f_attn_value_scale = md.f32("attention.value_scale", 0.0) or 0.0
        if hp.f_attn_value_scale == 1.0:
            hp.f_attn_value_scale = 0.0
        hp.n_layer_nextn = md.u32("nextn_predict_layers", 0) or 0
        if hp.n_layer_nextn >= n_all:
            raise md._err(f"nextn_predict_layers {hp.n_layer_nextn} must be < block_count {n_all}")
        # the MTP blocks' own heads, widths and window (llama.cpp: window layers with the window's KV heads)
        hp.nextn_layers = [
            (hp.n_head[il], hp.n_head_kv[il], hp.n_ff[il], swa[il])
            for il in range(n_all - hp.n_layer_nextn, n_all)
        ]
        n = hp.n_layer = n_all - hp.n_layer_nextn
        hp.n_head, hp.n_head_kv, hp.n_ff, hp.swa_layers = (
            hp.n_head[:n],
            hp.n_head_kv[:n],
            hp.n_ff[:n],
            swa[:n],
        )

    @staticmethod
    def mtp_hparams(hp: HParams, hp0: HParams, layer: int) -> None:
        """The one-layer MTP model's hparams: MTP block ``layer``'s heads, width and window."""
        n_head, n_head_kv, n_ff, swa = hp0.nextn_layers[layer]
        hp.n_head, hp.n_head_kv, hp.n_ff, hp.swa_layers = [n_head], [n_head_kv], [n_ff], [swa]
        hp.n_swa = hp0.n_swa

    def layer_moe(self, il: int) -> bool:
        return "ffn_gate_inp.weight" in self.blocks[il]

    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        n_embd = hp.n_embd
        t("token_embd.weight", (hp.n_vocab, n_embd))
        t("output_norm.weight", (n_embd,))
        t("output.weight", (hp.n_vocab, n_embd))
        for il in range(hp.n_layer):
            nh, _, dk, dv = hp.heads(il)
            nk, nv = hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il)
            t.layer(il, "attn_norm.weight", (n_embd,))
            if t.loader.has(f"blk.{il}.attn_qkv.weight"):
                t.layer(il, "attn_qkv.weight", (nh * dk + nk + nv, n_embd))
            else:
                t.layer(il, "attn_q.weight", (nh * dk, n_embd))
                t.layer(il, "attn_k.weight", (nk, n_embd))
                t.layer(il, "attn_v.weight", (nv, n_embd))
            t.layer(il, "attn_output.weight", (n_embd, nh * dv))
            t.layer(il, "attn_sinks.weight", (nh,), required=False)
            t.layer(il, "ffn_norm.weight", (n_embd,))
            if t.loader.has(f"blk.{il}.ffn_gate_inp.weight"):
                E, n_ff = hp.n_expert, hp.n_ff_exp
                if not E:
                    raise ModelLoadError(f"{t.loader.path}: blk.{il} has a router but expert_count is 0")
                t.layer(il, "ffn_gate_inp.weight", (E, n_embd))
                t.layer(il, "exp_probs_b.bias", (E,), required=False)
                t.layer(il, "ffn_gate_exps.weight", (E, n_ff, n_embd))
                t.layer(il, "ffn_up_exps.weight", (E, n_ff, n_embd))
                t.layer(il, "ffn_down_exps.weight", (E, n_embd, n_ff))
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
            h = attention(g, h, blk, il)
            h, x = g.select_outputs(il, h, x)
            x = g.cb(ops.add(x, h), "ffn_inp", il)
            h = g.build_norm(x, blk["ffn_norm.weight"], name="ffn_norm", il=il)
            h = ffn(self, g, h, blk, il)
            x = g.cb(ops.add(x, h), "l_out", il)
        return g.output(x, self.w["output_norm.weight"], self.output_weight())


def attention(g: GraphBuilder, h: Any, blk: Any, il: int) -> Any:
    """The layer's attention (its sinks where it has them), times ``attention.value_scale``."""
    h = g.attention(h, blk, il, sinks=blk.get("attn_sinks.weight"))
    if g.hp.f_attn_value_scale:
        h = g.cb(ops.scale(h, g.hp.f_attn_value_scale), "attn_out_scaled", il)
    return h


def ffn(arch: Architecture, g: GraphBuilder, h: Any, blk: Any, il: int) -> Any:
    """Dense SwiGLU, or sigmoid-routed experts (weights renormalized, no scale: llama.cpp's mimo2)."""
    if arch.layer_moe(il):
        return g.cb(g.build_moe_ffn(h, blk, il, True, gating="sigmoid"), "ffn_moe_out", il)
    return g.build_ffn(h, blk, il)
