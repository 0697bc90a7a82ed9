"""Hyper-parameters of a model, read from GGUF metadata with typed getters that name the key.

Keys follow llama.cpp (``{arch}.block_count``, ``{arch}.attention.head_count`` ...). Per-layer values
(head counts, feed-forward sizes, sliding-window flags) are lists with one entry per layer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import field
from enum import IntEnum
from typing import Any, NamedTuple

import numpy as np

from .._dataclass import dataclass
from ..errors import LlamapyError


class ModelLoadError(LlamapyError):
    """A model file cannot be loaded: unknown architecture, missing/mis-shaped tensor, bad metadata."""


class PoolingType(IntEnum):
    """llama.cpp's ``llama_pooling_type`` (GGUF ``{arch}.pooling_type``): how an embedding context turns
    the tokens of a sequence into one vector. RANK reads the rows its family names
    (``Architecture.rank_rows``) through the classification head."""

    NONE = 0
    MEAN = 1
    CLS = 2
    LAST = 3
    RANK = 4

    @classmethod
    def parse(cls, value: str | int) -> PoolingType:
        """A name (``"mean"``) or a number (``1``); anything else raises ``LlamapyError``."""
        names = ", ".join(k.name.lower() for k in cls)
        if isinstance(value, str):
            by_name = {k.name.lower(): k for k in cls}
            if value not in by_name:
                raise LlamapyError(f"pooling type {value!r} is not one of {names}")
            return by_name[value]
        try:
            return cls(int(value))
        except ValueError:
            raise LlamapyError(f"pooling type {value} is not one of 0..{len(cls) - 1} ({names})") from None


_MISSING = object()
#: number keys that must be above 0: the norms' epsilons (divisors) and the rope bases (logarithms)
POSITIVE_KEYS = frozenset(
    {
        "attention.layer_norm_rms_epsilon",
        "attention.layer_norm_epsilon",
        "rope.freq_base",
        "rope.freq_base_swa",
        "vision.attention.layer_norm_epsilon",
        "audio.attention.layer_norm_epsilon",
    }
)


class MetaReader:
    """Typed access to metadata keys of one architecture, with errors that say which key and why."""

    def __init__(self, metadata: Mapping[str, Any], arch: str, where: str = "") -> None:
        self.md = metadata
        self.arch = arch
        self.where = where

    def _key(self, key: str) -> str:
        return key.replace("{arch}", self.arch) if "{arch}" in key else f"{self.arch}.{key}"

    def _err(self, msg: str) -> ModelLoadError:
        return ModelLoadError(f"{self.where}: {msg}" if self.where else msg)

    def _lookup(self, key: str, required: bool) -> tuple[str, Any]:
        """The full key and its value (``_MISSING`` when absent; an error if ``required``)."""
        k = self._key(key)
        if k not in self.md:
            if required:
                raise self._err(f"metadata key {k!r} is missing")
            return k, _MISSING
        return k, self.md[k]

    def has(self, key: str) -> bool:
        return self._key(key) in self.md

    def raw(self, key: str, default: Any = None) -> Any:
        return self.md.get(self._key(key), default)

    def u32(self, key: str, default: int | None = None, *, required: bool = False) -> int | None:
        k, v = self._lookup(key, required)
        if v is _MISSING:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise self._err(f"metadata key {k!r} has type {type(v).__name__}, expected an integer")
        if v < 0:
            raise self._err(f"metadata key {k!r} = {v} is negative")
        return int(v)

    def f32(self, key: str, default: float | None = None, *, required: bool = False) -> float | None:
        """A finite number (NaN and infinities are refused: no model means them); the keys in
        ``POSITIVE_KEYS`` (epsilons, rope bases: divisors and logarithms) must also be above 0."""
        k, v = self._lookup(key, required)
        if v is _MISSING:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise self._err(f"metadata key {k!r} has type {type(v).__name__}, expected a number")
        f = float(v)
        if not math.isfinite(f):
            raise self._err(f"metadata key {k!r} = {f} is not a finite number")
        if f <= 0 and key in POSITIVE_KEYS:
            raise self._err(f"metadata key {k!r} = {f} must be positive")
        return f

    def string(self, key: str, default: str | None = None) -> str | None:
        k = self._key(key)
        v = self.md.get(k, default)
        if v is not None and not isinstance(v, str):
            raise self._err(f"metadata key {k!r} has type {type(v).__name__}, expected a string")
        return v

    def boolean(self, key: str, default: bool | None = None) -> bool | None:
        k = self._key(key)
        v = self.md.get(k, default)
        if v is not None and not isinstance(v, (bool, np.bool_)):
            raise self._err(f"metadata key {k!r} has type {type(v).__name__}, expected a bool")
        return None if v is None else bool(v)

    def per_layer(
        self, key: str, n_layer: int, default: int | None = None, *, required: bool = False
    ) -> list[int]:
        """A value that is either one integer for all layers or an array with one entry per layer."""
        k, v = self._lookup(key, required)
        if v is _MISSING:
            return [int(default or 0)] * n_layer
        if isinstance(v, (np.ndarray, list)):
            arr = np.asarray(v)
            if arr.ndim != 1 or arr.dtype.kind not in "iu":
                raise self._err(f"metadata key {k!r} must be an integer array, got {arr.dtype}")
            if len(arr) != n_layer:
                raise self._err(
                    f"metadata key {k!r} has {len(arr)} entries, expected one per layer ({n_layer})"
                )
            if (arr < 0).any():
                raise self._err(f"metadata key {k!r} has negative entries")
            return [int(x) for x in arr]
        return [self.u32(key, required=True)] * n_layer  # type: ignore[list-item]


# hybrid families whose recurrent layers have head_count_kv 0 (llama.cpp marks them recurrent so)
HYBRID_NO_KV_ARCHS = ("lfm2", "lfm2moe", "granitehybrid", "falcon-h1", "jamba", "mamba2")
HYBRID_NO_KV_ARCHS += ("nemotron_h", "nemotron_h_moe")

# rope modes (ggml): normal = adjacent pairs, neox = first/second half
ROPE_NORM = 0
ROPE_NEOX = 2


class LayerHeads(NamedTuple):
    n_head: int
    n_head_kv: int
    n_embd_head_k: int
    n_embd_head_v: int


@dataclass
class HParams:
    """A model's hyperparameters, read from the GGUF metadata of its architecture."""

    arch: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: list[int]
    n_head_kv: list[int]
    n_ff: list[int]
    n_embd_head_k: int
    n_embd_head_v: int
    n_rot: int
    rope_type: int = ROPE_NORM
    rope_freq_base: float = 10000.0
    rope_freq_scale: float = 1.0
    rope_freq_base_swa: float = 10000.0
    rope_freq_scale_swa: float = 1.0
    rope_scaling_type: str = "linear"  # the file's (no key: linear): none | linear | yarn | longrope | llama3
    n_ctx_orig_yarn: int = 0
    rope_attn_factor: float = 1.0
    yarn_ext_factor: float = -1.0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    norm_rms_eps: float = 1e-5
    norm_eps: float = 1e-5
    n_swa: int = 0
    swa_layers: list[bool] = field(default_factory=list)
    f_attn_logit_softcapping: float = 0.0
    f_final_logit_softcapping: float = 0.0
    f_attention_scale: float = 0.0  # 0: 1/sqrt(n_embd_head_k)
    f_embedding_scale: float = 0.0  # 0: none (Granite: embeddings x scale)
    f_residual_scale: float = 0.0  # 0: none (Granite: residual branches x scale)
    f_logit_scale: float = 0.0  # 0: none (Granite: logits / scale)
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0  # the shared expert's feed-forward size (0: n_ff)
    expert_weights_norm: bool = False
    causal_attn: bool = True
    # llama_non_causal_type: which caches turn non-causal under set_causal_attn(False) ("swa_only": Gemma 4)
    non_causal_type: str = "all"
    pooling_type: int = PoolingType.NONE
    n_cls_out: int = 1  # outputs of a rank head (classifier.output_labels)
    f_max_alibi_bias: float = 0.0  # ALiBi (jina-bert-v2): the encoder mask holds -|i - j|
    swa_type: str = "standard"  # "symmetric": |i - j| <= n_swa / 2 (modern-bert, EmbeddingGemma)
    n_token_types: int = 0  # bert's token_types table
    moe_every_n_layers: int = 0  # nomic-bert-moe: layers il % n == 1 are MoE
    n_ctx_orig: int = 0
    # attention temperature tuning (Llama 4, Mistral 3): Q x log(floor((pos + offset) / floor) + 1) * scale + 1
    f_attn_temp_scale: float = 0.0  # 0: none
    n_attn_temp_floor_scale: int = 0
    f_attn_temp_offset: float = 0.0
    n_expert_groups: int = 0  # group-limited routing (DeepSeek V3): experts in groups, the best used
    n_group_used: int = 0
    expert_weights_scale: float = 0.0  # 0: none
    expert_gating_func: int = 0  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE: 1 softmax, 2 sigmoid (0: unset)
    n_layer_dense_lead: int = 0  # the first layers' feed-forward is dense (DeepSeek, GLM-4.5)
    n_expert_shared: int = 0
    n_embd_moe_latent: int = 0  # the routed experts' width between latent projections (Nemotron 3 Super)
    n_moe_layer_step: int = 0  # ERNIE 4.5 / Llama 4: every n-th layer (from the dense lead on) is MoE
    n_attn_chunk: int = 0  # Llama 4: chunked attention on its rope layers (0: none)
    n_layer_nextn: int = 0  # next-token-prediction layers after the trunk (GLM-4.5, DeepSeek V3: skipped)
    # per MTP block (n_head, n_head_kv, n_ff, sliding-window) where they differ from the trunk's (MiMo)
    nextn_layers: list[tuple[int, int, int, bool]] = field(default_factory=list)
    f_attn_value_scale: float = 0.0  # 0: none (MiMo: attention output x scale)
    v_in_k: bool = False  # the graph reads V from the cached K rows (DeepSeek's MLA): no V cache
    n_lora_q: int = 0  # DeepSeek's MLA: q's low-rank projection (0: a full attn_q)
    n_lora_kv: int = 0  # the compressed KV latent's size
    n_embd_head_k_mla: int = 0  # the decompressed head sizes (key_length_mla / value_length_mla)
    n_embd_head_v_mla: int = 0
    rope_yarn_log_mul: float = 0.0  # YaRN's attention magnitude x (1 + log_mul ln(1 / freq_scale))
    n_embd_head_k_swa: int = 0  # 0: n_embd_head_k (Gemma 4: sliding-window layers have their own head size)
    n_embd_head_v_swa: int = 0
    n_layer_kv_from_start: int = -1  # -1: every layer has its own K/V; else later layers reuse earlier ones'
    n_rot_swa: int = 0  # rotary dims of sliding-window layers when they differ (Gemma 4; 0: n_rot)
    n_embd_per_layer: int = 0  # per-layer embedding size (Gemma 3n / 4; 0: none)
    n_altup: int = 0  # Gemma 3n: AltUp streams (altup.num_inputs), the active one, and per-layer FFN
    i_altup_act: int = 0  # activation sparsity (std multiplier of the gaussian top-k cutoff; -inf: dense)
    activation_sparsity_scale: list[float] = field(default_factory=list)
    # recurrent layers (SSM / gated delta net / short conv; llama.cpp's ssm.* keys): which layers, and the
    # per-sequence conv and recurrent state sizes the memory keeps for each (floats)
    recurrent_layers: list[bool] = field(default_factory=list)
    n_embd_r: int = 0
    n_embd_s: int = 0
    ssm_d_conv: int = 0
    ssm_d_inner: int = 0
    ssm_d_state: int = 0
    ssm_dt_rank: int = 0
    ssm_n_group: int = 0
    rope_sections: tuple[int, ...] = ()  # multi-section rope (Qwen3.5's interleaved mrope)
    n_deepstack_layers: int = 0  # Qwen3-VL: image features added after the first layers
    recurrent_with_attn: bool = (
        False  # recurrent layers attend as well (Falcon-H1: mamba2 + attention per layer)
    )

    # Per-layer choices that the cache shares with the graph are data here, each read through one
    # method: head counts and sizes (``heads``), window or global (``is_swa``: ``swa_layers``).
    def heads(self, il: int) -> LayerHeads:
        """Query heads, KV heads, K head size and V head size of layer ``il``."""
        if self.n_embd_head_k_swa and self.is_swa(il):
            return LayerHeads(
                self.n_head[il], self.n_head_kv[il], self.n_embd_head_k_swa, self.n_embd_head_v_swa
            )
        return LayerHeads(self.n_head[il], self.n_head_kv[il], self.n_embd_head_k, self.n_embd_head_v)

    def kv_layer(self, il: int) -> int:
        """The layer whose cached K/V layer ``il`` attends over: itself, or (KV sharing, Gemma 3n / 4: layers
        from ``n_layer_kv_from_start`` on) the last earlier layer of the same kind (window or global) that
        stores its own. The cache holds buffers only for layers that are their own ``kv_layer``."""
        n = self.n_layer_kv_from_start
        if n < 0 or il < n:
            return il
        swa = self.is_swa(il)
        for j in range(n - 1, -1, -1):
            if self.is_swa(j) == swa:
                return j
        raise ModelLoadError(f"layer {il} shares K/V, but no earlier layer of its kind stores them")

    def n_embd_k_gqa(self, il: int) -> int:
        h = self.heads(il)
        return h.n_embd_head_k * h.n_head_kv

    def n_embd_v_gqa(self, il: int) -> int:
        """V values cached per token (0 with ``v_in_k``: MLA's latent cache holds K only)."""
        if self.v_in_k:
            return 0
        h = self.heads(il)
        return h.n_embd_head_v * h.n_head_kv

    def is_swa(self, il: int) -> bool:
        """Whether layer ``il`` attends over a sliding window (else over the whole context)."""
        return bool(self.swa_layers and self.swa_layers[il])

    @property
    def n_embd_inp(self) -> int:
        """Width of an embeddings input (llama.cpp's ``n_embd_inp()``): Qwen3-VL's image tokens carry
        their deepstack slices after the first ``n_embd`` values."""
        return self.n_embd * (1 + self.n_deepstack_layers)

    @property
    def has_swa(self) -> bool:
        return self.n_swa > 0 and any(self.swa_layers)

    def is_recurrent(self, il: int) -> bool:
        """Whether layer ``il`` keeps a recurrent state (else it attends over the KV cache)."""
        return bool(self.recurrent_layers and self.recurrent_layers[il])

    def has_kv(self, il: int) -> bool:
        """Whether layer ``il`` attends over a KV cache (it has KV heads and is not only recurrent)."""
        return self.n_head_kv[il] > 0 and (self.recurrent_with_attn or not self.is_recurrent(il))


