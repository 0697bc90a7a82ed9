"""Which type each tensor gets: llama.cpp's ``llama_tensor_get_type`` (src/llama-quant.cpp), as data
where it is a lookup and small functions where it depends on the layer, the model or the mix.

The order matters as in llama.cpp: tensors are visited sorted by (layer, name) (its
``weight_name_comparer``), and attn_v / ffn_down / ffn_gate / ffn_up each keep a running counter that
the layer-dependent rules read (``use_more_bits``, the first eighth of the layers...).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import field

from .._dataclass import dataclass
from ..ggml.types import TRAITS, GGMLType
from .ftypes import FType, QuantizeError

__all__ = ["Category", "ModelInfo", "Options", "TensorDesc", "TypePlanner", "category", "sort_key"]

T = GGMLType


class Category(enum.Enum):
    TOKEN_EMBD = "token_embd"
    ATTN_Q = "attn_q"
    ATTN_V = "attn_v"
    ATTN_K = "attn_k"
    ATTN_QKV = "attn_qkv"
    ATTN_KV_B = "attn_kv_b"
    ATTN_OUTPUT = "attn_output"
    FFN_UP = "ffn_up"
    FFN_GATE = "ffn_gate"
    FFN_DOWN = "ffn_down"
    OUTPUT = "output"
    OTHER = "other"


C = Category
# substring -> category, first match wins (tensor_get_category); exact names are checked before
_CATEGORY_SUBSTRINGS: tuple[tuple[str, Category], ...] = (
    ("attn_qkv.weight", C.ATTN_QKV),
    ("attn_kv_b.weight", C.ATTN_KV_B),
    ("attn_v.weight", C.ATTN_V),
    ("attn_k.weight", C.ATTN_K),
    ("attn_q.weight", C.ATTN_Q),
    ("attn_output.weight", C.ATTN_OUTPUT),
    ("ffn_up", C.FFN_UP),
    ("ffn_gate", C.FFN_GATE),
    ("ffn_down", C.FFN_DOWN),
)
_TOKEN_EMBD_NAMES = ("token_embd.weight", "per_layer_token_embd.weight")
_ATTN_V_LIKE = (C.ATTN_V, C.ATTN_QKV, C.ATTN_KV_B)

# names never quantized (tensor_allows_quantization): substrings, then exact names
_KEEP_SUBSTRINGS = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
    "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
    "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight",
    "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight",
    "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
    "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.",
    "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
)  # fmt: skip
_KEEP_NAMES = ("position_embd.weight", "token_types.weight")
_KEEP_SUBSTRINGS_GLM5_NEXT = (
    "hc_", "indexer.attn_q_b", "indexer.attn_k", "indexer.proj", "indexer_compressor_gate",
    "indexer_compressor_ape", "ssm_f_a.weight", "ssm_f_b.weight", "ssm_g_a.weight", "ssm_g_b.weight",
    "ssm_beta.weight", "attn_kv_a_mqa.weight", "attn_k_b.weight", "attn_v_b.weight",
)  # fmt: skip

# when a row is not a multiple of the block size (tensor_type_fallback)
_FALLBACK = {
    T.IQ1_S: T.IQ4_NL, T.IQ1_M: T.IQ4_NL, T.IQ2_XXS: T.IQ4_NL, T.IQ2_XS: T.IQ4_NL, T.IQ2_S: T.IQ4_NL,
    T.IQ3_XXS: T.IQ4_NL, T.IQ3_S: T.IQ4_NL, T.IQ4_XS: T.IQ4_NL,
    T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0, T.TQ1_0: T.Q4_0, T.TQ2_0: T.Q4_0,
    T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0,
}  # fmt: skip

# the i-quant mixes below 3 bits share one set of rules
_IQ_LOW = ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M")
# token_embd of a model with an output tensor: mix -> type (other mixes keep the default)
_TOKEN_EMBD_TYPE = {
    "IQ2_XXS": T.Q2_K, "IQ2_XS": T.Q2_K, "IQ1_S": T.Q2_K, "IQ1_M": T.Q2_K,
    "IQ2_S": T.IQ3_S, "IQ2_M": T.IQ3_S, "IQ3_XXS": T.IQ3_S, "TQ1_0": T.Q4_K, "TQ2_0": T.Q4_K,
}  # fmt: skip
# output (and a tied token_embd): the mixes that take Q5_K there (the others Q6_K unless Q8_0)
_OUTPUT_Q5_K = ("IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M")
# attn_output of a dense (not 8-expert) model, outside falcon
_ATTN_OUTPUT_TYPE = {"Q2_K": T.Q3_K, "IQ3_XXS": T.IQ3_S, "Q3_K_M": T.Q4_K, "Q3_K_L": T.Q5_K, "IQ3_M": T.Q4_K}
# attn_output of an 8-expert model: these mixes take Q5_K
_ATTN_OUTPUT_8X_Q5_K = (
    "Q2_K", "IQ3_XS", "IQ3_XXS", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ3_S", "IQ3_M", "IQ4_XS",
)  # fmt: skip
# fused attn_qkv
_ATTN_QKV_TYPE = {"Q3_K_M": T.Q4_K, "Q3_K_L": T.Q4_K, "IQ3_M": T.Q4_K, "Q4_K_M": T.Q5_K, "Q5_K_M": T.Q6_K}
# attn_q and attn_k (attn_k of an 8-expert model is Q8_0 before this)
_ATTN_QK_TYPE = {"IQ3_XS": T.IQ3_XXS, "IQ3_XXS": T.IQ2_S}


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """The layers llama.cpp gives more bits: the first and last eighth, and every third in between."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def _layer_of(name: str) -> int:
    m = re.match(r"blk\.(-?\d+)\.", name)
    return int(m.group(1)) if m else -1


