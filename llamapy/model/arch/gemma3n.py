"""Gemma 3n (text): Gemma 4's attention (RMS-normed q/k, unscaled RMS norm on v, attention scale 1, KV
sharing, per-layer embeddings) inside AltUp: the hidden state is ``n_altup`` streams (the embedding
plus ``altup_proj`` projections of it, rescaled to its magnitude); each layer predicts all streams from
the active one, runs attention, a LAuReL low-rank residual and the GeGLU FFN (the first layers with
gaussian top-k activation sparsity) on the active prediction, corrects every stream by the innovation,
and adds the per-layer embedding branch to the other streams; at the end ``altup_unembd_proj`` brings the
streams back and they are averaged. As llama.cpp's ``gemma3n-iswa.cpp`` (transformers' ``Gemma3n``).

Stream tensors are ``F32[n_altup, T, n_embd]`` (llama.cpp's ``[n_embd, n_tokens, n_altup]``)."""

from __future__ import annotations

import math

import numpy as np

from ...ggml import ops
from ...ggml.tensor import Tensor
from ...ggml.types import GGMLType
from ..blocks import GraphBuilder, Outputs, Rope, TensorLoader, Weights, rope_for_layer
from ..gemma_blocks import kv_shared_attention, per_layer_inputs, read_kv_sharing
from ..hf import HFConvert
from ..hf_shared import gemma3_params, gemma3_vocab
from ..hparams import ROPE_NEOX, HParams, MetaReader, ModelLoadError, swa_pattern
from . import Architecture, register

# llama.cpp's default when the file has no activation_sparsity_scale: the first 10 layers keep the
# activations above mean + 1.6449 std (the 95th percentile of a normal), as the released models
N_LAYER_SPARSITY = 10
SPARSITY_STD_MUL = 1.6448533535003662


def read_sparsity(hp: HParams, md: MetaReader) -> list[float]:
    v = md.raw("activation_sparsity_scale")
    if v is None:
        return [SPARSITY_STD_MUL if il < N_LAYER_SPARSITY else -math.inf for il in range(hp.n_layer)]
    arr = np.asarray(v, dtype=np.float64)
    if arr.ndim != 1 or len(arr) != hp.n_layer or np.isnan(arr).any():
        raise md._err(f"activation_sparsity_scale must hold one number per layer ({hp.n_layer}), got {v!r}")
    return [float(x) for x in arr]


