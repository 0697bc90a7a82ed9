"""Shared building blocks of the architectures: graph inputs and outputs, weight access by GGUF name,
and the graph builder with ``build_norm`` / ``build_attn`` / ``build_ffn`` / ``build_moe_ffn``.

Everything here builds ggml graph nodes (``llamapy.ggml.ops``); nothing is computed. The context
executes the graph and reuses it while the shapes (tokens, outputs, KV cells) repeat.

Intermediates carry llama.cpp's names (``GraphBuilder.cb``: ``attn_norm-3``, ``Qcur-3``, ``kqv_out-3``,
``ffn_out-3``, ``l_out-3``, ``result_norm``, ``result_output``) so that ``ContextParams.cb_eval`` can read
any of them and a divergence from llama.cpp (``llama-eval-callback``) or transformers is a diff of dumps.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import field
from typing import TYPE_CHECKING, Any

import numpy as np

from .._dataclass import dataclass
from ..ggml import ops
from ..ggml.tensor import Tensor
from ..ggml.types import GGMLType
from .hparams import ROPE_NEOX, HParams, ModelLoadError, PoolingType

if TYPE_CHECKING:
    from .arch import Architecture
    from .loader import ModelLoader


# ---------------------------------------------------------------------------------------------
# weights


class Weights(Mapping):
    """Model weights by GGUF name (``w["token_embd.weight"]``); ``w.get(name)`` is None when absent."""

    def __init__(self, tensors: dict[str, Tensor], prefix: str = "") -> None:
        self._t = tensors
        self._prefix = prefix

    def __getitem__(self, name: str) -> Tensor:
        try:
            return self._t[self._prefix + name]
        except KeyError:
            raise ModelLoadError(f"weight {self._prefix + name!r} was not loaded") from None

    def get(self, name: str, default: Any = None) -> Any:
        return self._t.get(self._prefix + name, default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._prefix + name in self._t

    def __iter__(self) -> Iterator[str]:
        n = len(self._prefix)
        return (k[n:] for k in self._t if k.startswith(self._prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)


class TensorLoader:
    """Declares the tensors of an architecture: checks them in the file and wraps them as ggml weights."""

    def __init__(self, loader: ModelLoader) -> None:
        self.loader = loader
        self.tensors: dict[str, Tensor] = {}

    def __call__(self, name: str, shape: tuple[int, ...] | None, required: bool = True) -> Tensor | None:
        info = self.loader.check(name, shape, required)
        if info is None:
            return None
        if len(info.shape) == 1 and info.ggml_type not in (GGMLType.F32, GGMLType.F16):
            raise ModelLoadError(
                f"{self.loader.path}: tensor {name!r} has type {info.ggml_type.name}; vectors (norms, biases, "
                f"rope factors) must be F32 or F16"
            )
        t = ops.weight(name, info.ggml_type, tuple(info.shape), info.array())
        self.tensors[name] = t
        return t

    def layer(
        self, il: int, name: str, shape: tuple[int, ...] | None, required: bool = True
    ) -> Tensor | None:
        return self(f"blk.{il}.{name}", shape, required)


def load_head_tensors(t: TensorLoader, hp: HParams) -> None:
    """The optional pooling heads any family may carry (llama.cpp's ``cls``, ``cls.output``,
    ``cls.norm``: a reranker's classification head; ``dense_2``/``dense_3``: EmbeddingGemma's
    projections), read by ``GraphBuilder.build_pooling``."""
    n_embd = hp.n_embd
    n_cls = n_embd  # cls.weight: [n_embd, n_embd], or [1, n_embd] without cls.output (jina-reranker-v1)
    cls = t("cls.weight", None, required=False)
    if cls is not None:
        if cls.ndim != 2 or cls.shape[1] != n_embd:
            raise ModelLoadError(f"tensor 'cls.weight' has shape {cls.shape}, expected (n, {n_embd})")
        n_cls = cls.shape[0]
        t("cls.bias", (n_cls,), required=False)
        t("cls.norm.weight", (n_cls,), required=False)
    if t("cls.output.weight", (hp.n_cls_out, n_cls), required=False) is not None:
        t("cls.output.bias", (hp.n_cls_out,), required=False)
    d2 = t("dense_2.weight", None, required=False)
    n = n_embd
    if d2 is not None:
        if d2.ndim != 2 or d2.shape[1] != n_embd:
            raise ModelLoadError(f"tensor 'dense_2.weight' has shape {d2.shape}, expected (n, {n_embd})")
        n = d2.shape[0]
        t("dense_2.bias", (n,), required=False)
    d3 = t("dense_3.weight", None, required=False)
    if d3 is not None and (d3.ndim != 2 or d3.shape[1] != n):
        raise ModelLoadError(f"tensor 'dense_3.weight' has shape {d3.shape}, expected (n, {n})")


# ---------------------------------------------------------------------------------------------
# graph inputs


@dataclass
class KVInputs:
    """One KV cache's side of a graph: its per-layer buffers and the inputs rewritten per ubatch."""

    n_kv: int  # cells the attention reads (padded so shapes repeat)
    mask: Tensor  # F32[T, n_kv]: 0 or -inf
    idx: Tensor  # I64[T]: the cell each new token's K/V goes to
    k: dict[int, Tensor]  # layer -> buffer [cells, n_embd_k_gqa]
    v: dict[int, Tensor]


