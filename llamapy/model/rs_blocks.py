"""Building blocks of the recurrent layers (graph nodes only), shared by the hybrid families: the causal
conv over the conv state (llama.cpp's ``build_conv_state`` + ``ggml_ssm_conv``), the gated delta rule
layer of Qwen3.5 / Qwen3-Next (``build_gated_delta_net``), the gated RMSNorm, hparams reading of the
``ssm.*`` keys, Qwen3.5 / Qwen3-Next's hparams and gated attention, and the Mamba2 mixer's hparams and tensors (mamba2, falcon-h1, granitehybrid,
nemotron-h). The memory's ``RSInputs`` (``Inputs.rs``) say which state rows a ubatch reads and writes;
tokens are sequence-major: ``n_seqs`` streams of ``n_seq_tokens`` tokens.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..ggml import ops
from ..ggml.tensor import Tensor
from .blocks import GraphBuilder, TensorLoader, Weights
from .hparams import ROPE_NEOX, HParams, MetaReader, ModelLoadError

if TYPE_CHECKING:
    from .arch import Architecture

__all__ = [
    "build_conv",
    "build_gated_attention",
    "build_gated_delta_net",
    "build_mamba2",
    "build_shortconv",
    "build_norm_gated",
    "load_mamba2_hparams",
    "load_mamba2_tensors",
    "load_qwen35_hparams",
    "read_ssm_hparams",
    "recurrent_every",
]


def read_ssm_hparams(hp: HParams, md: MetaReader) -> None:
    """llama.cpp's ``ssm.conv_kernel``, ``ssm.inner_size``, ``ssm.state_size``, ``ssm.time_step_rank``,
    ``ssm.group_count`` (all required)."""
    hp.ssm_d_conv = md.u32("ssm.conv_kernel", required=True)
    hp.ssm_d_inner = md.u32("ssm.inner_size", required=True)
    hp.ssm_d_state = md.u32("ssm.state_size", required=True)
    hp.ssm_dt_rank = md.u32("ssm.time_step_rank", required=True)
    hp.ssm_n_group = md.u32("ssm.group_count", required=True)
    if hp.ssm_d_conv < 2:
        raise md._err(f"ssm.conv_kernel = {hp.ssm_d_conv} must be at least 2")
    if not hp.ssm_dt_rank or not hp.ssm_n_group or hp.ssm_dt_rank % hp.ssm_n_group:
        raise md._err(
            f"ssm.time_step_rank {hp.ssm_dt_rank} (heads) must be a positive multiple of ssm.group_count "
            f"{hp.ssm_n_group}"
        )
    if not hp.ssm_d_inner or hp.ssm_d_inner % hp.ssm_dt_rank:
        raise md._err(
            f"ssm.inner_size {hp.ssm_d_inner} is not a multiple of ssm.time_step_rank {hp.ssm_dt_rank}"
        )


def recurrent_every(md: MetaReader, n_layer: int, n_extra: int = 0) -> list[bool]:
    """Which layers are recurrent: ``attention.recurrent_layers`` (per layer) or every layer but each
    ``full_attention_interval``-th (default 4), as llama.cpp's Qwen3-Next / Qwen3.5 loaders."""
    v = md.raw("attention.recurrent_layers")
    if v is not None:
        arr = list(v)
        if len(arr) != n_layer + n_extra:  # (n_extra: MTP blocks after the trunk, counted in the file)
            raise md._err(f"attention.recurrent_layers has {len(arr)} entries, expected {n_layer + n_extra}")
        return [bool(x) for x in arr[:n_layer]]
    every = md.u32("full_attention_interval", 4)
    if not every:
        raise md._err("full_attention_interval is 0")
    return [(il + 1) % every != 0 for il in range(n_layer)]