def sort_key(name: str) -> tuple[int, str]:
    """llama.cpp's tensor order (weight_name_comparer): by layer (others first), then by name."""
    return (_layer_of(name), name)


def category(name: str) -> Category:
    if name == "output.weight":
        return C.OUTPUT
    if name in _TOKEN_EMBD_NAMES:
        return C.TOKEN_EMBD
    for sub, cat in _CATEGORY_SUBSTRINGS:
        if sub in name:
            return cat
    return C.OTHER


@dataclass(frozen=True)
class TensorDesc:
    name: str
    ne: tuple[int, ...]  # ggml order: ne[0] is the row length
    type: GGMLType

    @property
    def n_dims(self) -> int:  # ggml_n_dims: trailing dimensions of 1 do not count
        for i in range(len(self.ne) - 1, 0, -1):
            if self.ne[i] > 1:
                return i + 1
        return 1

    def dim(self, i: int) -> int:
        return self.ne[i] if i < len(self.ne) else 1


@dataclass(frozen=True)
class ModelInfo:
    arch: str
    n_layer: int
    n_head: int = 0
    n_head_kv: int = 0
    n_expert: int = 0

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @property
    def is_70b(self) -> bool:  # LLM_TYPE_70B, the only model size the rules read
        if self.arch == "llama":
            return self.n_layer == 80 and self.n_head != self.n_head_kv
        return (self.arch in ("qwen2", "deci", "olmo") and self.n_layer == 80) or (
            self.arch == "jais2" and self.n_layer == 68
        )


@dataclass
class Options:
    ftype: FType
    pure: bool = False
    quantize_output_tensor: bool = True  # False: --leave-output-tensor
    output_tensor_type: GGMLType | None = None
    token_embedding_type: GGMLType | None = None
    tensor_types: Sequence[tuple[str, GGMLType]] = ()  # --tensor-type PATTERN=TYPE (regex search)
    only_copy: bool = False  # COPY
    has_imatrix: bool = False


def allows_quantization(opts: Options, arch: str, t: TensorDesc) -> bool:
    """tensor_allows_quantization: 2-D and 3-D weights, not norms, routers, embeddings of positions..."""
    if opts.only_copy or t.n_dims < 2:
        return False
    name = t.name
    if not name.endswith("weight"):
        return False
    if not opts.quantize_output_tensor and name == "output.weight":
        return False
    if name in _KEEP_NAMES or any(s in name for s in _KEEP_SUBSTRINGS):
        return False
    if arch == "glm5-next" and any(s in name for s in _KEEP_SUBSTRINGS_GLM5_NEXT):
        return False
    return True


def requires_imatrix(name: str, t: GGMLType, ftype: FType) -> bool:
    """tensor_requires_imatrix: the lowest-bit types, and Q2_K inside a Q2_K_S file."""
    if name in _TOKEN_EMBD_NAMES or name == "output.weight":
        return False
    if t in (T.IQ3_XXS, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ1_M, T.IQ1_S):
        return True
    return t == T.Q2_K and ftype.name == "Q2_K_S"


