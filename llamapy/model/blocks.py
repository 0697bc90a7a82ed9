"""Shared building blocks of the architectures: graph inputs, weight access by GGUF name, and the
graph builder with ``build_norm`` / ``build_attn`` / ``build_ffn`` / ``build_moe_ffn``.

Everything here builds ggml graph nodes (``llamapy.ggml.ops``); nothing is computed. The context
executes the graph and reuses it while the shapes (tokens, outputs, KV cells) repeat.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..ggml import ops
from ..ggml.tensor import Tensor
from ..ggml.types import GGMLType
from .hparams import ROPE_NEOX, HParams, ModelLoadError

if TYPE_CHECKING:
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
    n_tokens: int
    n_outputs: int
    pos: Tensor  # I32[T]
    tokens: Tensor | None = None  # I32[T]
    embd: Tensor | None = None  # F32[T, n_embd]
    out_ids: Tensor | None = None  # I32[n_outputs] (None: every token is an output)
    kv: dict[int, KVInputs] = field(default_factory=dict)  # layer -> its cache inputs
    n_ctx: int = 0  # context size (per sequence), for rope long/short factor choice
    flash_attn: bool = True  # fused attention (else mul_mat + soft_max + mul_mat)


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
    """Builds one ubatch's graph from shared blocks; ``hp`` and ``inp`` are the model's and the ubatch's."""

    def __init__(self, hp: HParams, inp: Inputs) -> None:
        self.hp = hp
        self.inp = inp
        self.embd_out: Tensor | None = None

    # -- basic pieces -----------------------------------------------------------------------------
    def embed(self, tok_embd: Tensor, scale: float | None = None) -> Tensor:
        inp = self.inp
        x = inp.embd if inp.embd is not None else ops.get_rows(tok_embd, inp.tokens)
        if scale is not None:
            x = ops.scale(x, scale)
        return x

    @staticmethod
    def mm(w: Tensor, x: Tensor, b: Tensor | None = None) -> Tensor:
        """``x @ w.T`` (+ bias): x[..., K], w[N, K] -> [..., N]."""
        y = ops.mul_mat(w, x)
        return ops.add(y, b) if b is not None else y

    def build_norm(self, x: Tensor, w: Tensor | None, b: Tensor | None = None, kind: str = "rms") -> Tensor:
        if kind == "rms":
            x = ops.rms_norm(x, self.hp.norm_rms_eps)
        else:
            x = ops.norm(x, self.hp.norm_eps)
        if w is not None:
            x = ops.mul(x, w)
        if b is not None:
            x = ops.add(x, b)
        return x

    def select_outputs(self, il: int, *xs: Tensor) -> tuple[Tensor, ...]:
        """At the last layer keep only the rows that produce outputs (as llama.cpp's inp_out_ids)."""
        if il != self.hp.n_layer - 1 or self.inp.out_ids is None:
            return xs
        return tuple(ops.get_rows(x, self.inp.out_ids) for x in xs)

    # -- attention --------------------------------------------------------------------------------
    def qkv(self, h: Tensor, blk: Weights, il: int) -> tuple[Tensor, Tensor, Tensor]:
        """Q [T, H, Dk], K [T, Hkv, Dk], V [T, Hkv, Dv] from separate or fused (attn_qkv) projections."""
        hp = self.hp
        T = self.inp.n_tokens
        nh, nkv, dk, dv = hp.n_head[il], hp.n_head_kv[il], hp.n_embd_head_k, hp.n_embd_head_v
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
        self, q: Tensor, k: Tensor, v: Tensor, il: int, kq_scale: float, softcap: float = 0.0
    ) -> Tensor:
        """Store K/V of the new tokens in the layer's cache cells and attend over the cache.

        q [T, H, Dk], k [T, Hkv, Dk], v [T, Hkv, Dv] -> [T, H * Dv] (before the output projection).
        """
        hp = self.hp
        T = self.inp.n_tokens
        kvi = self.inp.kv[il]
        nkv, dk, dv = hp.n_head_kv[il], hp.n_embd_head_k, hp.n_embd_head_v
        kbuf, vbuf = kvi.k[il], kvi.v[il]
        k_st = ops.set_rows(kbuf, ops.reshape(k, (T, nkv * dk)), kvi.idx)
        v_st = ops.set_rows(
            vbuf, ops.reshape(ops.cont(v) if not v.is_contiguous() else v, (T, nkv * dv)), kvi.idx
        )
        kc = ops.view(k_st, (kvi.n_kv, nkv, dk))
        vc = ops.view(v_st, (kvi.n_kv, nkv, dv))
        if self.inp.flash_attn:
            out = ops.flash_attn_ext(q, kc, vc, kvi.mask, kq_scale, logit_softcap=softcap)
            return ops.reshape(out, (T, q.shape[1] * dv))
        # unfused: softmax(q k^T * scale + mask) v, heads as the batch axis
        qh = ops.cont(ops.permute(q, (1, 0, 2)))  # [H, T, Dk]
        kh = ops.cont(ops.permute(kc, (1, 0, 2)))  # [Hkv, n_kv, Dk]
        kq = ops.mul_mat(kh, qh)  # [H, T, n_kv]
        if softcap:
            kq = ops.scale(ops.tanh(ops.scale(kq, kq_scale / softcap)), softcap)
            kq_scale = 1.0
        kq = ops.soft_max(kq, kvi.mask, scale=kq_scale)
        vt = ops.cont(ops.permute(vc, (1, 2, 0)))  # [Hkv, Dv, n_kv]
        out = ops.mul_mat(vt, kq)  # [H, T, Dv]
        return ops.reshape(ops.cont(ops.permute(out, (1, 0, 2))), (T, q.shape[1] * dv))

    def attention(
        self,
        h: Tensor,
        blk: Weights,
        il: int,
        rope: Rope | None,
        *,
        qk_norm: bool = False,
        q_scale: float | None = None,
        kq_scale: float | None = None,
        softcap: float = 0.0,
    ) -> Tensor:
        """The whole attention sub-block: projections, optional q/k RMS norm, rope, cache, output."""
        q, k, v = self.qkv(h, blk, il)
        if qk_norm:
            q = self.build_norm(q, blk["attn_q_norm.weight"])
            k = self.build_norm(k, blk["attn_k_norm.weight"])
        if rope is not None:
            q = rope.apply(q, self.inp.pos)
            k = rope.apply(k, self.inp.pos)
        if q_scale is not None:
            q = ops.scale(q, q_scale)
        if kq_scale is None:
            kq_scale = 1.0 / math.sqrt(self.hp.n_embd_head_k)
        out = self.build_attn(q, k, v, il, kq_scale, softcap)
        return self.mm(blk["attn_output.weight"], out, blk.get("attn_output.bias"))

    # -- feed-forward -----------------------------------------------------------------------------
    def build_ffn(self, h: Tensor, blk: Weights, act: str = "silu") -> Tensor:
        """Gated feed-forward (SwiGLU / GeGLU), or a fused up+gate projection (first half gated)."""
        up = self.mm(blk["ffn_up.weight"], h, blk.get("ffn_up.bias"))
        wg = blk.get("ffn_gate.weight")
        if wg is not None:
            gate = self.mm(wg, h, blk.get("ffn_gate.bias"))
        else:  # fused: [gate | up]
            n = up.shape[-1] // 2
            gate = ops.cont(ops.view(up, (*up.shape[:-1], n), up.strides, 0))
            up = ops.cont(ops.view(up, (*up.shape[:-1], n), up.strides, 4 * n))
        x = ops.swiglu(gate, up) if act == "silu" else ops.geglu(gate, up)
        return self.mm(blk["ffn_down.weight"], x, blk.get("ffn_down.bias"))

    def build_moe_ffn(self, h: Tensor, blk: Weights, norm_w: bool) -> Tensor:
        """Mixture of experts with softmax routing over ``n_expert_used`` of ``n_expert`` SwiGLU experts."""
        hp = self.hp
        T = h.shape[0]
        k = hp.n_expert_used
        logits = self.mm(blk["ffn_gate_inp.weight"], h)  # [T, E]
        probs = ops.soft_max(logits)
        ids = ops.top_k(probs, k)  # I32[T, k]
        # gather probs[t, ids[t, j]] as a product with one-hot "experts" (get_rows is 2-D only)
        eye = ops.weight(
            "moe_onehot", GGMLType.F32, (hp.n_expert, 1, hp.n_expert), np.eye(hp.n_expert, dtype=np.float32)
        )
        w = ops.mul_mat_id(eye, ops.reshape(probs, (T, 1, hp.n_expert)), ids)  # [T, k, 1]
        if norm_w:
            w = ops.div(w, ops.reshape(ops.sum_rows(ops.reshape(w, (T, k))), (T, 1, 1)))
        x = ops.reshape(h, (T, 1, h.shape[-1]))
        up = ops.mul_mat_id(blk["ffn_up_exps.weight"], x, ids)  # [T, k, n_ff]
        gate = ops.mul_mat_id(blk["ffn_gate_exps.weight"], x, ids)
        y = ops.mul_mat_id(blk["ffn_down_exps.weight"], ops.swiglu(gate, up), ids)  # [T, k, n_embd]
        y = ops.mul(y, w)
        return ops.reshape(ops.sum_rows(ops.cont(ops.permute(y, (0, 2, 1)))), (T, hp.n_embd))

    # -- output -----------------------------------------------------------------------------------
    def output(self, x: Tensor, w_norm: Tensor | None, w_out: Tensor, softcap: float = 0.0) -> Tensor:
        x = self.build_norm(x, w_norm)
        self.embd_out = x  # the context reads it in embeddings mode
        logits = self.mm(w_out, x)
        if softcap:
            logits = ops.scale(ops.tanh(ops.scale(logits, 1.0 / softcap)), softcap)
        return logits


def neox(hp: HParams) -> HParams:
    hp.rope_type = ROPE_NEOX
    return hp


__all__ = [
    "GGMLType",
    "GraphBuilder",
    "Inputs",
    "KVInputs",
    "Rope",
    "TensorLoader",
    "Weights",
    "neox",
    "rope_for_layer",
]