def build_norm_gated(g: GraphBuilder, x: Tensor, w: Tensor, gate: Tensor, il: int) -> Tensor:
    """``rms_norm(x) * w * silu(gate)`` over the last axis (Qwen3.5's RMSNormGated)."""
    n = ops.mul(ops.rms_norm(x, g.hp.norm_rms_eps), w)
    return g.cb(ops.mul(n, ops.silu(gate)), "ssm_norm_gated", il)


def build_conv(g: GraphBuilder, x: Tensor, kernel: Tensor, il: int) -> Tensor:
    """Causal depthwise conv of ``x [T, C]`` with ``kernel [C, K]`` after the layer's conv state (the
    last K - 1 inputs of each stream), which is then replaced by the new last K - 1: -> ``[S, n_t, C]``."""
    rs = g.inp.rs
    n_s, n_t = rs.n_seqs, rs.n_seq_tokens
    ch, k = kernel.shape
    if x.shape[-1] != ch:
        raise ModelLoadError(f"layer {il}: conv kernel {kernel.shape} does not fit input {x.shape}")
    buf = rs.r[il]
    if buf.shape[1] != (k - 1) * ch:
        raise ModelLoadError(
            f"layer {il}: conv state of {buf.shape[1]} floats, the kernel {kernel.shape} needs {(k - 1) * ch}"
        )
    state = ops.reshape(rs.read(buf), (n_s, k - 1, ch))
    sx = g.cb(ops.concat(state, ops.reshape(x, (n_s, n_t, ch)), axis=1), "conv_input", il)
    last = ops.view(sx, (n_s, k - 1, ch), sx.strides, offset=4 * n_t * ch)
    rs.write(buf, last)  # (in place: copied straight from sx)
    return g.cb(ops.ssm_conv(sx, kernel), "conv_output_raw", il)


def _grouped_to_value_heads(x: Tensor, T: int, hk: int, hv: int, d: int) -> Tensor:
    """``x`` F32 ``[T, hk, d]`` (any strides) -> ``[T, hv, d]``, value head h = key head h // (hv / hk)
    (a repeat-interleave through a zero-stride view: Qwen3-Next keeps its value heads grouped)."""
    r = hv // hk
    rep = ops.view(x, (T, hk, r, d), (x.strides[0], x.strides[1], 0, x.strides[2]), 0)
    return ops.reshape(ops.cont(rep), (T, hv, d))