@dataclass
class TypePlanner:
    """Chooses the type of every tensor of one model; feed it the tensors in ``sort_key`` order."""

    model: ModelInfo
    opts: Options
    names: Sequence[str] = ()  # every tensor name (the counters and tied embeddings depend on all)
    n_fallback: int = 0
    fallbacks: list[str] = field(default_factory=list)  # warnings, one per fallback

    def __post_init__(self) -> None:
        cats = [category(n) for n in self.names]
        self.n_attention_wv = sum(c in _ATTN_V_LIKE for c in cats)
        self.has_tied_embeddings = C.OUTPUT not in cats
        self.n_ffn = self.model.n_layer  # n_ffn_down = n_ffn_gate = n_ffn_up
        self.i_attention_wv = self.i_ffn_down = self.i_ffn_gate = self.i_ffn_up = 0
        self._patterns = [(re.compile(p), ty) for p, ty in self.opts.tensor_types]

    # -- llama_tensor_get_type ------------------------------------------------------------------
    def target_type(self, t: TensorDesc) -> GGMLType:
        opts = self.opts
        if not allows_quantization(opts, self.model.arch, t):
            return t.type
        cat = category(t.name)
        if opts.token_embedding_type is not None and cat == C.TOKEN_EMBD:
            # per_layer_token_embd follows --token-embedding-type unless a --tensor-type names it
            named = t.name == "per_layer_token_embd.weight" and any(
                p.search(t.name) for p, _ in self._patterns
            )
            if not named:
                return opts.token_embedding_type
        if opts.output_tensor_type is not None and cat == C.OUTPUT:
            return opts.output_tensor_type
        new = opts.ftype.default
        if not TRAITS[new].quantized:
            return new
        manual = False
        for p, ty in self._patterns:
            if p.search(t.name):
                new, manual = ty, True
                break
        if not manual and not opts.pure:
            new = self._mix_rule(new, t, cat)
        return self._fallback(t, new)

    def _fallback(self, t: TensorDesc, target: GGMLType) -> GGMLType:
        ncols, qk = t.ne[0], TRAITS[target].block_size
        if ncols % qk == 0:
            return target
        self.n_fallback += 1
        ret = _FALLBACK.get(target)
        if ret is None:
            if qk > 32:
                raise QuantizeError(f"no tensor type fallback is defined for type {target.name}")
            ret = target
        if ncols % TRAITS[ret].block_size:
            ret = T.F16  # the fallback does not fit either (rows not a multiple of 32)
        self.fallbacks.append(
            f"{t.name}: ncols {ncols} not divisible by {qk} (required for type {target.name}) "
            f"-> falling back to {ret.name}"
        )
        return ret

    def _layer(self, counter: int, name: str) -> tuple[int, int]:
        """(i_layer, n_layer) of a FFN tensor: its counter, or for MoE models the layer in its name."""
        n = self.n_ffn
        if max(1, self.model.n_expert) > 1:
            m = re.match(r"blk\.(-?\d+)\.", name)
            if m is None:
                raise QuantizeError(f"failed to determine layer for tensor {name}")
            i = int(m.group(1))
            if not 0 <= i < n:
                raise QuantizeError(f"bad layer {i} for tensor {name}. Must be in [0, {n})")
            return i, n
        return counter, n

    # -- llama_tensor_get_type_impl -------------------------------------------------------------
    def _mix_rule(self, new: GGMLType, t: TensorDesc, cat: Category) -> GGMLType:
        f = self.opts.ftype.name
        hp = self.model
        arch = hp.arch
        name = t.name
        if arch == "glm5-next" and any(s in name for s in ("attn_q_a", "attn_q_b", "nextn.eh_proj")):
            return new if new in (T.F32, T.BF16, T.F16) else T.Q8_0
        if cat == C.OUTPUT or (self.has_tied_embeddings and cat == C.TOKEN_EMBD):
            if self.opts.output_tensor_type is not None:
                return self.opts.output_tensor_type
            if f == "MXFP4_MOE" or arch == "falcon" or t.ne[0] % TRAITS[new].block_size:
                return T.Q8_0
            if f in _OUTPUT_Q5_K:
                return T.Q5_K
            return new if new == T.Q8_0 else T.Q6_K
        if f == "MXFP4_MOE":  # experts (3-D) MXFP4, the rest Q8_0
            expert = cat in (C.FFN_UP, C.FFN_GATE, C.FFN_DOWN)
            return T.MXFP4 if t.dim(2) > 1 and (arch != "bailingmoe3" or expert) else T.Q8_0
        if cat == C.TOKEN_EMBD:
            if self.opts.token_embedding_type is not None:
                return self.opts.token_embedding_type
            return _TOKEN_EMBD_TYPE.get(f, new)
        if f in _IQ_LOW:
            return self._iq_low(new, f, cat)
        if cat in _ATTN_V_LIKE:
            return self._attn_v(new, f)
        if cat == C.ATTN_K:
            if hp.n_expert == 8:
                return T.Q8_0
            return _ATTN_QK_TYPE.get(f, new)
        if cat == C.ATTN_Q:
            return _ATTN_QK_TYPE.get(f, new)
        if cat == C.FFN_DOWN:
            i, n = self._layer(self.i_ffn_down, name)
            self.i_ffn_down += 1
            return self._ffn_down(new, f, i, n)
        if cat == C.ATTN_OUTPUT:
            if arch == "falcon":
                return T.Q4_K if f == "Q3_K_L" else new
            if hp.n_expert == 8:
                return T.Q5_K if f in _ATTN_OUTPUT_8X_Q5_K else new
            return _ATTN_OUTPUT_TYPE.get(f, new)
        if cat == C.ATTN_QKV:  # (unreachable: attn_qkv is attn_v-like, as in llama.cpp)
            return _ATTN_QKV_TYPE.get(f, new)
        if cat in (C.FFN_GATE, C.FFN_UP):
            counter = self.i_ffn_gate if cat == C.FFN_GATE else self.i_ffn_up
            i, n = self._layer(counter, name)
            if cat == C.FFN_GATE:
                self.i_ffn_gate += 1
            else:
                self.i_ffn_up += 1
            if f == "IQ3_XS" and n // 8 <= i < 7 * n // 8:
                return T.IQ3_XXS
        return new

    def _iq_low(self, new: GGMLType, f: str, cat: Category) -> GGMLType:
        hp = self.model
        iq2_sm = f in ("IQ2_S", "IQ2_M")
        if cat in _ATTN_V_LIKE:
            self.i_attention_wv += 1
            if hp.n_gqa >= 4 or hp.n_expert >= 4:
                return T.Q4_K
            return T.IQ3_S if iq2_sm else T.Q2_K
        if hp.n_expert == 8 and cat == C.ATTN_K:
            return T.Q4_K
        if cat == C.FFN_DOWN:
            first = self.i_ffn_down < self.n_ffn // 8
            self.i_ffn_down += 1
            if first:
                return T.IQ3_S if iq2_sm else T.Q2_K
            return new
        if cat == C.ATTN_OUTPUT:
            if hp.n_expert == 8:
                return T.Q5_K
            if f in ("IQ1_S", "IQ1_M"):
                return T.IQ2_XXS
            if iq2_sm:
                return T.IQ3_S
        return new

    def _attn_v(self, new: GGMLType, f: str) -> GGMLType:
        hp = self.model
        gqa4 = hp.n_gqa >= 4
        i, n = self.i_attention_wv, self.n_attention_wv
        if f == "Q2_K":
            new = T.Q4_K if gqa4 else T.Q3_K
        elif f == "Q2_K_S" and gqa4:
            new = T.Q4_K
        elif f == "IQ3_XXS":
            new = T.Q4_K if gqa4 else (T.IQ3_S if not self.opts.has_imatrix else T.IQ3_XXS)
        elif f in ("IQ3_XS", "IQ3_S") and gqa4:
            new = T.Q4_K
        elif f == "IQ3_M":
            new = T.Q4_K
        elif f == "Q3_K_M":
            new = T.Q5_K if i < 2 else T.Q4_K
        elif f == "Q3_K_L":
            new = T.Q5_K
        elif f in ("IQ4_NL", "IQ4_XS") and gqa4:
            new = T.Q5_K
        elif f in ("Q4_K_M", "Q5_K_M") and use_more_bits(i, n):
            new = T.Q6_K
        elif f == "Q4_K_S" and i < 4:
            new = T.Q5_K
        if hp.is_70b and new in (T.Q3_K, T.Q4_K):
            new = T.Q5_K  # 8 heads share attn_v: more bits for almost no size
        if hp.n_expert == 8:
            new = T.Q8_0
        self.i_attention_wv += 1
        return new

    def _ffn_down(self, new: GGMLType, f: str, i: int, n: int) -> GGMLType:
        hp = self.model
        falcon = hp.arch == "falcon"
        imatrix = self.opts.has_imatrix
        if f == "Q2_K":
            return T.Q3_K
        if f == "Q2_K_S":
            return T.Q4_K if i < n // 8 else new
        if f == "IQ3_XXS" and not imatrix:
            return T.Q4_K if i < n // 8 else T.Q3_K
        if f == "Q3_K_M":
            if i < n // 16:
                return T.Q5_K
            return T.Q4_K if not falcon or use_more_bits(i, n) else T.Q3_K
        if f == "IQ3_M" and (i < n // 8 or (hp.n_expert == 8 and use_more_bits(i, n))):
            return T.Q4_K
        if f == "Q3_K_L":
            return T.Q4_K if falcon else T.Q5_K
        if f == "Q4_K_M":
            if falcon:
                return T.Q6_K if i < n // 16 else (T.Q5_K if use_more_bits(i, n) else T.Q4_K)
            return T.Q6_K if use_more_bits(i, n) else new
        if i < n // 8 and f in ("IQ4_NL", "IQ4_XS") and not imatrix:
            return T.Q5_K
        if f == "Q5_K_M" and use_more_bits(i, n):
            return T.Q6_K
        if f == "Q4_K_S" and not falcon and i < n // 8:
            return T.Q5_K
        if f in ("Q4_0", "Q5_0") and imatrix and i < n // 8:
            return T.Q4_1 if f == "Q4_0" else T.Q5_1  # first ffn_down layers go wild even with an imatrix
        return new