@dataclass
class Inputs:
    """The graph inputs of one ubatch that the model's blocks read (tokens or embeddings, positions, masks)."""

    n_tokens: int
    n_outputs: int
    pos: Tensor  # I32[T]; M-RoPE models (n_pos_per_embd 4): I32[4 T], (t, h, w, e) section-major
    tokens: Tensor | None = None  # I32[T]
    embd: Tensor | None = None  # F32[T, n_embd]
    out_ids: Tensor | None = None  # I32[n_outputs] (None: every token is an output)
    kv: dict[int, KVInputs] = field(default_factory=dict)  # layer -> its cache inputs
    n_ctx: int = 0  # context size (per sequence), for rope long/short factor choice
    flash_attn: bool = True  # fused attention (else mul_mat + soft_max + mul_mat)
    rs: Any = None  # recurrent layers: the memory's RSInputs (state buffers, rows per stream)
    # weight name -> (LoRA pair, effective scale) of the context's active adapters (llamapy.model.lora)
    loras: Mapping[str, tuple[tuple[Any, float], ...]] = field(default_factory=dict)
    # encoders (no KV cache): F32[T, T] masks over the ubatch itself (full layers, sliding-window layers)
    kq_mask: Tensor | None = None
    kq_mask_swa: Tensor | None = None
    # pooling (embeddings): F32[S, T] mean weights, I32[S] the row of each sequence's cls/last token
    pool_mean: Tensor | None = None
    pool_rows: Tensor | None = None


@dataclass
class Outputs:
    """What ``Architecture.build`` returns (llama.cpp's ``t_logits`` / ``t_embd``)."""

    logits: Tensor | None  # F32[n_outputs, n_vocab] (None: an encoder without a language-model head)
    embd: Tensor | None = None  # F32[n_outputs, n_embd]: the normed last hidden state (embeddings mode)
    embd_pooled: Tensor | None = None  # F32[n_seqs, n]: per sequence (``GraphBuilder.build_pooling``)


@dataclass
class Rope:
    """Rotary embedding parameters of one layer."""

    n_dims: int
    mode: int = 0
    freq_base: float = 10000.0
    freq_scale: float = 1.0
    n_ctx_orig: int = 0
    ext_factor: float = 0.0
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    freq_factors: Tensor | None = None

    def apply(self, x: Tensor, pos: Tensor) -> Tensor:
        return ops.rope(
            x,
            pos,
            self.n_dims,
            mode=self.mode,
            freq_base=self.freq_base,
            freq_scale=self.freq_scale,
            n_ctx_orig=self.n_ctx_orig,
            ext_factor=self.ext_factor,
            attn_factor=self.attn_factor,
            beta_fast=self.beta_fast,
            beta_slow=self.beta_slow,
            freq_factors=self.freq_factors,
        )


def rope_for_layer(hp: HParams, il: int, mode: int | None = None, freq_factors: Tensor | None = None) -> Rope:
    """The hparams' rope of layer ``il`` (the local base and scale on sliding-window layers). Only
    ``Architecture.layer_rope`` calls it: the forward graph and the K-shift both ask that method."""
    swa = hp.is_swa(il)
    return Rope(
        n_dims=hp.n_rot,
        mode=hp.rope_type if mode is None else mode,
        freq_base=hp.rope_freq_base_swa if swa else hp.rope_freq_base,
        freq_scale=hp.rope_freq_scale_swa if swa else hp.rope_freq_scale,
        n_ctx_orig=hp.n_ctx_orig_yarn,
        ext_factor=hp.yarn_ext_factor,
        attn_factor=hp.rope_attn_factor,
        beta_fast=hp.yarn_beta_fast,
        beta_slow=hp.yarn_beta_slow,
        freq_factors=freq_factors,
    )


