"""The Nemotron-H layer stack nemotron_h and nemotron_h_moe share (llama.cpp's ``src/models/nemotron-h.cpp``):
one mixer per layer after an RMS norm, with a residual: a Mamba2 mixer (neither KV heads nor a
feed-forward size), attention without rope (``head_count_kv`` > 0), or a feed-forward layer
(``load_ffn_tensors`` / ``build_ffn_layer``: the squared-ReLU MLP, which the MoE family overrides)."""

from __future__ import annotations

from ..ggml import ops
from ..ggml.tensor import Tensor
from .arch import Architecture
from .blocks import GraphBuilder, Outputs, Rope, TensorLoader, Weights
from .hparams import HParams, MetaReader
from .rs_blocks import build_mamba2, load_mamba2_hparams, load_mamba2_tensors

__all__ = ["NemotronHLayers", "relu_sqr_ffn"]


def relu_sqr_ffn(g: GraphBuilder, h: Tensor, blk: Weights, il: int, suffix: str = "") -> Tensor:
    """down(relu(up(h))^2) on the layer's ``ffn_{up,down}{suffix}`` (llama.cpp's LLM_FFN_RELU_SQR, no gate)."""
    up = ops.relu(g.cb(g.mm(blk[f"ffn_up{suffix}.weight"], h), f"ffn_up{suffix}", il))
    return g.mm(blk[f"ffn_down{suffix}.weight"], ops.mul(up, up))


class NemotronHLayers(Architecture):
    """The layer stack (not registered: ``nemotron_h`` and ``nemotron_h_moe`` are)."""

    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        rec = [kv == 0 and ff == 0 for kv, ff in zip(hp.n_head_kv, hp.n_ff, strict=True)]
        load_mamba2_hparams(hp, md, rec)

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        return None

    def layer_moe(self, il: int) -> bool:
        return False

    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        n = hp.n_embd
        t("token_embd.weight", (hp.n_vocab, n))
        t("output_norm.weight", (n,))
        t("output.weight", (hp.n_vocab, n), required=False)
        for il in range(hp.n_layer):
            t.layer(il, "attn_norm.weight", (n,))
            if hp.is_recurrent(il):
                load_mamba2_tensors(self, t, il)
            elif hp.n_head_kv[il]:
                nh, nkv, d, _ = hp.heads(il)
                t.layer(il, "attn_q.weight", (nh * d, n))
                t.layer(il, "attn_k.weight", (nkv * d, n))
                t.layer(il, "attn_v.weight", (nkv * d, n))
                t.layer(il, "attn_output.weight", (n, nh * d))
            else:
                self.load_ffn_tensors(t, il)
        self._finish_tensors(t)

    def load_ffn_tensors(self, t: TensorLoader, il: int) -> None:
        """The feed-forward layer ``il``'s tensors (the MoE variant overrides)."""
        t.layer(il, "ffn_up.weight", (self.hp.n_ff[il], self.hp.n_embd))
        t.layer(il, "ffn_down.weight", (self.hp.n_embd, self.hp.n_ff[il]))

    def build_ffn_layer(self, g: GraphBuilder, h: Tensor, blk: Weights, il: int) -> Tensor:
        """The feed-forward layer ``il``: a squared-ReLU MLP (the MoE variant overrides)."""
        return g.cb(relu_sqr_ffn(g, h, blk, il), "ffn_out", il)

    def build(self, g: GraphBuilder) -> Outputs:
        hp = self.hp
        x = g.embed(self.w["token_embd.weight"])
        for il, blk in enumerate(self.blocks):
            h = g.build_norm(x, blk["attn_norm.weight"], name="attn_norm", il=il)
            if hp.is_recurrent(il):
                h = build_mamba2(g, h, blk, il)
            elif hp.n_head_kv[il]:
                h = g.attention(h, blk, il)
            else:
                h = self.build_ffn_layer(g, h, blk, il)
            h, x = g.select_outputs(il, h, x)
            x = g.cb(ops.add(x, h), "l_out", il)
        return g.output(x, self.w["output_norm.weight"], self.output_weight())
