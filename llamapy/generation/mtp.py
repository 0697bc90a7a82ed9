"""Speculative decoding from the model itself: its next-token-prediction (NextN / MTP) layer as the
draft (llama.cpp's ``--spec-type draft-mtp``; ``Llama(draft_model="mtp")``).

GLM-4.5 (``glm4moe``), DeepSeek V3 (``deepseek2``), Qwen3.5 (``qwen35``/``qwen35moe``) and Qwen3-Next
(``qwen3next``) files carry,
after the trunk, a block ``blk.{n_layer}`` with ``nextn.eh_proj``, ``nextn.enorm``, ``nextn.hnorm``
(and optionally ``nextn.shared_head_norm`` / ``nextn.shared_head_head``; else the model's output norm
and head). At position ``p`` it reads the token ``t_p`` and the target's normed last hidden state
``h_{p-1}`` (what its head turns into logits, llama.cpp's ``h_nextn``)::

    x = eh_proj([enorm(embed(t_p)), hnorm(h_{p-1})]);  x = block(x);  h' = head_norm(x)
    logits(t_{p+1}) = head(h')

as llama.cpp's ``graph_mtp`` (src/models/glm4-moe.cpp, deepseek2.cpp, qwen35.cpp, qwen3next.cpp; the
hybrids' MTP block is a gated full-attention layer, without recurrent state). The block runs in
its own :class:`~llamapy.context.Context` over a one-layer model (:class:`MtpModel`) with its own KV
cache; its input is an embeddings batch of ``[embed(t_p) | h_{p-1}]`` rows.

:class:`MtpDraft` is a draft model in the ``draft(input_ids) -> token ids`` sense of
:mod:`.speculative`. :func:`~.loop.generate` binds it to the target's :class:`TokenSequence`
(:meth:`MtpDraft.bind`), which then hands it the hidden state of every token the target evaluates
(all prompt tokens included). Each call first catches the MTP cache up on the tokens the target has
confirmed (pairing ``t_p`` with the target's ``h_{p-1}``), then drafts greedily: the sampled token with
the target's last hidden state, then each guess with the MTP's own ``h'`` (llama.cpp's chained single
head), while the guess's probability among the top 10 is at least ``p_min``, up to ``n_draft``.
Verification is the loop's: output identical to decoding without a draft.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from ..errors import LlamapyError
from ..ggml import ops
from .hidden_draft import Features, HiddenDraftModel, HiddenStateDraft

MTP_ARCHS = ("glm4moe", "deepseek2", "qwen35", "qwen35moe", "qwen3next", "mimo2")


QWEN_HYBRIDS = ("qwen35", "qwen35moe", "qwen3next")  # gated attention, MoE with a gated shared expert


class MtpError(LlamapyError):
    """The model has no MTP layer this can run (or bad MTP parameters)."""


def _mtp_class(base_cls: type) -> type:
    """The target's architecture class with the one-block MTP graph as its ``build``."""

    class Mtp(base_cls):  # type: ignore[misc, valid-type]
        def layer_moe(self, il: int) -> bool:
            return "ffn_gate_inp.weight" in self.blocks[il]

        def build(self, g: Any) -> Any:
            return build_mtp(self, g)

    Mtp.__name__ = f"Mtp{base_cls.__name__}"
    return Mtp