# ---------------------------------------------------------------------------------------------
# the builder


class GraphBuilder:
    """Builds one ubatch's graph from shared blocks for ``arch`` (its hparams and per-layer choices)
    and ``inp`` (the ubatch's inputs)."""

    def __init__(self, arch: Architecture, inp: Inputs) -> None:
        self.arch = arch
        self.hp: HParams = arch.hp
        self.inp = inp
        # layer -> its cached K, V views and mask, for the layers that reuse them (``HParams.kv_layer``)
        self.kv_views: dict[int, tuple[Tensor, Tensor, Tensor]] = {}

    @staticmethod
    def cb(t: Tensor, name: str, il: int = -1) -> Tensor:
        """Name a node as llama.cpp's ``cb(cur, name, il)`` does (``name-il``, or ``name`` for il < 0).
        Leaves (weights, inputs) keep their own names."""
        if not t.is_leaf:
            t.name = f"{name}-{il}" if il >= 0 else name
        return t

    # -- basic pieces -----------------------------------------------------------------------------
    def embed(self, tok_embd: Tensor, scale: float | None = None) -> Tensor:
        inp = self.inp
        if inp.embd is not None:
            x = inp.embd
        else:
            x = ops.get_rows(tok_embd, inp.tokens)
            for lw, s in inp.loras.get(tok_embd.name, ()):  # flipped pair: B A[t] (see model.lora)
                x = ops.add(x, ops.scale(ops.mul_mat(lw.b, ops.get_rows(lw.a, inp.tokens)), s))
            x = self.cb(x, "inp_embd")
        if scale is not None:
            x = self.cb(ops.scale(x, scale), "inp_scaled")
        return x

    def mm(self, w: Tensor, x: Tensor, b: Tensor | None = None) -> Tensor:
        """``x @ w.T`` (+ bias): x[..., K], w[N, K] -> [..., N]; with LoRA adapters on ``w``, plus
        ``s * B (A x)`` for each (llama.cpp's ``build_lora_mm``)."""
        y = ops.mul_mat(w, x)
        for lw, s in self.inp.loras.get(w.name, ()):
            if not lw.embd:  # a tied output reads token_embd, whose pair is for the row lookup only
                y = ops.add(y, ops.scale(ops.mul_mat(lw.b, ops.mul_mat(lw.a, x)), s))
        return ops.add(y, b) if b is not None else y

    def build_norm(
        self,
        x: Tensor,
        w: Tensor | None,
        b: Tensor | None = None,
        kind: str = "rms",
        name: str = "",
        il: int = -1,
    ) -> Tensor:
        if kind == "rms":
            x = ops.rms_norm(x, self.hp.norm_rms_eps)
        else:
            x = ops.norm(x, self.hp.norm_eps)
        if w is not None:
            x = ops.mul(x, w)
        if b is not None:
            x = ops.add(x, b)
        return self.cb(x, name, il) if name else x

    def select_outputs(self, il: int, *xs: Tensor) -> tuple[Tensor, ...]:
        """At the last layer keep only the rows that produce outputs (as llama.cpp's inp_out_ids)."""
        if il != self.hp.n_layer - 1 or self.inp.out_ids is None:
            return xs
        return tuple(ops.get_rows(x, self.inp.out_ids) for x in xs)

    # -- attention --------------------------------------------------------------------------------
    def qkv(self, h: Tensor, blk: Weights, il: int) -> tuple[Tensor, Tensor, Tensor]:
        """Q [T, H, Dk], K [T, Hkv, Dk], V [T, Hkv, Dv] from separate or fused (attn_qkv) projections."""
        T = self.inp.n_tokens
        nh, nkv, dk, dv = self.hp.heads(il)
        if "attn_qkv.weight" in blk:
            qkv = self.mm(blk["attn_qkv.weight"], h, blk.get("attn_qkv.bias"))
            qkv = ops.cont(qkv) if not qkv.is_contiguous() else qkv
            q = ops.cont(ops.view(qkv, (T, nh * dk), qkv.strides, 0))
            k = ops.cont(ops.view(qkv, (T, nkv * dk), qkv.strides, 4 * nh * dk))
            v = ops.cont(ops.view(qkv, (T, nkv * dv), qkv.strides, 4 * (nh + nkv) * dk))
        else:
            q = self.mm(blk["attn_q.weight"], h, blk.get("attn_q.bias"))
            k = self.mm(blk["attn_k.weight"], h, blk.get("attn_k.bias"))
            v = self.mm(blk["attn_v.weight"], h, blk.get("attn_v.bias"))
        return ops.reshape(q, (T, nh, dk)), ops.reshape(k, (T, nkv, dk)), ops.reshape(v, (T, nkv, dv))

    def build_attn(
        self,
        q: Tensor,
        k: Tensor | None,
        v: Tensor | None,
        il: int,
        kq_scale: float,
        softcap: float = 0.0,
        max_bias: float = 0.0,
        sinks: Tensor | None = None,
    ) -> Tensor:
        """Store K/V of the new tokens in the layer's cache cells and attend over the cache; without a
        cache for the layer (an encoder) attend over the ubatch itself (``inp.kq_mask``/``kq_mask_swa``,
        llama.cpp's ``build_attn_inp_no_cache``). ``max_bias``: ALiBi (the mask holds -|i - j|, the
        encoder's and the KV cache's alike: ``KVCache.alibi``).
        ``sinks`` F32[H]: a learned logit per head joining the softmax (gpt-oss's ``attn_sinks``).

        q [T, H, Dk], k [T, Hkv, Dk], v [T, Hkv, Dv] -> [T, H * Dv] (before the output projection).
        """
        T = self.inp.n_tokens
        _, nkv, dk, dv = self.hp.heads(il)
        src = self.hp.kv_layer(il)
        if src != il:  # KV sharing (Gemma 3n / 4): attend over an earlier layer's cached K/V (k, v unused)
            if src not in self.kv_views:
                raise ModelLoadError(
                    f"layer {il} reuses the K/V of layer {src}, which was not built before it"
                )
            kc, vc, mask = self.kv_views[src]
        elif il not in self.inp.kv:
            kc, vc = k, ops.cont(v) if not v.is_contiguous() else v
            mask = self.inp.kq_mask_swa if self.hp.is_swa(il) else self.inp.kq_mask
            if mask is None:
                raise ModelLoadError(f"layer {il}: no KV cache and no encoder mask for its attention")
        else:
            kvi = self.inp.kv[il]
            kbuf, vbuf = kvi.k[il], kvi.v[il]
            k_st = ops.set_rows(kbuf, ops.reshape(k, (T, nkv * dk)), kvi.idx)
            v_st = ops.set_rows(
                vbuf, ops.reshape(ops.cont(v) if not v.is_contiguous() else v, (T, nkv * dv)), kvi.idx
            )
            kc = ops.view(k_st, (kvi.n_kv, nkv, dk))
            vc = ops.view(v_st, (kvi.n_kv, nkv, dv))
            mask = kvi.mask
            self.kv_views[il] = (kc, vc, mask)
        if self.inp.flash_attn:
            out = ops.flash_attn_ext(
                q, kc, vc, mask, kq_scale, max_bias=max_bias, logit_softcap=softcap, sinks=sinks
            )
            return self.cb(ops.reshape(out, (T, q.shape[1] * dv)), "kqv_out", il)
        # unfused: softmax(q k^T * scale + mask) v, heads as the batch axis
        qh = ops.cont(ops.permute(q, (1, 0, 2)))  # [H, T, Dk]
        kh = ops.cont(ops.permute(kc, (1, 0, 2)))  # [Hkv, n_kv, Dk]
        kq = ops.mul_mat(kh, qh)  # [H, T, n_kv]
        if softcap:
            kq = ops.scale(ops.tanh(ops.scale(kq, kq_scale / softcap)), softcap)
            kq_scale = 1.0
        kq = ops.soft_max(kq, mask, scale=kq_scale, max_bias=max_bias, sinks=sinks)
        vt = ops.cont(ops.permute(vc, (1, 2, 0)))  # [Hkv, Dv, n_kv]
        out = ops.cont(ops.permute(ops.mul_mat(vt, kq), (1, 0, 2)))  # [H, T, Dv] -> [T, H, Dv]
        return self.cb(ops.reshape(out, (T, q.shape[1] * dv)), "kqv_out", il)

    def attention(
        self,
        h: Tensor,
        blk: Weights,
        il: int,
        *,
        qk_norm: bool | str = False,
        q_scale: float | None = None,
        kq_scale: float | None = None,
        softcap: float = 0.0,
        qk_norm_kind: str = "rms",
        attn_temp: Tensor | None = None,
        sinks: Tensor | None = None,
    ) -> Tensor:
        """The whole attention sub-block: projections, optional q/k norm (per head, or ``"full"``:
        over the whole projection, as OLMo 2; ``qk_norm_kind`` "rms" or "layer", the weight one vector
        or one per head), the layer's rope (``arch.layer_rope``, as the K-shift; None: no rope), cache,
        output projection."""
        q, k, v = self.qkv(h, blk, il)
        kind = qk_norm_kind
        if qk_norm == "full":
            T = self.inp.n_tokens
            qn = self.build_norm(
                ops.reshape(q, (T, -1)), blk["attn_q_norm.weight"], kind=kind, name="Qcur_normed", il=il
            )
            kn = self.build_norm(
                ops.reshape(k, (T, -1)), blk["attn_k_norm.weight"], kind=kind, name="Kcur_normed", il=il
            )
            q, k = ops.reshape(qn, q.shape), ops.reshape(kn, k.shape)
        elif qk_norm:
            q = self.build_norm(q, blk["attn_q_norm.weight"], kind=kind, name="Qcur_normed", il=il)
            k = self.build_norm(k, blk["attn_k_norm.weight"], kind=kind, name="Kcur_normed", il=il)
        rope = self.arch.layer_rope(il, self.inp.n_ctx)
        if rope is not None:
            q = rope.apply(q, self.inp.pos)
            k = rope.apply(k, self.inp.pos)
        if q_scale is not None:
            q = ops.scale(q, q_scale)
        if attn_temp is not None:  # per-token temperature tuning [T, 1, 1] (``inp_attn_temp``)
            q = self.cb(ops.mul(q, attn_temp), "Qcur_attn_temp_scaled", il)
        q, k, v = self.cb(q, "Qcur", il), self.cb(k, "Kcur", il), self.cb(v, "Vcur", il)
        if kq_scale is None:
            kq_scale = 1.0 / math.sqrt(self.hp.heads(il).n_embd_head_k)
        # ALiBi (MPT, Refact): the cache's mask holds -|i - j|, scaled per head by the slopes of max_bias
        out = self.build_attn(q, k, v, il, kq_scale, softcap, max_bias=self.hp.f_max_alibi_bias, sinks=sinks)
        return self.cb(self.mm(blk["attn_output.weight"], out, blk.get("attn_output.bias")), "attn_out", il)

    def inp_attn_temp(self, scale: float, floor_scale: int, offset: float = 0.0) -> Tensor:
        """Attention temperature per token, ``log(floor((pos + offset) / floor_scale) + 1) * scale + 1``
        ``[T, 1, 1]`` (llama.cpp's ``inp_attn_scale``: Llama 4, Mistral 3); multiplies Q after rope."""
        return self.cb(ops.attn_temp_scale(self.inp.pos, scale, floor_scale, offset), "inp_attn_scale")

    # -- feed-forward -----------------------------------------------------------------------------
    def build_ffn(
        self, h: Tensor, blk: Weights, il: int, act: str = "silu", gated: bool = True, suffix: str = ""
    ) -> Tensor:
        """Gated feed-forward (SwiGLU / GeGLU), or a fused up+gate projection (first half gated); with
        ``gated=False`` a sequential one (act(up) then down, as GPT-2's GELU MLP). ``suffix`` picks
        another set of the layer's FFN tensors (``"_shexp"``: ``ffn_up_shexp.weight`` ...)."""
        up = self.mm(blk[f"ffn_up{suffix}.weight"], h, blk.get(f"ffn_up{suffix}.bias"))
        up = self.cb(up, f"ffn_up{suffix}", il)
        if not gated:
            x = ops.silu(up) if act == "silu" else ops.gelu(up)
            x = self.cb(x, "ffn_silu" if act == "silu" else "ffn_gelu", il)
            down = self.mm(blk[f"ffn_down{suffix}.weight"], x, blk.get(f"ffn_down{suffix}.bias"))
            return self.cb(down, f"ffn_out{suffix}" if suffix else "ffn_out", il)
        wg = blk.get(f"ffn_gate{suffix}.weight")
        if wg is not None:
            gate = self.mm(wg, h, blk.get(f"ffn_gate{suffix}.bias"))
        else:  # fused: [gate | up]
            n = up.shape[-1] // 2
            gate = ops.cont(ops.view(up, (*up.shape[:-1], n), up.strides, 0))
            up = ops.cont(ops.view(up, (*up.shape[:-1], n), up.strides, 4 * n))
        self.cb(gate, "ffn_gate", il)
        if act == "silu":
            x = self.cb(ops.swiglu(gate, up), "ffn_swiglu", il)
        else:
            x = self.cb(ops.geglu(gate, up), "ffn_geglu", il)
        down = self.mm(blk[f"ffn_down{suffix}.weight"], x, blk.get(f"ffn_down{suffix}.bias"))
        return self.cb(down, f"ffn_out{suffix}" if suffix else "ffn_out", il)

    def build_shared_expert(self, h: Tensor, blk: Weights, il: int) -> Tensor:
        """The MoE's shared expert (a SwiGLU FFN on ``*_shexp`` tensors), scaled by a sigmoid gate when
        the layer has ``ffn_gate_inp_shexp.weight`` (Qwen2-MoE)."""
        y = self.cb(self.build_ffn(h, blk, il, suffix="_shexp"), "ffn_shexp", il)
        wg = blk.get("ffn_gate_inp_shexp.weight")
        if wg is None:
            return y
        g = self.cb(self.mm(wg, h), "ffn_shexp_gate_inp", il)  # [T, 1]
        g = self.cb(ops.scale(ops.tanh(ops.scale(g, 0.5)), 0.5, 0.5), "ffn_shexp_gate", il)  # sigmoid
        return self.cb(ops.mul(y, g), "ffn_shexp_out", il)

    def build_moe_ffn(
        self,
        h: Tensor,
        blk: Weights,
        il: int,
        norm_w: bool,
        *,
        gating: str = "softmax",
        act: str = "silu",
        w_scale: float = 0.0,
        weight_before_ffn: bool = False,
        inp_exps: Tensor | None = None,
    ) -> Tensor:
        """Mixture of experts with softmax routing over ``n_expert_used`` of ``n_expert`` SwiGLU experts.
        ``gating="sigmoid"`` (DeepSeek V3, GLM-4.5): sigmoid scores; experts chosen on the scores plus
        the layer's ``exp_probs_b.bias`` where it has one, within the best ``hp.n_group_used`` of
        ``hp.n_expert_groups`` groups when those are set, weighted by the unbiased scores; ``w_scale``:
        the weights x this (llama.cpp's ``expert_weights_scale``, after the normalization);
        ``weight_before_ffn`` (Llama 4, one expert per token): the input is weighted, not the output.
        ``gating="softmax_weight"`` (gpt-oss, llama.cpp's ``SOFTMAX_WEIGHT``): top-k of the raw logits,
        then a softmax over the selected ones; ``act="swiglu_oai"``: gpt-oss's clamped SwiGLU. Biases
        where the layer has them: on the router (``ffn_gate_inp.bias``) and per expert
        (``ffn_{up,gate,down}_exps.bias``, added with ``add_id``). ``act="relu_sqr"`` (Nemotron-H):
        experts without a gate, relu(up)^2. ``inp_exps``: the experts' input when it is not the router's
        (Nemotron 3 Super's latent projection; the output then has its width)."""
        hp = self.hp
        T = h.shape[0]
        k = hp.n_expert_used
        logits = self.mm(blk["ffn_gate_inp.weight"], h, blk.get("ffn_gate_inp.bias"))
        logits = self.cb(logits, "ffn_moe_logits", il)  # [T, E]
        if gating == "softmax_weight":
            probs = logits
        elif gating == "softmax":
            probs = self.cb(ops.soft_max(logits), "ffn_moe_probs", il)
        elif gating == "sigmoid":
            probs = self.cb(ops.sigmoid(logits), "ffn_moe_probs", il)
        else:
            raise ModelLoadError(
                f"build_moe_ffn: unknown gating {gating!r} (softmax, softmax_weight, sigmoid)"
            )
        sel = probs
        if (b := blk.get("exp_probs_b.bias")) is not None:  # selection bias (DeepSeek V3's correction)
            sel = self.cb(ops.add(probs, b), "ffn_moe_probs_biased", il)
        if 1 < hp.n_expert_groups and 0 < hp.n_group_used < hp.n_expert_groups:
            sel = ops.moe_group_mask(sel, hp.n_expert_groups, hp.n_group_used)
            sel = self.cb(sel, "ffn_moe_probs_masked", il)
        ids = self.cb(ops.top_k(sel, k), "ffn_moe_topk", il)  # I32[T, k]
        # gather probs[t, ids[t, j]] as a product with one-hot "experts" (get_rows is 2-D only)
        eye = ops.weight(
            "moe_onehot", GGMLType.F32, (hp.n_expert, 1, hp.n_expert), np.eye(hp.n_expert, dtype=np.float32)
        )
        w = self.cb(ops.mul_mat_id(eye, ops.reshape(probs, (T, 1, hp.n_expert)), ids), "ffn_moe_weights", il)
        if gating == "softmax_weight":
            w = ops.reshape(ops.soft_max(ops.reshape(w, (T, k))), (T, k, 1))
            self.cb(w, "ffn_moe_weights_softmax", il)
        if norm_w:
            w = ops.div(w, ops.reshape(ops.sum_rows(ops.reshape(w, (T, k))), (T, 1, 1)))
            self.cb(w, "ffn_moe_weights_norm", il)  # [T, k, 1]
        if w_scale and w_scale != 1.0:
            w = self.cb(ops.scale(w, w_scale), "ffn_moe_weights_scaled", il)
        xe = h if inp_exps is None else inp_exps
        x = ops.reshape(xe, (T, 1, xe.shape[-1]))
        if weight_before_ffn:
            if k != 1:
                raise ModelLoadError(f"build_moe_ffn: weighting the input needs 1 expert per token, not {k}")
            x = self.cb(ops.mul(x, w), "ffn_moe_weighted_inp", il)
        up = self.cb(self._mm_id(blk, "ffn_up_exps", x, ids), "ffn_moe_up", il)  # [T, k, n_ff]
        if act == "relu_sqr":  # llama.cpp's LLM_FFN_RELU_SQR, no gate
            r = ops.relu(up)
            a = self.cb(ops.mul(r, r), "ffn_moe_relu_sqr", il)
        elif act in ("swiglu_oai", "silu"):
            gate = self.cb(self._mm_id(blk, "ffn_gate_exps", x, ids), "ffn_moe_gate", il)
            if act == "swiglu_oai":  # llama.cpp's LLM_FFN_SWIGLU_OAI_MOE: alpha 1.702, limit 7
                a = self.cb(ops.swiglu_oai(gate, up, 1.702, 7.0), "ffn_moe_swiglu_oai", il)
            else:
                a = self.cb(ops.swiglu(gate, up), "ffn_moe_swiglu", il)
        else:
            raise ModelLoadError(f"build_moe_ffn: unknown activation {act!r} (silu, swiglu_oai, relu_sqr)")
        y = self.cb(self._mm_id(blk, "ffn_down_exps", a, ids), "ffn_moe_down", il)
        if not weight_before_ffn:
            y = self.cb(ops.mul(y, w), "ffn_moe_weighted", il)  # [T, k, n_embd]
        out = ops.sum_rows(ops.cont(ops.permute(y, (0, 2, 1))))
        return self.cb(ops.reshape(out, (T, y.shape[-1])), "ffn_moe_out", il)

    @staticmethod
    def _mm_id(blk: Weights, name: str, x: Tensor, ids: Tensor) -> Tensor:
        """The experts ``ids`` of ``{name}.weight`` applied to ``x``, plus their ``{name}.bias`` rows."""
        y = ops.mul_mat_id(blk[f"{name}.weight"], x, ids)
        b = blk.get(f"{name}.bias")
        return ops.add_id(y, b, ids) if b is not None else y

    # -- output -----------------------------------------------------------------------------------
    def output(
        self,
        x: Tensor,
        w_norm: Tensor | None,
        w_out: Tensor,
        b_out: Tensor | None = None,
        softcap: float = 0.0,
        logit_scale: float = 0.0,
        b_norm: Tensor | None = None,
        norm_kind: str = "rms",
    ) -> Outputs:
        """The final norm (``result_norm``: the embeddings; ``norm_kind`` "rms" or "layer", with an
        optional bias) and the output projection, with an optional bias, division by ``logit_scale``
        (Granite) and final soft-capping (``result_output``: the logits)."""
        x = self.build_norm(x, w_norm, b_norm, kind=norm_kind, name="result_norm")
        logits = self.mm(w_out, x, b_out)
        if logit_scale:
            logits = ops.scale(logits, 1.0 / logit_scale)
        if softcap:
            logits = ops.scale(ops.tanh(ops.scale(logits, 1.0 / softcap)), softcap)
        return Outputs(self.cb(logits, "result_output"), embd=x)

    # -- pooling (embeddings) ---------------------------------------------------------------------
    def build_pooling(self, res: Outputs, pooling_type: int) -> Outputs:
        """llama.cpp's ``build_pooling`` + ``build_dense_out``: the per-sequence embedding of the
        ubatch's sequences from ``res.embd`` (all tokens are outputs): MEAN (``inp.pool_mean``),
        CLS / LAST (``inp.pool_rows``), RANK (the rows the family names, ``Architecture.rank_rows``,
        through the classification head: ``cls`` dense + the family's ``rank_act`` and ``cls.norm``
        where present, then ``cls.output``; a softmax where ``rank_softmax``: qwen3's yes/no head).
        Then the dense projections (``dense_2`` + bias, ``dense_3``: EmbeddingGemma), on the pooled
        rows or, without pooling, on every token. Names: ``result_embd_pooled``."""
        w, arch, inp = self.arch.w, self.hp.arch, self.inp
        x = res.embd
        if x is None:
            raise ModelLoadError(f"{arch}: the graph has no embeddings output to pool")
        try:
            pooling_type = PoolingType(pooling_type)
        except ValueError:
            raise ModelLoadError(
                f"pooling type {pooling_type} is not 0 none, 1 mean, 2 cls, 3 last or 4 rank"
            ) from None
        rows = self.arch.pooled_rows(pooling_type)
        if rows == PoolingType.NONE:
            cur = x
        elif rows == PoolingType.MEAN:
            cur = ops.mul_mat(ops.cont(ops.transpose(x)), inp.pool_mean)  # [S, T] x [T, E] -> [S, E]
        else:  # CLS, LAST
            cur = ops.get_rows(x, inp.pool_rows)
        if pooling_type == PoolingType.RANK:
            if "cls.output.weight" not in w and "cls.weight" not in w:
                raise ModelLoadError(
                    f"{arch}: pooling type rank needs a classification head (cls.weight or cls.output.weight)"
                )
            if "cls.weight" in w:
                cur = self.mm(w["cls.weight"], cur, w.get("cls.bias"))
                cur = ops.gelu(cur) if self.arch.rank_act == "gelu" else ops.tanh(cur)
                if "cls.norm.weight" in w:
                    cur = self.build_norm(cur, w["cls.norm.weight"], w.get("cls.norm.bias"), kind="layer")
            if "cls.output.weight" in w:
                cur = self.mm(w["cls.output.weight"], cur, w.get("cls.output.bias"))
            if self.arch.rank_softmax:
                cur = ops.soft_max(cur)
        if pooling_type != PoolingType.NONE:
            cur = self.cb(cur, "result_embd_pooled")
        if "dense_2.weight" in w or "dense_3.weight" in w:
            if "dense_2.weight" in w:
                cur = self.mm(w["dense_2.weight"], cur, w.get("dense_2.bias"))
            if "dense_3.weight" in w:
                cur = self.mm(w["dense_3.weight"], cur)
            cur = self.cb(cur, "result_embd_pooled")
        if pooling_type == PoolingType.NONE:  # per token (through the dense projections, if any)
            return Outputs(res.logits, cur)
        return Outputs(res.logits, res.embd, cur)


