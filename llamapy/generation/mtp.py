"""Speculative decoding from the model itself: its next-token-prediction (NextN / MTP) layer as the
draft (llama.cpp's ``--spec-type draft-mtp``; ``Llama(draft_model="mtp")``).

GLM-4.5 (``glm4moe``), DeepSeek V3 (``deepseek2``) and Qwen3.5 (``qwen35``/``qwen35moe``) files carry,
after the trunk, a block ``blk.{n_layer}`` with ``nextn.eh_proj``, ``nextn.enorm``, ``nextn.hnorm``
(and optionally ``nextn.shared_head_norm`` / ``nextn.shared_head_head``; else the model's output norm
and head). At position ``p`` it reads the token ``t_p`` and the target's normed last hidden state
``h_{p-1}`` (what its head turns into logits, llama.cpp's ``h_nextn``)::

    x = eh_proj([enorm(embed(t_p)), hnorm(h_{p-1})]);  x = block(x);  h' = head_norm(x)
    logits(t_{p+1}) = head(h')

as llama.cpp's ``graph_mtp`` (src/models/glm4-moe.cpp, deepseek2.cpp, qwen35.cpp). The block runs in
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
import math
from typing import Any

import numpy as np

from ..errors import LlamapyError
from ..ggml import ops
from ..ggml.quants import dequantize
from .draft_model import confident_top
from .speculative import LlamaDraftModel

MTP_ARCHS = ("glm4moe", "deepseek2", "qwen35", "qwen35moe")


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
    """The MTP block's graph: input rows ``[embed(t) | h]`` (F32[T, 2 n_embd]), logits and ``h'``."""
    from ..model.blocks import Outputs

    hp, blk, w = arch.hp, arch.blocks[0], arch.w
    n, T = hp.n_embd, g.inp.n_tokens
    x = g.inp.embd
    e = ops.cont(ops.view(x, (T, n), x.strides, 0))
    h = ops.cont(ops.view(x, (T, n), x.strides, 4 * n))
    e = g.build_norm(e, blk["nextn.enorm.weight"], name="mtp_enorm", il=0)
    h = g.build_norm(h, blk["nextn.hnorm.weight"], name="mtp_hnorm", il=0)
    x = g.cb(g.mm(blk["nextn.eh_proj.weight"], ops.concat(e, h, 1)), "mtp_eh_proj", 0)
    a = g.build_norm(x, blk["attn_norm.weight"], name="attn_norm", il=0)
    if hp.arch == "deepseek2":
        a = arch.build_mla(g, a, blk, 0)
        norm2 = "ffn_norm.weight"
    elif hp.arch in ("qwen35", "qwen35moe"):
        from ..model.rs_blocks import build_gated_attention

        a = build_gated_attention(g, a, blk, 0)
        norm2 = "post_attention_norm.weight"
    else:  # glm4moe
        a = g.attention(a, blk, 0, qk_norm="attn_q_norm.weight" in blk)
        norm2 = "post_attention_norm.weight"
    a, x = g.select_outputs(0, a, x)
    x = g.cb(ops.add(x, a), "ffn_inp", 0)
    f = g.build_norm(x, blk[norm2], name="ffn_norm", il=0)
    if arch.layer_moe(0):
        if hp.arch in ("qwen35", "qwen35moe"):
            f = ops.add(g.build_moe_ffn(f, blk, 0, True), g.build_shared_expert(f, blk, 0))
        else:
            from ..model.moe_blocks import build_moe_layer

            f = build_moe_layer(g, f, blk, 0)
    else:
        f = g.build_ffn(f, blk, 0)
    x = g.cb(ops.add(x, f), "l_out", 0)
    norm_w = blk.get("nextn.shared_head_norm.weight")
    head_w = blk.get("nextn.shared_head_head.weight")
    x = g.build_norm(x, norm_w if norm_w is not None else w["output_norm.weight"], name="result_norm")
    logits = g.mm(head_w if head_w is not None else arch.output_weight(), x)
    return Outputs(g.cb(logits, "result_output"), embd=x)


class MtpModel:
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
        self.load_time_s = 0.0
        emb = target.impl.w["token_embd.weight"]
        self._embd_type = emb.type
        self._embd_rows = loader.tensor_index["token_embd.weight"].array()
        blk_embd = loader.tensor_index.get(prefix + "nextn.embed_tokens.weight")
        if blk_embd is not None:
            self._embd_type, self._embd_rows = blk_embd.ggml_type, blk_embd.array()

    @property
    def n_vocab(self) -> int:
        return self.hparams.n_vocab

    @property
    def n_ctx_train(self) -> int:
        return self.hparams.n_ctx_train

    @property
    def n_embd(self) -> int:
        return self.hparams.n_embd

    def embed(self, tokens: list[int]) -> np.ndarray:
        """F32[len(tokens), n_embd]: the token embedding rows the MTP block reads."""
        out = np.empty((len(tokens), self.hparams.n_embd), dtype=np.float32)
        for i, t in enumerate(tokens):
            out[i] = dequantize(self._embd_rows[t], self._embd_type).reshape(-1)
        return out


class MtpDraft(LlamaDraftModel):
    """Draft with the target model's own MTP layer (see the module docstring)."""

    spec_type = "mtp"
    needs_hidden = True

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
        from ..context import Context, ContextParams

        if int(n_draft) < 1 or not 0 <= int(n_min) <= int(n_draft):
            raise MtpError(f"need 1 <= n_draft and 0 <= n_min <= n_draft, got {n_draft}, {n_min}")
        if not 0.0 <= float(p_min) <= 1.0 or math.isnan(float(p_min)):
            raise MtpError(f"p_min must be between 0 and 1, got {p_min}")
        self.n_draft, self.n_min, self.p_min = int(n_draft), int(n_min), float(p_min)
        self.mtp = model if isinstance(model, MtpModel) else MtpModel(model)  # (slots share one)
        self.n_embd = self.mtp.n_embd
        self._params = ContextParams(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=min(n_batch, 512),
                                     n_threads=n_threads, embeddings=True, pooling_type=0)  # fmt: skip
        self.ctx = Context(self.mtp, self._params)  # type: ignore[arg-type]
        self.tokens: list[int] = []  # positions the MTP cache holds, computed from the target's h
        self.hidden: dict[int, tuple[int, np.ndarray]] = {}  # target position -> (token, h row)
        self.n_drafted = 0
        self.n_calls = 0

    # -- the target's side -------------------------------------------------------------------------
    def bind(self, seq: Any) -> None:
        """Have ``seq`` (the target's :class:`TokenSequence`) report its hidden states here (the MTP
        cache grows to the target's context first)."""
        if int(seq.n_ctx) > self.ctx.n_ctx:
            from ..context import Context

            self._params.n_ctx = int(seq.n_ctx)
            self.ctx = Context(self.mtp, self._params)  # type: ignore[arg-type]
            self.tokens = []
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

    # -- drafting ----------------------------------------------------------------------------------
    def _rows(self, tokens: list[int], hs: list[np.ndarray]) -> np.ndarray:
        return np.concatenate([self.mtp.embed(tokens), np.stack(hs)], axis=1)

    def _decode(self, rows: np.ndarray, pos0: int) -> None:
        """Decode ``rows`` from ``pos0`` (in ``n_batch`` pieces); the last row's outputs are kept."""
        from ..batch import Batch

        for i in range(0, len(rows), self.ctx.n_batch):
            self.ctx.decode(Batch.from_embd(rows[i : i + self.ctx.n_batch], pos0=pos0 + i))

    def _catch_up(self, ids: list[int]) -> tuple[list[int], list[np.ndarray]]:
        """The rows that bring the MTP cache to positions ``0..len(ids)-1`` of ``ids``, from the first
        position it does not hold yet (returned undecoded: the caller decodes them together with the
        first draft row). Each pairs ``t_p`` with the target's ``h_{p-1}``; zeros where that is not
        known (position 0, as llama.cpp; a prefix the target reused rather than evaluated; a server
        prompt's rows without an output)."""
        n = 0
        for a, b in zip(self.tokens, ids, strict=False):
            if a != b:
                break
            n += 1
        self.ctx.memory.seq_rm(0, n, -1)
        del self.tokens[n:]
        zeros = np.zeros(self.n_embd, np.float32)
        todo_h: list[np.ndarray] = []
        for p in range(n, len(ids)):
            prev = self.hidden.get(p - 1)
            todo_h.append(prev[1] if prev is not None and p and prev[0] == ids[p - 1] else zeros)
        todo_t = ids[n:]
        self.tokens.extend(todo_t)
        for p in [p for p in self.hidden if p < len(ids) - 1]:  # only h_{P-1} on is read again
            del self.hidden[p]
        return todo_t, todo_h

    def __call__(self, input_ids: np.ndarray, /, **kwargs: object) -> np.ndarray:
        ids = [int(t) for t in np.asarray(input_ids).reshape(-1)]
        self.n_calls += 1
        P = len(ids) - 1  # the sampled token's position
        last = self.hidden.get(P - 1)
        n_vocab = self.mtp.n_vocab
        if (
            P < 1
            or last is None
            or last[0] != ids[P - 1]
            or len(ids) + self.n_draft >= self.ctx.n_ctx
            or any(not 0 <= t < n_vocab for t in ids)
        ):
            return np.zeros(0, dtype=np.intc)
        todo_t, todo_h = self._catch_up(ids[:P])
        out: list[int] = []
        # the catch-up rows and the first draft row (the sampled token with the target's h_{P-1}) in one batch
        rows = self._rows([*todo_t, ids[P]], [*todo_h, last[1]])
        pos0 = P - len(todo_t)
        while True:
            self._decode(rows, pos0)
            best = confident_top(self.ctx.get_logits()[-1], self.p_min)
            if best is None:
                break
            out.append(best)
            if len(out) >= self.n_draft:
                break
            rows = self._rows([best], [np.array(self.ctx.get_embeddings()[-1], dtype=np.float32)])
            pos0 = P + len(out)
        self.ctx.memory.seq_rm(0, P, -1)  # the drafts' entries are not the target's: drop them
        if len(out) < self.n_min:
            out = []
        self.n_drafted += len(out)
        return np.asarray(out, dtype=np.intc)


def has_mtp(model: Any) -> bool:
    """Whether ``model`` (a loaded ``llamapy.model.Model``) carries an MTP layer this module runs."""
    hp = getattr(model, "hparams", None)
    return bool(hp is not None and hp.arch in MTP_ARCHS and hp.n_layer_nextn)


__all__ = ["MTP_ARCHS", "MtpDraft", "MtpError", "MtpModel", "build_mtp", "has_mtp"]