def build_mtp(arch: Any, g: Any) -> Any:
    """The MTP block's graph: input rows ``[embed(t) | h]`` (F32[T, 2 n_embd]), logits and ``h'``.

    MiMo (llama.cpp's mimo2.cpp) feeds its MTP block the state *before* the output norm (the target's
    last layer output, and the block's own output before its head norm), where the other families feed
    the normed one. The target reports its normed state ``r = rms_norm(x) * w`` (``w``: output_norm,
    the embeddings it outputs), so the block divides by ``w``: ``rms_norm(x)``, which ``hnorm`` turns
    into what llama.cpp computes from ``x`` (RMS norm is scale-invariant: they differ by ~eps, relative).
    Its chained state is given in the same form. (A zero in ``w`` would lose that component; the
    released files have none.)"""
    from ..model.blocks import Outputs

    hp, blk, w = arch.hp, arch.blocks[0], arch.w
    n, T = hp.n_embd, g.inp.n_tokens
    x = g.inp.embd
    e = ops.cont(ops.view(x, (T, n), x.strides, 0))
    h = ops.cont(ops.view(x, (T, n), x.strides, 4 * n))
    e = g.build_norm(e, blk["nextn.enorm.weight"], name="mtp_enorm", il=0)
    if hp.arch == "mimo2":  # its h_nextn is the state before the output norm (above)
        h = ops.div(h, w["output_norm.weight"])
    h = g.build_norm(h, blk["nextn.hnorm.weight"], name="mtp_hnorm", il=0)
    x = g.cb(g.mm(blk["nextn.eh_proj.weight"], ops.concat(e, h, 1)), "mtp_eh_proj", 0)
    a = g.build_norm(x, blk["attn_norm.weight"], name="attn_norm", il=0)
    if hp.arch == "deepseek2":
        a = arch.build_mla(g, a, blk, 0)
        norm2 = "ffn_norm.weight"
    elif hp.arch == "mimo2":
        from ..model.arch.mimo2 import attention

        a = attention(g, a, blk, 0)
        norm2 = "ffn_norm.weight"
    elif hp.arch in QWEN_HYBRIDS:
        from ..model.rs_blocks import build_gated_attention

        a = build_gated_attention(g, a, blk, 0)
        norm2 = "post_attention_norm.weight"
    else:  # glm4moe
        a = g.attention(a, blk, 0, qk_norm="attn_q_norm.weight" in blk)
        norm2 = "post_attention_norm.weight"
    a, x = g.select_outputs(0, a, x)
    x = g.cb(ops.add(x, a), "ffn_inp", 0)
    f = g.build_norm(x, blk[norm2], name="ffn_norm", il=0)
    if hp.arch == "mimo2":
        from ..model.arch.mimo2 import ffn

        f = ffn(arch, g, f, blk, 0)
    elif arch.layer_moe(0):
        if hp.arch in QWEN_HYBRIDS:
            f = ops.add(g.build_moe_ffn(f, blk, 0, True), g.build_shared_expert(f, blk, 0))
        else:
            from ..model.moe_blocks import build_moe_layer

            f = build_moe_layer(g, f, blk, 0)
    else:
        f = g.build_ffn(f, blk, 0)
    x = g.cb(ops.add(x, f), "l_out", 0)
    norm_w = blk.get("nextn.shared_head_norm.weight")
    if norm_w is None and hp.arch == "mimo2":
        norm_w = blk.get("layer_out_norm.weight")
    head_w = blk.get("nextn.shared_head_head.weight")
    h_next = x
    x = g.build_norm(x, norm_w if norm_w is not None else w["output_norm.weight"], name="result_norm")
    logits = g.mm(head_w if head_w is not None else arch.output_weight(), x)
    if hp.arch == "mimo2":  # the next step's h in the target's form (normed by output_norm)
        return Outputs(g.cb(logits, "result_output"), embd=g.build_norm(h_next, w["output_norm.weight"]))
    return Outputs(g.cb(logits, "result_output"), embd=x)