def longrope_for_layer(arch: Architecture, il: int, n_ctx: int = 0) -> Rope:
    """Phi-3's LongRoPE (phi3, phimoe): the long factors (``rope_factors_long.weight``) for a context
    of ``n_ctx`` cells (default the training one) above the original context, the short ones below."""
    hp = arch.hp
    n_ctx = n_ctx or hp.n_ctx_train
    factors = arch.w.get(
        "rope_factors_long.weight" if n_ctx > hp.n_ctx_orig_yarn else "rope_factors_short.weight"
    )
    return rope_for_layer(hp, il, freq_factors=factors)


@dataclass
class SectionRope(Rope):
    """Rope over sections of the rotary dims (ggml's ``rope_multi``; text: one position for all)."""

    sections: tuple[int, ...] = ()
    section_mode: int = ops.ROPE_IMROPE

    def apply(self, x: Tensor, pos: Tensor) -> Tensor:
        if not self.sections:
            return super().apply(x, pos)
        return ops.rope(
            x, pos, self.n_dims, mode=self.section_mode, freq_base=self.freq_base, freq_scale=self.freq_scale,
            n_ctx_orig=self.n_ctx_orig, ext_factor=self.ext_factor, attn_factor=self.attn_factor,
            beta_fast=self.beta_fast, beta_slow=self.beta_slow, sections=self.sections,
        )  # fmt: skip


def neox(hp: HParams) -> HParams:
    hp.rope_type = ROPE_NEOX
    return hp


__all__ = [
    "GGMLType",
    "GraphBuilder",
    "Inputs",
    "KVInputs",
    "Outputs",
    "Rope",
    "SectionRope",
    "TensorLoader",
    "Weights",
    "load_head_tensors",
    "longrope_for_layer",
    "neox",
    "rope_for_layer",
]