def build_gated_delta_net(g: GraphBuilder, h: Tensor, blk: Weights, il: int, grouped: bool = False) -> Tensor:
    """Qwen3.5 / Qwen3-Next linear attention: projections (``attn_qkv``, gate ``attn_gate``, ``ssm_beta`` and
    ``ssm_alpha``, or Qwen3-Next's ``ssm_ba`` of ``[beta | alpha]`` per key head), causal conv + SiLU,
    l2-normed q/k, decay ``ssm_a * softplus(alpha + ssm_dt.bias)``, the gated delta rule over the layer's
    recurrent state, gated RMSNorm by ``ssm_norm``, ``ssm_out``. ``grouped``: value heads ordered by key
    head (Qwen3-Next) instead of tiled (llama.cpp's Qwen3.5 files)."""
    hp = g.hp
    rs = g.inp.rs
    n_s, n_t = rs.n_seqs, rs.n_seq_tokens
    T = n_s * n_t
    dk = hp.ssm_d_state
    hk, hv = hp.ssm_n_group, hp.ssm_dt_rank
    dv = hp.ssm_d_inner // hv
    qkv = g.cb(g.mm(blk["attn_qkv.weight"], h), "linear_attn_qkv_mixed", il)  # [T, 2 hk dk + hv dv]
    z = g.cb(g.mm(blk["attn_gate.weight"], h), "z", il)  # [T, hv dv]
    if "ssm_ba.weight" in blk:  # [T, hk, (beta r | alpha r)]
        r = hv // hk
        ba = ops.reshape(g.cb(g.mm(blk["ssm_ba.weight"], h), "linear_attn_mixed_ba", il), (T, hk, 2 * r))
        b = ops.reshape(ops.cont(ops.view(ba, (T, hk, r), ba.strides, 0)), (T, hv))
        alpha = ops.reshape(ops.cont(ops.view(ba, (T, hk, r), ba.strides, 4 * r)), (T, hv))
    else:
        b, alpha = g.mm(blk["ssm_beta.weight"], h), g.mm(blk["ssm_alpha.weight"], h)
    beta = g.cb(ops.sigmoid(b), "beta_sigmoid", il)  # [T, hv]
    sp = g.cb(ops.softplus(ops.add(alpha, blk["ssm_dt.bias"])), "a_softplus", il)
    decay = g.cb(ops.mul(sp, blk["ssm_a"]), "gate", il)  # log-decay, <= 0
    conv = g.cb(ops.silu(build_conv(g, qkv, blk["ssm_conv1d.weight"], il)), "conv_output_silu", il)
    ch = conv.shape[-1]
    st = (n_t * ch * 4, ch * 4)
    q = ops.view(conv, (n_s, n_t, hk, dk), (*st, dk * 4, 4), 0)
    k = ops.view(conv, (n_s, n_t, hk, dk), (*st, dk * 4, 4), 4 * hk * dk)
    v = ops.cont(ops.view(conv, (n_s, n_t, hv, dv), (*st, dv * 4, 4), 8 * hk * dk))
    if grouped and hk != hv:  # repeat q and k per value head; the op then maps heads one to one
        q = ops.reshape(
            _grouped_to_value_heads(ops.reshape(ops.cont(q), (T, hk, dk)), T, hk, hv, dk), (n_s, n_t, hv, dk)
        )
        k = ops.reshape(
            _grouped_to_value_heads(ops.reshape(ops.cont(k), (T, hk, dk)), T, hk, hv, dk), (n_s, n_t, hv, dk)
        )
    q = ops.scale(ops.l2_norm(q, hp.norm_rms_eps), 1.0 / math.sqrt(dk))
    k = ops.l2_norm(k, hp.norm_rms_eps)
    state = ops.reshape(rs.read(rs.s[il]), (n_s, hv, dk, dv))
    out = ops.gated_delta_net(
        q, k, v, ops.reshape(decay, (n_s, n_t, hv)), ops.reshape(beta, (n_s, n_t, hv)), state
    )
    g.cb(out, "gated_delta_net", il)
    ny = T * hv * dv
    y = ops.view(out, (T * hv, dv), None, 0)
    rs.write(rs.s[il], ops.view(out, (n_s, hv * dk * dv), None, 4 * ny))
    y = build_norm_gated(g, y, blk["ssm_norm.weight"], ops.reshape(z, (T * hv, dv)), il)
    return g.cb(g.mm(blk["ssm_out.weight"], ops.reshape(y, (T, hv * dv))), "linear_attn_out", il)


def build_shortconv(g: GraphBuilder, h: Tensor, blk: Weights, il: int) -> Tensor:
    """LFM2's gated short convolution: ``[b | c | x] = in_proj h``; ``y = c * conv(b * x)``; ``out_proj y``
    (the conv over the layer's conv state, no recurrent state)."""
    T = g.inp.n_tokens
    bcx = g.cb(g.mm(blk["shortconv.in_proj.weight"], h), "shortconv_in_proj", il)  # [T, 3 C]
    ch = bcx.shape[-1] // 3
    b, c, x = (ops.view(bcx, (T, ch), bcx.strides, 4 * i * ch) for i in range(3))
    conv = build_conv(g, ops.mul(ops.cont(b), x), blk["shortconv.conv.weight"], il)  # [S, n_t, C]
    y = ops.mul(ops.reshape(ops.cont(c), conv.shape), conv)
    return g.cb(g.mm(blk["shortconv.out_proj.weight"], ops.reshape(y, (T, ch))), "shortconv_out", il)


