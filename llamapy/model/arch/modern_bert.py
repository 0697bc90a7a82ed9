"""ModernBERT (llama.cpp's ``src/models/modern-bert.cpp``): a pre-norm encoder without biases,
LayerNorms without bias, fused QKV, neox rope with two bases (global layers ``rope.freq_base``, local
ones ``rope.freq_base_swa``), alternating attention: every ``sliding_window_pattern``-th layer
(default 3, the first one included) is global, the others see a symmetric window of
``attention.sliding_window`` tokens (|i - j| <= n_swa / 2); GeGLU feed-forward from one fused
[input | gate] projection; a final LayerNorm. Its rank head (gte-reranker-modernbert) pools the mean,
then ``cls`` dense + GELU + ``cls.norm``, then ``cls.output`` (``GraphBuilder.build_pooling``).
"""

from __future__ import annotations

import numpy as np

from ...ggml import ops
from ..blocks import GraphBuilder, Outputs, TensorLoader
from ..encoder_blocks import bert_attention, read_encoder_hparams
from ..hf import HFConvert
from ..hf_shared import bert_params, bert_tensor
from ..hparams import ROPE_NEOX, HParams, MetaReader, PoolingType
from . import Architecture, register


@register("modern-bert")
class ModernBert(Architecture):
    rank_rows = PoolingType.MEAN  # its rank head reads the mean, through cls + GELU + cls.norm
    rank_act = "gelu"

    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        read_encoder_hparams(hp, md)
        hp.rope_type = ROPE_NEOX
        if hp.n_swa > 0:
            hp.swa_type = "symmetric"
            v = md.raw("attention.sliding_window_pattern")
            if isinstance(v, (np.ndarray, list)):
                if len(v) != hp.n_layer:
                    raise md._err(
                        f"attention.sliding_window_pattern has {len(v)} entries, expected {hp.n_layer}"
                    )
                hp.swa_layers = [bool(x) for x in v]
            else:
                period = md.u32("attention.sliding_window_pattern", 3)
                hp.swa_layers = [period == 0 or il % period != 0 for il in range(hp.n_layer)]  # dense first
        else:
            hp.swa_layers = [False] * hp.n_layer

    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        n_embd = hp.n_embd
        t("token_embd.weight", (hp.n_vocab, n_embd))
        t("token_embd_norm.weight", (n_embd,))
        t("output_norm.weight", (n_embd,))
        for il in range(hp.n_layer):
            t.layer(il, "attn_norm.weight", (n_embd,), required=il != 0)  # layer 0: identity
            t.layer(il, "attn_qkv.weight", (n_embd + 2 * hp.n_embd_k_gqa(il), n_embd))
            t.layer(il, "attn_output.weight", (n_embd, n_embd))
            t.layer(il, "ffn_norm.weight", (n_embd,))
            t.layer(il, "ffn_up.weight", (2 * hp.n_ff[il], n_embd))
            t.layer(il, "ffn_down.weight", (n_embd, hp.n_ff[il]))
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        w = self.w
        x = g.cb(g.embed(w["token_embd.weight"]), "inp_embd")
        x = g.build_norm(x, w["token_embd_norm.weight"], kind="layer", name="inp_norm")
        for il, blk in enumerate(self.blocks):
            h = x
            if "attn_norm.weight" in blk:
                h = g.build_norm(x, blk["attn_norm.weight"], kind="layer", name="attn_norm", il=il)
            h = bert_attention(self, g, h, il)
            h, x = g.select_outputs(il, h, x)
            x = g.cb(ops.add(h, x), "ffn_inp", il)
            h = g.build_norm(x, blk["ffn_norm.weight"], kind="layer", name="ffn_norm", il=il)
            h = g.build_ffn(h, blk, il, act="gelu", gated=True)  # fused [input | gate]: gelu(input) * gate
            x = g.cb(ops.add(h, x), "l_out", il)
        x = g.build_norm(x, w["output_norm.weight"], kind="layer", name="final_norm_out")
        return Outputs(None, embd=x)


# ---------------------------------------------------------------------------------------------
# llamapy convert: llama.cpp's ModernBertModel (BertModel's with its own keys and a BPE vocab)


def _hf_vocab(ctx, kv) -> None:
    kv.add_add_bos_token(True)
    kv.add_add_eos_token(True)
    kv.add_add_sep_token(True)
    ctx.set_vocab("gpt2")


def _hf_params(ctx, kv) -> None:
    import gguf

    hp = ctx.hparams
    bert_params(ctx, kv)
    kv.add_sliding_window(hp["local_attention"])
    if (pattern := hp.get("global_attn_every_n_layers")) is not None:
        kv.add_sliding_window_pattern(pattern)
    kv.add_rope_scaling_type(gguf.RopeScalingType.NONE)
    kv.add_vocab_size(hp["vocab_size"])
    if act := hp.get("hidden_activation"):
        kv.add_string(f"{kv.arch}.hidden_activation", act)  # (add_hidden_act)


HF_CONVERT = HFConvert(
    "modern-bert",
    ("ModernBertModel", "ModernBertForMaskedLM", "ModernBertForSequenceClassification"),
    vocab=_hf_vocab,
    params=_hf_params,
    tensor=lambda ctx, name, data, bid: bert_tensor(ctx, name.removeprefix("model."), data, bid),
)