@register("gemma3n")
class Gemma3n(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX
        hp.f_attention_scale = 1.0
        hp.n_swa = md.u32("attention.sliding_window", 512) or 0
        hp.swa_layers = swa_pattern(md, hp.n_layer, 5)
        hp.rope_freq_base_swa = md.f32("rope.freq_base_swa", 10000.0)
        hp.rope_freq_scale_swa = 1.0
        hp.f_final_logit_softcapping = md.f32("final_logit_softcapping", 30.0) or 0.0
        if hp.n_embd_head_k != hp.n_embd_head_v:
            raise md._err(f"K head size {hp.n_embd_head_k} != V head size {hp.n_embd_head_v}")
        read_kv_sharing(hp, md)
        hp.n_embd_per_layer = md.u32("embedding_length_per_layer_input", required=True) or 0
        if not hp.n_embd_per_layer:
            raise md._err("embedding_length_per_layer_input must be positive")
        hp.n_altup = md.u32("altup.num_inputs", 4) or 0
        hp.i_altup_act = md.u32("altup.active_idx", 0) or 0
        if hp.n_altup < 2 or hp.i_altup_act >= hp.n_altup:
            raise md._err(
                f"altup.num_inputs {hp.n_altup} must be 2+, altup.active_idx {hp.i_altup_act} below it"
            )
        hp.activation_sparsity_scale = read_sparsity(hp, md)

    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        D, P, A = hp.n_embd, hp.n_embd_per_layer, hp.n_altup
        t("token_embd.weight", (hp.n_vocab, D))
        t("output_norm.weight", (D,))
        t("output.weight", (hp.n_vocab, D), required=False)
        t("per_layer_token_embd.weight", (hp.n_vocab, hp.n_layer * P))
        t("per_layer_model_proj.weight", (hp.n_layer * P, D))
        t("per_layer_proj_norm.weight", (P,))
        t("altup_proj.weight", (A - 1, D, D))
        t("altup_unembd_proj.weight", (A - 1, D, D))
        for il in range(hp.n_layer):
            nh, nkv, dk, _ = hp.heads(il)
            for name in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm", "post_norm"):
                t.layer(il, f"{name}.weight", (D,))
            t.layer(il, "attn_q.weight", (nh * dk, D))
            t.layer(il, "attn_q_norm.weight", (dk,))
            t.layer(il, "attn_output.weight", (D, nh * dk))
            own = hp.kv_layer(il) == il  # a layer that reuses K/V has no K/V projections
            t.layer(il, "attn_k.weight", (nkv * dk, D), required=own)
            t.layer(il, "attn_v.weight", (nkv * dk, D), required=own)
            t.layer(il, "attn_k_norm.weight", (dk,), required=own)
            n_ff = hp.n_ff[il]
            t.layer(il, "ffn_gate.weight", (n_ff, D))
            t.layer(il, "ffn_up.weight", (n_ff, D))
            t.layer(il, "ffn_down.weight", (D, n_ff))
            t.layer(il, "inp_gate.weight", (P, D))
            t.layer(il, "proj.weight", (D, P))
            t.layer(il, "altup_correct_coef.weight", (A, A))
            t.layer(il, "altup_correct_scale.weight", (D,))
            t.layer(il, "altup_predict_coef.weight", (A * A, A))
            t.layer(il, "altup_router.weight", (A, D))
            t.layer(il, "altup_router_norm.weight", (D,))
            lw = t.layer(il, "laurel_l.weight", None)
            if lw is None or len(lw.shape) != 2 or lw.shape[1] != D:
                raise ModelLoadError(
                    f"layer {il}: laurel_l.weight has shape {lw and lw.shape}, expected [rank, {D}]"
                )
            t.layer(il, "laurel_r.weight", (D, lw.shape[0]))
            t.layer(il, "laurel_post_norm.weight", (D,))
        self._finish_tensors(t)

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        return rope_for_layer(self.hp, il)

    def layer_moe(self, il: int) -> bool:
        return False

    # -- graph --------------------------------------------------------------------------------------
    def build(self, g: GraphBuilder) -> Outputs:
        hp, inp = self.hp, g.inp
        T, A, D = inp.n_tokens, hp.n_altup, hp.n_embd
        x = g.embed(self.w["token_embd.weight"], scale=math.sqrt(D) if inp.tokens is not None else None)
        ple = per_layer_inputs(self, g, x)
        # the other streams: altup_proj[i] x, rescaled to x's magnitude
        others = ops.mul_mat_id(self.w["altup_proj.weight"], ops.reshape(x, (T, 1, D)), self._stream_ids(T))
        others = ops.mul(rms_normed(others), ops.reshape(rms(x), (T, 1, 1)))  # [T, A - 1, D], x's magnitude
        cur = g.cb(
            ops.concat(ops.reshape(x, (1, T, D)), ops.cont(ops.permute(others, (1, 0, 2))), 0), "inp_stacked"
        )
        for il, blk in enumerate(self.blocks):
            cur = self.layer(g, cur, ple, blk, il)
        # merge: unembed the other streams to the active one's magnitude, average them all
        act = stream(cur, hp.i_altup_act)
        rest = ops.cont(ops.permute(ops.view(cur, (A - 1, T, D), cur.strides, cur.strides[0]), (1, 0, 2)))
        un = ops.mul_mat_id(self.w["altup_unembd_proj.weight"], rest, self._stream_ids(T))  # [T, A - 1, D]
        un = g.cb(ops.mul(rms_normed(un), ops.reshape(rms(act), (T, 1, 1))), "altup_unembd")
        x = ops.add(stream(cur, 0), ops.reshape(ops.sum_rows(ops.cont(ops.permute(un, (0, 2, 1)))), (T, D)))
        x = g.cb(ops.scale(x, 1.0 / A), "unembd_merged")
        if inp.out_ids is not None:
            x = ops.get_rows(x, inp.out_ids)
        return g.output(
            x, self.w["output_norm.weight"], self.output_weight(), softcap=hp.f_final_logit_softcapping
        )

    def _stream_ids(self, T: int) -> Tensor:
        """I32[T, A - 1]: 0 .. A-2 on every row (mul_mat_id with one "expert" per stream)."""
        ids = np.tile(np.arange(self.hp.n_altup - 1, dtype=np.int32), (T, 1))
        return ops.weight("altup_stream_ids", GGMLType.I32, ids.shape, ids)

    def layer(self, g: GraphBuilder, cur: Tensor, ple: Tensor, blk: Weights, il: int) -> Tensor:
        hp, cb = self.hp, g.cb
        pred = self.altup_predict(g, cur, blk, il)  # [A, T, D]
        active = cb(stream(pred, hp.i_altup_act), "active_prediction", il)
        h = g.build_norm(active, blk["attn_norm.weight"], name="attn_norm", il=il)
        lo = g.mm(blk["laurel_r.weight"], g.mm(blk["laurel_l.weight"], h))
        lo = cb(ops.add(h, g.build_norm(lo, blk["laurel_post_norm.weight"])), "laurel_out", il)
        a = kv_shared_attention(self, g, h, blk, il)
        a = g.build_norm(a, blk["post_attention_norm.weight"], name="attn_post_norm", il=il)
        a = cb(ops.add(active, a), "attn_gated", il)
        a = cb(ops.scale(ops.add(a, lo), 1.0 / math.sqrt(2.0)), "attn_laurel", il)
        f = g.build_norm(a, blk["ffn_norm.weight"], name="ffn_norm", il=il)
        f = self.ffn(g, f, blk, il)
        f = g.build_norm(f, blk["post_ffw_norm.weight"], name="ffn_post_norm", il=il)
        a = cb(ops.add(f, a), "attn_ffw_laurel_gated", il)
        corrected = self.altup_correct(g, pred, a, blk, il)  # [A, T, D]
        # the per-layer embedding branch, added to every stream but the first
        p = ops.mul(stream(corrected, hp.i_altup_act), blk["altup_correct_scale.weight"])
        p = ops.gelu(g.mm(blk["inp_gate.weight"], p))
        p = g.mm(blk["proj.weight"], ops.mul(p, per_layer_slice_all(g, ple, il)))
        p = g.build_norm(p, blk["post_norm.weight"], name="first_prediction_out", il=il)
        A, T, D = corrected.shape
        first = ops.view(corrected, (1, T, D), corrected.strides, 0)
        rest = ops.add(ops.view(corrected, (A - 1, T, D), corrected.strides, corrected.strides[0]), p)
        return cb(ops.concat(ops.cont(first), rest, 0), "l_out", il)

    def ffn(self, g: GraphBuilder, h: Tensor, blk: Weights, il: int) -> Tensor:
        """GeGLU; on the sparse layers the gate keeps only what exceeds mean + k std (gaussian top-k)."""
        gate = g.mm(blk["ffn_gate.weight"], h)
        k = self.hp.activation_sparsity_scale[il]
        if math.isfinite(k):
            d = ops.sub(gate, ops.mean(gate))
            std = ops.mean(ops.mul(d, ops.norm(gate, 1e-12)))  # = var / std (a population std)
            gate = ops.relu(ops.sub(d, ops.scale(std, k)))
        up = g.mm(blk["ffn_up.weight"], h)
        return g.cb(g.mm(blk["ffn_down.weight"], ops.mul(up, ops.gelu(gate))), "ffn_out", il)

    def router_modalities(self, g: GraphBuilder, x: Tensor, blk: Weights, il: int) -> Tensor:
        """tanh(altup_router(norm(x) / n_embd)): F32[T, A]."""
        r = g.build_norm(x, blk["altup_router_norm.weight"])
        return g.cb(
            ops.tanh(g.mm(blk["altup_router.weight"], ops.scale(r, 1.0 / self.hp.n_embd))), "modalities", il
        )

    def altup_predict(self, g: GraphBuilder, cur: Tensor, blk: Weights, il: int) -> Tensor:
        """pred[j] = cur[j] + sum_i coef[t, j, i] cur[i], coef from the active stream's modalities."""
        A, T, D = cur.shape
        m = self.router_modalities(g, stream(cur, self.hp.i_altup_act), blk, il)
        coefs = g.cb(ops.reshape(g.mm(blk["altup_predict_coef.weight"], m), (T, A, A)), "all_coefs", il)
        streams = ops.cont(ops.permute(cur, (1, 2, 0)))  # [T, D, A]
        pred = ops.mul_mat(streams, coefs)  # [T, A(j), D] = coefs[t] @ cur[:, t]
        return g.cb(ops.add(ops.cont(ops.permute(pred, (1, 0, 2))), cur), "predictions", il)

    def altup_correct(
        self, g: GraphBuilder, pred: Tensor, activated: Tensor, blk: Weights, il: int
    ) -> Tensor:
        """corrected[i] = pred[i] + (activated - pred[active]) * (1 + coef[t, i])."""
        A, T, D = pred.shape
        m = self.router_modalities(g, activated, blk, il)
        innovation = g.cb(ops.sub(activated, stream(pred, self.hp.i_altup_act)), "innovation", il)
        coefs = ops.scale(g.mm(blk["altup_correct_coef.weight"], m), 1.0, 1.0)  # [T, A]
        coefs = ops.reshape(ops.cont(ops.permute(coefs, (1, 0))), (A, T, 1))
        spread = ops.add(ops.scale(pred, 0.0), innovation)  # innovation on every stream: [A, T, D]
        return g.cb(ops.add(ops.mul(spread, coefs), pred), "corrected", il)


def stream(x: Tensor, i: int) -> Tensor:
    """Stream ``i`` of F32[A, T, D] as a contiguous F32[T, D]."""
    _, T, D = x.shape
    return ops.cont(ops.view(x, (T, D), x.strides[1:], i * x.strides[0]))


def rms(x: Tensor) -> Tensor:
    """sqrt(mean(x^2)) over the last axis (kept as size 1), as mean(x * x / rms(x)): no sqrt op needed."""
    return ops.mean(ops.mul(x, ops.rms_norm(x, 1e-12)))


def rms_normed(x: Tensor) -> Tensor:
    """x / max(rms(x), sqrt(1e-5)) (transformers clamps the mean square at 1e-5)."""
    return ops.rms_norm(x, 1e-5)


def per_layer_slice_all(g: GraphBuilder, ple: Tensor, il: int) -> Tensor:
    """Layer ``il``'s PLE input for every token (Gemma 3n selects the output rows only at the end)."""
    T, L, P = ple.shape
    return ops.cont(ops.view(ple, (T, P), (ple.strides[0], ple.strides[2]), il * ple.strides[1]))


__all__ = ["Gemma3n"]


# ---------------------------------------------------------------------------------------------
# llamapy convert: llama.cpp's Gemma3NModel (Gemma3Model's keys and vocab, norms stored as they are)


def _hf_params(ctx, kv) -> None:
    """Gemma3NModel.set_gguf_parameters: AltUp, per-layer inputs, KV sharing, the activation sparsity as
    the normal quantile of each layer's target (torch's float32 Normal.icdf)."""
    from statistics import NormalDist

    gemma3_params(ctx, kv)
    hp = ctx.hparams
    kv.add_altup_active_idx(hp["altup_active_idx"])
    kv.add_altup_num_inputs(hp["altup_num_inputs"])
    kv.add_embedding_length_per_layer_input(hp["hidden_size_per_layer_input"])
    kv.add_shared_kv_layers(hp["num_kv_shared_layers"])
    scale = []
    for s in hp["activation_sparsity_pattern"]:
        x = float(np.float32(2) * np.float32(s) - np.float32(1))  # erfinv(2 p - 1) sqrt(2), in float32
        erfinv = (
            -math.inf if x <= -1 else math.inf if x >= 1 else NormalDist().inv_cdf((x + 1) / 2) / math.sqrt(2)
        )
        scale.append(float(np.float32(erfinv) * np.float32(math.sqrt(2))))
    kv.add_activation_sparsity_scale(scale)
    kv.add_sliding_window_pattern([t == "sliding_attention" for t in hp["layer_types"]])


def _hf_tensor(ctx, name, data, bid):
    """Gemma3NModel.modify_tensors: the token and per-layer embeddings zero-padded to vocab_size (the
    vision/audio tokens), the three AltUp (un)embedding projections stacked, ``*_scale`` as weights."""
    if name.endswith("_scale"):
        name += ".weight"
    if "embed_tokens.weight" in name or "embed_tokens_per_layer" in name:
        n_vocab = ctx.hparams.get("vocab_size", 262400)
        if data.shape[0] < n_vocab:
            data = np.concatenate([data, np.zeros((n_vocab - data.shape[0], data.shape[1]), data.dtype)])
        return [(name, data)]
    for key in ("altup_unembed_projections", "altup_projections"):
        if f"{key}." in name:
            parts = ctx.state.setdefault(key, {})
            parts[int(name.split(f"{key}.")[1].split(".")[0])] = data
            if len(parts) < 3:
                return []
            stacked = np.stack([parts.pop(i) for i in range(3)])
            return [(f"model.{key}.weight", stacked)]
    return [(name, data)]


HF_CONVERT = HFConvert(
    "gemma3n",
    ("Gemma3nForCausalLM", "Gemma3nForConditionalGeneration"),
    vocab=gemma3_vocab,
    params=_hf_params,
    tensor=_hf_tensor,
)
