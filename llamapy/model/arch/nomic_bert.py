"""nomic-bert (nomic-embed-text v1/v1.5) and nomic-bert-moe (nomic-embed-text v2 MoE), llama.cpp's
``src/models/bert.cpp`` branches: BERT's post-norm encoder with rotary positions (neox) instead of a
position table, a fused QKV projection, token type 0 added to the embeddings; the feed-forward is a
SwiGLU without biases (nomic-bert), or for nomic-bert-moe a GELU MLP with biases, and every
``moe_every_n_layers``-th layer (il % n == 1) a mixture of GELU experts (softmax routing over
``expert_count``, the top ``expert_used_count`` weights not renormalized)."""

from __future__ import annotations

import numpy as np

from ...ggml import ops
from ...ggml.tensor import Tensor
from ...ggml.types import GGMLType
from ..blocks import GraphBuilder, Outputs, TensorLoader
from ..encoder_blocks import BertArchitecture, BertLayout, build_bert, load_bert_tensors, read_encoder_hparams
from ..hf import HFConvert
from ..hf_shared import bert_params, bert_tensor
from ..hparams import ROPE_NEOX, HParams, MetaReader
from . import register


@register("nomic-bert", "nomic-bert-moe")
class NomicBert(BertArchitecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        read_encoder_hparams(hp, md)
        hp.rope_type = ROPE_NEOX
        every = md.u32("moe_every_n_layers", 0) or 0
        if hp.arch == "nomic-bert" and every:
            raise md._err("moe_every_n_layers is set: the file is nomic-bert-moe, not nomic-bert")
        if every and not hp.n_expert:
            raise md._err("moe_every_n_layers needs expert_count and expert_used_count")
        hp.expert_weights_scale = md.f32("expert_weights_scale", 0.0) or 0.0
        hp.n_ff_exp = hp.n_ff_exp or hp.n_ff[0]
        hp.moe_every_n_layers = every

    def layer_moe(self, il: int) -> bool:
        n = self.hp.moe_every_n_layers
        return n > 0 and il % n == 1

    def __init__(self, hp: HParams) -> None:
        super().__init__(hp)  # nomic-bert-moe's dense layers: a GELU MLP; nomic-bert's: SwiGLU
        self.layout = BertLayout(
            positions=False, ffn="seq" if hp.arch == "nomic-bert-moe" else "swiglu", ffn_biases=False
        )

    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        load_bert_tensors(self, t)
        for il in range(hp.n_layer):
            if self.layer_moe(il):
                t.layer(il, "ffn_gate_inp.weight", (hp.n_expert, hp.n_embd))
                t.layer(il, "ffn_up_exps.weight", (hp.n_expert, hp.n_ff_exp, hp.n_embd))
                t.layer(il, "ffn_down_exps.weight", (hp.n_expert, hp.n_embd, hp.n_ff_exp))
        self._finish_tensors(t)

    def moe_ffn(self, g: GraphBuilder, x: Tensor, il: int) -> Tensor:
        """Softmax routing, top-k weights as they are, GELU experts (llama.cpp's build_moe_ffn with
        LLM_FFN_GELU, no gate experts, norm_w false)."""
        hp, blk = self.hp, self.blocks[il]
        T, E, k = x.shape[0], hp.n_expert, hp.n_expert_used
        logits = g.cb(g.mm(blk["ffn_gate_inp.weight"], x), "ffn_moe_logits", il)
        probs = g.cb(ops.soft_max(logits), "ffn_moe_probs", il)
        ids = g.cb(ops.top_k(probs, k), "ffn_moe_topk", il)
        eye = ops.weight("moe_onehot", GGMLType.F32, (E, 1, E), np.eye(E, dtype=np.float32))
        w = g.cb(ops.mul_mat_id(eye, ops.reshape(probs, (T, 1, E)), ids), "ffn_moe_weights", il)  # [T, k, 1]
        if hp.expert_weights_scale:
            w = ops.scale(w, hp.expert_weights_scale)
        xx = ops.reshape(x, (T, 1, hp.n_embd))
        up = g.cb(ops.mul_mat_id(blk["ffn_up_exps.weight"], xx, ids), "ffn_moe_up", il)
        act = g.cb(ops.gelu(up), "ffn_moe_gelu", il)
        y = g.cb(ops.mul_mat_id(blk["ffn_down_exps.weight"], act, ids), "ffn_moe_down", il)
        y = g.cb(ops.mul(y, w), "ffn_moe_weighted", il)  # [T, k, n_embd]
        out = ops.sum_rows(ops.cont(ops.permute(y, (0, 2, 1))))
        return g.cb(ops.reshape(out, (T, hp.n_embd)), "ffn_moe_out", il)

    def build(self, g: GraphBuilder) -> Outputs:
        return build_bert(self, g)


def _nomic_hparams(hp: dict) -> dict:
    """NomicBertModel.__init__: the trained context as n_positions, and the layout it converts."""
    from ...convert.errors import ConvertError

    if hp.get("moe_every_n_layers"):
        raise ConvertError("nomic-bert-moe (moe_every_n_layers) checkpoints are not converted yet")
    npos, mtp = hp.get("n_positions"), hp.get("max_trained_positions", 2048)
    if (npos, mtp) == (8192, 2048):
        hp = {**hp, "n_positions": 2048}  # nomic-embed-text v1 / v1.5 are trained for 2048 tokens
    elif (npos, mtp) == (2048, 2048):
        hp = {**hp, "n_positions": 512}
    else:
        raise ConvertError(f"config.json: unrecognized n_positions={npos}, max_trained_positions={mtp}")
    want = {"activation_function": "swiglu", "causal": False, "qkv_proj_bias": False, "mlp_fc1_bias": False,
            "mlp_fc2_bias": False, "prenorm": False, "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
            "rotary_emb_scale_base": None}  # fmt: skip
    for k, v in want.items():
        if hp.get(k) != v:
            raise ConvertError(f"config.json: nomic-bert with {k}={hp.get(k)!r} is not supported ({v!r} is)")
    return hp


HF_CONVERT = HFConvert(
    "nomic-bert",
    ("NomicBertModel",),
    vocab="bert",
    params=bert_params,
    tensor=bert_tensor,
    adjust_hparams=_nomic_hparams,
)