def build_mamba2(g: GraphBuilder, h: Tensor, blk: Weights, il: int) -> Tensor:
    """A Mamba2 mixer: ``[z | xBC | dt] = ssm_in h``; causal conv (+ bias) and SiLU over ``xBC``; the
    selective scan with ``n_group`` B/C groups over the layer's state (``dt = softplus(dt + ssm_dt.bias)``,
    ``A = ssm_a``), the D skip; ``y * silu(z)`` RMS-normed per group by ``ssm_norm``; ``ssm_out``."""
    hp = g.hp
    rs = g.inp.rs
    n_s, n_t = rs.n_seqs, rs.n_seq_tokens
    T = n_s * n_t
    di, ds, nh, ng = hp.ssm_d_inner, hp.ssm_d_state, hp.ssm_dt_rank, hp.ssm_n_group
    hd = di // nh
    ch = di + 2 * ng * ds
    zxbcdt = g.cb(g.mm(blk["ssm_in.weight"], h), "ssm_in", il)
    st = zxbcdt.strides
    z = ops.cont(ops.view(zxbcdt, (T, di), st, 0))
    xbc = ops.cont(ops.view(zxbcdt, (T, ch), st, 4 * di))
    dt = ops.cont(ops.view(zxbcdt, (T, nh), st, 4 * (di + ch)))
    conv = build_conv(g, xbc, blk["ssm_conv1d.weight"], il)
    if "ssm_conv1d.bias" in blk:
        conv = ops.add(conv, blk["ssm_conv1d.bias"])
    conv = g.cb(ops.silu(conv), "conv_output_silu", il)
    cs = (n_t * ch * 4, ch * 4)
    x = ops.cont(ops.view(conv, (n_s, n_t, nh, hd), (*cs, hd * 4, 4), 0))
    b = ops.cont(ops.view(conv, (n_s, n_t, ng, ds), (*cs, ds * 4, 4), 4 * di))
    c = ops.cont(ops.view(conv, (n_s, n_t, ng, ds), (*cs, ds * 4, 4), 4 * (di + ng * ds)))
    dt = g.cb(ops.softplus(ops.add(dt, blk["ssm_dt.bias"])), "dt_softplus", il)
    state = ops.reshape(rs.read(rs.s[il]), (n_s, nh, hd, ds))
    a = ops.reshape(blk["ssm_a"], (nh,))
    out = g.cb(ops.ssm_scan(state, x, ops.reshape(dt, (n_s, n_t, nh)), a, b, c), "ssm_scan", il)
    rs.write(rs.s[il], ops.view(out, (n_s, nh * hd * ds), None, 4 * T * di))
    y = ops.view(out, (T, nh, hd), None, 0)
    y = ops.add(y, ops.mul(ops.reshape(x, (T, nh, hd)), ops.reshape(blk["ssm_d"], (nh, 1))))
    y = ops.mul(ops.reshape(y, (T, di)), ops.silu(z))
    if "ssm_norm.weight" in blk:
        w = blk["ssm_norm.weight"]
        y = ops.reshape(ops.mul(ops.rms_norm(ops.reshape(y, (T, ng, di // ng)), hp.norm_rms_eps),
                                ops.reshape(w, (ng, di // ng))), (T, di))  # fmt: skip
    return g.cb(g.mm(blk["ssm_out.weight"], y), "ssm_out", il)


def build_mamba1(g: GraphBuilder, h: Tensor, blk: Weights, il: int) -> Tensor:
    """A Mamba (1) mixer as Jamba's: ``[x | z] = ssm_in h``; causal conv (+ bias), SiLU; ``[dt | B | C] =
    ssm_x x`` (RMS-normed by ``ssm_dt_norm`` / ``ssm_b_norm`` / ``ssm_c_norm`` where present); ``dt =
    softplus(ssm_dt dt + bias)``; the scan with one channel per head and a decay per state (``ssm_a``
    ``[d_inner, d_state]``), the D skip, ``y * silu(z)``, ``ssm_out``."""
    hp = g.hp
    rs = g.inp.rs
    n_s, n_t = rs.n_seqs, rs.n_seq_tokens
    T = n_s * n_t
    di, ds, r = hp.ssm_d_inner, hp.ssm_d_state, hp.ssm_dt_rank
    xz = g.cb(g.mm(blk["ssm_in.weight"], h), "ssm_in", il)
    x = ops.cont(ops.view(xz, (T, di), xz.strides, 0))
    z = ops.cont(ops.view(xz, (T, di), xz.strides, 4 * di))
    conv = build_conv(g, x, blk["ssm_conv1d.weight"], il)
    if "ssm_conv1d.bias" in blk:
        conv = ops.add(conv, blk["ssm_conv1d.bias"])
    x = ops.reshape(g.cb(ops.silu(conv), "conv_output_silu", il), (T, di))
    xdb = g.mm(blk["ssm_x.weight"], x)  # [T, r + 2 ds]
    dt, b, c = (
        ops.cont(ops.view(xdb, (T, n), xdb.strides, 4 * o)) for n, o in ((r, 0), (ds, r), (ds, r + ds))
    )
    for name, which in (("ssm_dt_norm", "dt"), ("ssm_b_norm", "b"), ("ssm_c_norm", "c")):
        if f"{name}.weight" in blk:
            t = {"dt": dt, "b": b, "c": c}[which]
            t = ops.mul(ops.rms_norm(t, hp.norm_rms_eps), blk[f"{name}.weight"])
            dt, b, c = (t if which == "dt" else dt), (t if which == "b" else b), (t if which == "c" else c)
    dt = g.cb(ops.softplus(g.mm(blk["ssm_dt.weight"], dt, blk["ssm_dt.bias"])), "dt_softplus", il)
    state = ops.reshape(rs.read(rs.s[il]), (n_s, di, 1, ds))
    out = ops.ssm_scan(
        state,
        ops.reshape(x, (n_s, n_t, di, 1)),
        ops.reshape(dt, (n_s, n_t, di)),
        blk["ssm_a"],
        ops.reshape(b, (n_s, n_t, 1, ds)),
        ops.reshape(c, (n_s, n_t, 1, ds)),
    )
    g.cb(out, "ssm_scan", il)
    rs.write(rs.s[il], ops.view(out, (n_s, di * ds), None, 4 * T * di))
    y = ops.add(ops.view(out, (T, di), None, 0), ops.mul(x, blk["ssm_d"]))
    y = ops.mul(y, ops.silu(z))
    return g.cb(g.mm(blk["ssm_out.weight"], y), "ssm_out", il)


def load_mamba2_hparams(hp: HParams, md: MetaReader, recurrent: list[bool]) -> None:
    read_ssm_hparams(hp, md)
    if hp.ssm_d_inner % hp.ssm_n_group:
        raise md._err(
            f"ssm.inner_size {hp.ssm_d_inner} is not a multiple of ssm.group_count {hp.ssm_n_group}"
        )
    hp.recurrent_layers = recurrent
    hp.n_embd_r = (hp.ssm_d_conv - 1) * (hp.ssm_d_inner + 2 * hp.ssm_n_group * hp.ssm_d_state)
    hp.n_embd_s = hp.ssm_d_state * hp.ssm_d_inner


def load_mamba2_tensors(arch: Architecture, t: TensorLoader, il: int) -> None:
    hp = arch.hp
    di, ds, nh, ng = hp.ssm_d_inner, hp.ssm_d_state, hp.ssm_dt_rank, hp.ssm_n_group
    ch = di + 2 * ng * ds
    t.layer(il, "ssm_in.weight", (2 * di + 2 * ng * ds + nh, hp.n_embd))
    t.layer(il, "ssm_conv1d.weight", (ch, hp.ssm_d_conv))
    t.layer(il, "ssm_conv1d.bias", (ch,), required=False)
    t.layer(il, "ssm_dt.bias", (nh,))
    t.layer(il, "ssm_a", (nh, 1))
    t.layer(il, "ssm_d", (nh, 1))
    t.layer(il, "ssm_norm.weight", (ng, di // ng), required=False)
    t.layer(il, "ssm_out.weight", (hp.n_embd, di))


def load_qwen35_hparams(hp: HParams, md: MetaReader) -> None:
    hp.rope_type = ROPE_NEOX
    hp.n_layer_nextn = md.u32("nextn_predict_layers", 0)  # MTP blocks after the trunk: not run
    if hp.n_layer_nextn:
        if hp.n_layer_nextn >= hp.n_layer:
            raise md._err(f"nextn_predict_layers {hp.n_layer_nextn} must be < block_count {hp.n_layer}")
        n = hp.n_layer = hp.n_layer - hp.n_layer_nextn
        hp.n_head, hp.n_head_kv, hp.n_ff, hp.swa_layers = (
            hp.n_head[:n],
            hp.n_head_kv[:n],
            hp.n_ff[:n],
            hp.swa_layers[:n],
        )
    read_ssm_hparams(hp, md)
    if hp.ssm_d_inner // hp.ssm_dt_rank != hp.ssm_d_state:
        raise ModelLoadError(
            f"{md.where}: {md.arch} needs value heads of ssm.state_size ({hp.ssm_d_state}) values, got "
            f"ssm.inner_size / ssm.time_step_rank = {hp.ssm_d_inner // hp.ssm_dt_rank}"
        )
    hp.recurrent_layers = recurrent_every(md, hp.n_layer, hp.n_layer_nextn)
    secs = md.raw("rope.dimension_sections")
    hp.rope_sections = tuple(int(s) for s in secs) if secs is not None else ()
    conv_ch = hp.ssm_d_inner + 2 * hp.ssm_n_group * hp.ssm_d_state
    hp.n_embd_r = (hp.ssm_d_conv - 1) * conv_ch
    hp.n_embd_s = hp.ssm_d_state * hp.ssm_d_inner
    hp.expert_weights_norm = True


def build_gated_attention(g: GraphBuilder, h: Tensor, blk: Weights, il: int) -> Tensor:
    """Full attention whose q projection also gives a per-head output gate: ``[q_h | gate_h]`` per head."""
    T = g.inp.n_tokens
    nh, nkv, d, _ = g.hp.heads(il)
    qg = ops.reshape(g.cb(g.mm(blk["attn_q.weight"], h), "Qcur_full", il), (T, nh, 2 * d))
    q = ops.cont(ops.view(qg, (T, nh, d), qg.strides, 0))
    gate = ops.reshape(ops.cont(ops.view(qg, (T, nh, d), qg.strides, 4 * d)), (T, nh * d))
    q = g.build_norm(q, blk["attn_q_norm.weight"], name="Qcur_normed", il=il)
    k = ops.reshape(g.mm(blk["attn_k.weight"], h), (T, nkv, d))
    k = g.build_norm(k, blk["attn_k_norm.weight"], name="Kcur_normed", il=il)
    v = ops.reshape(g.mm(blk["attn_v.weight"], h), (T, nkv, d))
    rope = g.arch.layer_rope(il, g.inp.n_ctx)
    q, k = g.cb(rope.apply(q, g.inp.pos), "Qcur", il), g.cb(rope.apply(k, g.inp.pos), "Kcur", il)
    out = g.build_attn(q, k, g.cb(v, "Vcur", il), il, 1.0 / math.sqrt(d))
    out = g.cb(ops.mul(out, g.cb(ops.sigmoid(gate), "gate_sigmoid", il)), "attn_gated", il)
    return g.cb(g.mm(blk["attn_output.weight"], out), "attn_output", il)