def read_common(md: MetaReader, n_vocab_fallback: int) -> HParams:
    """Keys shared by all decoder families; an architecture then adjusts its own extras."""
    n_layer = md.u32("block_count", required=True)
    if not n_layer or n_layer > 4096:
        raise md._err(f"metadata key {md._key('block_count')!r} = {n_layer} is out of range")
    n_embd = md.u32("embedding_length", required=True)
    if not n_embd:
        raise md._err(f"metadata key {md._key('embedding_length')!r} is zero")
    n_head = md.per_layer("attention.head_count", n_layer, required=True)
    n_head_kv = md.per_layer("attention.head_count_kv", n_layer, default=n_head[0])
    if not md.has("attention.head_count_kv"):
        n_head_kv = list(n_head)
    for il in range(n_layer):
        if md.arch in HYBRID_NO_KV_ARCHS and n_head_kv[il] == 0:  # a recurrent layer (LFM2's short conv)
            continue
        if n_head[il] == 0 or n_head_kv[il] == 0 or n_head[il] % n_head_kv[il]:
            raise md._err(
                f"layer {il}: attention.head_count {n_head[il]} is not a positive multiple of "
                f"attention.head_count_kv {n_head_kv[il]}"
            )
    n_ff = md.per_layer("feed_forward_length", n_layer, default=0)
    head_k_default = n_embd // n_head[0] if n_head[0] else 0  # (0: Mamba2, no attention)
    n_embd_head_k = md.u32("attention.key_length", head_k_default)
    n_embd_head_v = md.u32("attention.value_length", head_k_default)
    n_rot = md.u32("rope.dimension_count", n_embd_head_k)
    if n_rot > n_embd_head_k or n_rot % 2:
        raise md._err(f"rope.dimension_count {n_rot} must be even and at most the head size {n_embd_head_k}")
    n_vocab = md.u32("vocab_size", 0) or n_vocab_fallback
    n_ctx_train = md.u32("context_length", required=True)

    hp = HParams(
        arch=md.arch,
        n_vocab=n_vocab,
        n_ctx_train=n_ctx_train,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=n_ff,
        n_embd_head_k=n_embd_head_k,
        n_embd_head_v=n_embd_head_v,
        n_rot=n_rot,
        swa_layers=[False] * n_layer,
    )
    hp.norm_rms_eps = md.f32("attention.layer_norm_rms_epsilon", 1e-5)
    hp.norm_eps = md.f32("attention.layer_norm_epsilon", 1e-5)
    hp.rope_freq_base = md.f32("rope.freq_base", 10000.0)
    hp.rope_freq_base_swa = md.f32("rope.freq_base_swa", hp.rope_freq_base)
    scaling = md.string("rope.scaling.type", "none") or "none"
    factor = md.f32("rope.scaling.factor", 0.0) or md.f32("rope.scale_linear", 0.0) or 0.0
    # llama.cpp's rope_scaling_type_train: "linear" where the file names no type, so that a context's
    # --rope-scale N scales linearly (llamapy.context.rope_hparams); the file's own scale is read as before
    hp.rope_scaling_type = md.string("rope.scaling.type") or "linear"
    if scaling not in ("none", "linear", "yarn", "longrope", "llama3"):
        raise md._err(f"metadata key {md._key('rope.scaling.type')!r} = {scaling!r} is not supported")
    hp.rope_freq_scale = 1.0 / factor if factor and scaling in ("linear", "yarn") else 1.0
    if not md.has("rope.scaling.type") and md.has("rope.scale_linear") and factor:
        hp.rope_freq_scale = 1.0 / factor
    hp.rope_freq_scale_swa = hp.rope_freq_scale
    hp.n_ctx_orig_yarn = md.u32("rope.scaling.original_context_length", n_ctx_train)
    hp.rope_attn_factor = md.f32("rope.scaling.attn_factor", 1.0)
    if scaling == "yarn":
        hp.yarn_ext_factor = 1.0
        hp.yarn_beta_fast = md.f32("rope.scaling.yarn_beta_fast", 32.0)
        hp.yarn_beta_slow = md.f32("rope.scaling.yarn_beta_slow", 1.0)
    else:
        hp.yarn_ext_factor = 0.0
    hp.n_swa = md.u32("attention.sliding_window", 0)
    hp.f_attn_logit_softcapping = md.f32("attn_logit_softcapping", 0.0)
    hp.f_final_logit_softcapping = md.f32("final_logit_softcapping", 0.0)
    hp.n_expert = md.u32("expert_count", 0)
    hp.n_expert_used = md.u32("expert_used_count", 0)
    hp.n_ff_exp = md.u32("expert_feed_forward_length", 0)
    hp.n_ff_shexp = md.u32("expert_shared_feed_forward_length", 0)
    if hp.n_expert and not 0 < hp.n_expert_used <= hp.n_expert:
        raise md._err(f"expert_used_count {hp.n_expert_used} must be in 1..expert_count ({hp.n_expert})")
    hp.causal_attn = md.boolean("attention.causal", True)
    hp.pooling_type = md.u32("pooling_type", 0)
    labels = md.raw("classifier.output_labels")
    if labels is not None and len(labels):
        hp.n_cls_out = len(labels)
    hp.f_max_alibi_bias = md.f32("attention.max_alibi_bias", 0.0)
    return hp


def swa_pattern(md: MetaReader, n_layer: int, default_period: int) -> list[bool]:
    """Which layers use sliding-window attention: ``attention.sliding_window_pattern`` as a per-layer
    bool array, an integer period (every period-th layer is global), or the family's default period."""
    v = md.raw("attention.sliding_window_pattern")
    if isinstance(v, (np.ndarray, list)):
        arr = np.asarray(v)
        if len(arr) != n_layer:
            raise md._err(f"attention.sliding_window_pattern has {len(arr)} entries, expected {n_layer}")
        return [bool(x) for x in arr]
    period = int(v) if v is not None else default_period
    if period <= 0:
        return [True] * n_layer
    return [il % period < period - 1 for il in range(n_layer)]