class MtpModel(HiddenDraftModel):
    """A one-layer model over the target's MTP block (what :class:`~llamapy.context.Context` needs:
    ``impl``, ``hparams``, ``vocab``...). ``layer`` picks among several MTP blocks (default the first)."""

    def __init__(self, target: Any, layer: int = 0) -> None:
        from ..model.blocks import TensorLoader, Weights

        hp0 = target.hparams
        arch = getattr(target, "arch", hp0.arch)
        if arch not in MTP_ARCHS:
            raise MtpError(
                f"{target.path}: speculative decoding with MTP needs a model with next-token-prediction "
                f"layers ({', '.join(MTP_ARCHS)}); this is {arch!r}"
            )
        if not hp0.n_layer_nextn:
            raise MtpError(
                f"{target.path}: this {arch} model has no MTP (nextn) layers (nextn_predict_layers = 0): "
                "use another --spec-type (ngram-simple, ngram-map-k) or a draft model (-md)"
            )
        if not 0 <= layer < hp0.n_layer_nextn:
            raise MtpError(f"MTP layer {layer} is not one of the model's {hp0.n_layer_nextn}")
        il = hp0.n_layer + layer
        prefix = f"blk.{il}."
        loader = target.loader
        names = [nm for nm in loader.tensor_index if nm.startswith(prefix)]
        if prefix + "nextn.eh_proj.weight" not in names:
            raise MtpError(f"{target.path}: the MTP layer blk.{il} has no nextn.eh_proj.weight")
        tl = TensorLoader(loader)
        for nm in names:
            tl(nm, None)
        tensors = dict(target.impl.w._t)
        tensors.update({"blk.0." + nm[len(prefix) :]: t for nm, t in tl.tensors.items()})
        hp = copy.deepcopy(hp0)
        last = hp0.n_layer - 1  # the MTP block's heads and widths: the trunk's last layer's
        hp.n_layer, hp.n_layer_nextn, hp.n_layer_dense_lead = 1, 0, 0
        hp.n_head, hp.n_head_kv, hp.n_ff = [hp0.n_head[last]], [hp0.n_head_kv[last]], [hp0.n_ff[last]]
        hp.swa_layers, hp.recurrent_layers, hp.n_swa = [False], [False], 0
        hp.n_deepstack_layers = 1  # an embeddings input of 2 n_embd: [embed(t) | h]
        hp.n_layer_kv_from_start = -1
        own_hparams = getattr(type(target.impl), "mtp_hparams", None)  # (mimo2: the MTP block's own)
        if own_hparams is not None:
            own_hparams(hp, hp0, layer)
        impl = _mtp_class(type(target.impl))(hp)
        impl.w = Weights(tensors)
        impl.blocks = [Weights(tensors, "blk.0.")]
        for k, v in vars(target.impl).items():  # per-model flags the family's code reads (qk_norm, ...)
            if k not in ("hp", "w", "blocks"):
                setattr(impl, k, v)
        self.target = target
        self.path = target.path
        self.loader = loader
        self.hparams = hp
        self.vocab = target.vocab
        self.impl = impl
        self.arch = arch
        self.metadata = target.metadata
        own = loader.tensor_index.get(prefix + "nextn.embed_tokens.weight")
        self._set_embeddings(own if own is not None else loader.tensor_index["token_embd.weight"])


class MtpDraft(HiddenStateDraft):
    """Draft with the target model's own MTP layer (see the module docstring)."""

    spec_type = "mtp"
    needs_hidden = True
    error = MtpError

    def __init__(
        self,
        model: Any,
        n_draft: int = 3,
        n_min: int = 0,
        p_min: float = 0.0,
        n_ctx: int = 4096,
        n_batch: int = 512,
        n_threads: int | None = None,
    ) -> None:
        self.check_params(n_draft, n_min, p_min)  # (before the MTP layer is loaded)
        mtp = model if isinstance(model, MtpModel) else MtpModel(model)  # (slots share one)
        self._setup(mtp, n_draft, n_min, p_min, n_ctx, n_batch, n_threads)
        self.mtp = mtp
        self.hidden: Features = {}  # target position -> (token, h row)
        self._context(n_ctx)

    # -- the target's side -------------------------------------------------------------------------
    def bind(self, seq: Any) -> None:
        """Have ``seq`` (the target's :class:`TokenSequence`) report its hidden states here (the MTP
        cache grows to the target's context first)."""
        self._context(int(seq.n_ctx))
        seq.set_hidden_tap(self.observe)

    def observe(self, pos0: int, tokens: list[int], h: np.ndarray | None) -> None:
        """The target evaluated ``tokens`` from position ``pos0``; ``h`` their normed hidden states
        (``pos0`` -1: the target's context shifted, positions moved: start over)."""
        if pos0 < 0 or h is None:
            self.hidden.clear()
            self.tokens = []
            self.ctx.memory.seq_rm(0, -1, -1)
            return
        for i, t in enumerate(tokens):
            self.hidden[pos0 + i] = (int(t), np.array(h[i], dtype=np.float32))

    def _features(self) -> Features:
        return self.hidden


def has_mtp(model: Any) -> bool:
    """Whether ``model`` (a loaded ``llamapy.model.Model``) carries an MTP layer this module runs."""
    hp = getattr(model, "hparams", None)
    return bool(hp is not None and hp.arch in MTP_ARCHS and hp.n_layer_nextn)


__all__ = ["MTP_ARCHS", "MtpDraft", "MtpError", "MtpModel", "build_mtp", "has_mtp"]
