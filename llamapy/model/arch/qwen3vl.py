"""Qwen3-VL's language model (``qwen3vl``; ``qwen3vlmoe``: the MoE one, Qwen3-MoE's routing), llama.cpp's
``src/models/qwen3vl.cpp``: Qwen3 (per-head q/k RMS norms) with interleaved multi-section rope (imrope,
``rope.dimension_sections``) and **deepstack**: embeddings handed in by the vision side are
``n_embd * (1 + n_deepstack_layers)`` wide (``hp.n_embd_inp``, llama.cpp's ``n_embd_inp()``); the first
``n_embd`` values are the input, and slice ``j`` (``j < n_deepstack_layers``) is added to the hidden state
after layer ``j`` (``deepstack_out-j``). Text tokens are ``n_embd`` wide and add nothing."""

from __future__ import annotations

from ...ggml import ops
from ...ggml.tensor import Tensor
from ..blocks import GraphBuilder, Outputs, Rope, SectionRope, rope_for_layer
from ..dense_blocks import DenseArchitecture, DenseLayout
from ..hparams import ROPE_NEOX, HParams, MetaReader, ModelLoadError, PoolingType
from . import register


@register("qwen3vl", "qwen3vlmoe")
class Qwen3VL(DenseArchitecture):
    layout = DenseLayout(qk_norm=True)

    def __init__(self, hp: HParams) -> None:
        super().__init__(hp)
        if hp.arch == "qwen3vl":  # a reranker's rank head reads the last token, softmax'd (as llama.cpp)
            self.rank_rows, self.rank_softmax = PoolingType.LAST, True

    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX  # the sections' mode is SectionRope's (imrope)
        secs = md.raw("rope.dimension_sections")
        if secs is None:
            raise ModelLoadError(f"{md.where}: metadata key '{md.arch}.rope.dimension_sections' is missing")
        hp.rope_sections = tuple(int(s) for s in secs)
        if len(hp.rope_sections) > 4 or min(hp.rope_sections, default=-1) < 0 or sum(hp.rope_sections) <= 0:
            raise ModelLoadError(
                f"{md.where}: {md.arch}.rope.dimension_sections {list(hp.rope_sections)} must be up to 4 "
                "non-negative counts, not all 0"
            )
        if 2 * sum(hp.rope_sections) > hp.n_rot:
            raise ModelLoadError(
                f"{md.where}: {md.arch}.rope.dimension_sections {list(hp.rope_sections)} cover "
                f"{2 * sum(hp.rope_sections)} rotary dims, more than rope.dimension_count {hp.n_rot}"
            )
        n_ds = md.u32("n_deepstack_layers", 0)
        if n_ds > hp.n_layer:
            raise ModelLoadError(
                f"{md.where}: {md.arch}.n_deepstack_layers {n_ds} is more than block_count {hp.n_layer}"
            )
        hp.n_deepstack_layers = n_ds
        hp.expert_weights_norm = hp.arch == "qwen3vlmoe"

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        r = rope_for_layer(self.hp, il)
        return SectionRope(
            **{k: getattr(r, k) for k in r.__dataclass_fields__}, sections=self.hp.rope_sections
        )

    def _deepstack(self, g: GraphBuilder, j: int) -> Tensor | None:
        """Slice ``j`` of the deepstack embeddings ``[T, n_embd]`` (None: text tokens, or no slice j)."""
        e, inp = self.hp.n_embd, g.inp.embd
        if inp is None or j >= self.hp.n_deepstack_layers or inp.shape[1] < e * (j + 2):
            return None
        return ops.cont(ops.view(inp, (inp.shape[0], e), inp.strides, (j + 1) * e * 4))

    def build(self, g: GraphBuilder) -> Outputs:
        hp, w = self.hp, self.w
        x = g.embed(w["token_embd.weight"])
        if x.shape[1] != hp.n_embd:  # image embeddings: the main part (the deepstack slices follow)
            x = g.cb(ops.cont(ops.view(x, (x.shape[0], hp.n_embd), x.strides, 0)), "inp_embd_main")
        for il, blk in enumerate(self.blocks):
            n = g.build_norm(x, blk["attn_norm.weight"], None, "rms", "attn_norm", il)
            h = g.attention(n, blk, il, qk_norm=True)
            ds = self._deepstack(g, il)
            if ds is not None:
                h, x, ds = g.select_outputs(il, h, x, ds)
            else:
                h, x = g.select_outputs(il, h, x)
            x = g.cb(x + h, "ffn_inp", il)
            h = g.build_norm(x, blk["ffn_norm.weight"], None, "rms", "ffn_norm", il)
            if self.layer_moe(il):
                h = g.build_moe_ffn(h, blk, il, hp.expert_weights_norm)
            else:
                h = g.build_ffn(h, blk, il, act="silu", gated=True)
            x = g.cb(x + h, "l_out", il)
            if ds is not None:
                x = g.cb(ops.add(x, ds), "deepstack_out", il)
        return g.output(x, w["output_norm.weight"], self.output_weight())
