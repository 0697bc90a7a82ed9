"""Architecture families, one small file each, and their registry.

An architecture reads its hyper-parameters, declares its tensors by GGUF name and builds a graph
from the shared blocks in ``llamapy.model.blocks``. Adding a family is one file plus a line in
``_FAMILY_MODULES``.

Per-layer choices are data read through one method each, by the graph and by whatever else needs them:
rope or none (``Architecture.layer_rope``: the forward graph and the K-shift), dense or MoE
(``Architecture.layer_moe``), window or global (``HParams.is_swa``: the graph's rope base and the
cache), head counts and sizes (``HParams.heads``: the graph and the cache), K/V stored or reused from an
earlier layer (``HParams.kv_layer``: the cache allocates only the former). A family changes them by
overriding the method or by setting the hparams data in ``adjust_hparams``.
"""

from __future__ import annotations

import importlib

from ...ggml.tensor import Tensor
from ..blocks import GraphBuilder, Outputs, Rope, TensorLoader, Weights, load_head_tensors, rope_for_layer
from ..hparams import HParams, MetaReader, ModelLoadError, PoolingType, read_common

REGISTRY: dict[str, type[Architecture]] = {}

# GGUF general.architecture -> module under llamapy.model.arch
_FAMILY_MODULES = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen2vl": "qwen2vl",
    "qwen3": "qwen3",
    "qwen3moe": "qwen3",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
    "gemma4": "gemma4",
    "gemma3n": "gemma3n",
    "phi3": "phi3",
    "smollm3": "smollm3",
    "olmo2": "olmo2",
    "granite": "granite",
    "granitemoe": "granite",
    "qwen2moe": "qwen2moe",
    "olmoe": "olmoe",
    "starcoder2": "starcoder2",
    "stablelm": "stablelm",
    "command-r": "command_r",
    "cohere2": "command_r",
    "gpt2": "gpt2",
    "qwen35": "qwen35",
    "qwen35moe": "qwen35",
    "qwen3next": "qwen3next",
    "qwen3vl": "qwen3vl",
    "qwen3vlmoe": "qwen3vl",
    "lfm2": "lfm2",
    "lfm2moe": "lfm2",
    "mamba2": "mamba2",
    "granitehybrid": "granitehybrid",
    "nemotron_h": "nemotron_h",
    "nemotron_h_moe": "nemotron_h_moe",
    "falcon-h1": "falcon_h1",
    "jamba": "jamba",
    "bert": "bert",
    "modern-bert": "modern_bert",
    "nomic-bert": "nomic_bert",
    "nomic-bert-moe": "nomic_bert",
    "jina-bert-v2": "jina_bert",
    "gemma-embedding": "gemma_embedding",
    "gpt-oss": "gpt_oss",
    "mistral3": "mistral3",
    "glm4": "glm4",
    "glm4moe": "glm4moe",
    "deepseek2": "deepseek2",
    "exaone4": "exaone4",
    "ernie4_5": "ernie4_5",
    "ernie4_5-moe": "ernie4_5",
    "seed_oss": "seed_oss",
    "falcon": "falcon",
    "llama4": "llama4",
    "phimoe": "phimoe",
    "mpt": "mpt",
    "refact": "refact",
    "mimo2": "mimo2",
}


def register(*names: str):
    def deco(cls: type[Architecture]) -> type[Architecture]:
        for n in names:
            REGISTRY[n] = cls
        cls.names = names
        return cls

    return deco


def is_known_architecture(name: str) -> bool:
    """Whether ``general.architecture`` names a family llamapy can run."""
    return name in _FAMILY_MODULES or name in REGISTRY


def get_architecture(name: str) -> type[Architecture]:
    mod = _FAMILY_MODULES.get(name)
    if mod is not None:
        importlib.import_module(f"{__name__}.{mod}")
    if name not in REGISTRY:
        known = ", ".join(sorted(_FAMILY_MODULES))
        raise ModelLoadError(f"unknown model architecture {name!r} (supported: {known})")
    return REGISTRY[name]


class Architecture:
    """Base class of a family: hparams, tensors, graph."""

    names: tuple[str, ...] = ()
    # rank pooling (llama.cpp's build_pooling, LLAMA_POOLING_TYPE_RANK): the rows its classification head
    # reads, the activation after ``cls``, and a softmax over the head's outputs (qwen3's yes/no head)
    rank_rows: PoolingType = PoolingType.CLS
    rank_act: str = "tanh"
    rank_softmax: bool = False

    def __init__(self, hp: HParams) -> None:
        self.hp = hp
        self.w: Weights = Weights({})
        self.blocks: list[Weights] = []

    # -- hparams ----------------------------------------------------------------------------------
    @classmethod
    def load_hparams(cls, md: MetaReader, n_vocab: int) -> HParams:
        hp = read_common(md, n_vocab)
        cls.adjust_hparams(hp, md)
        return hp

    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        """Family-specific keys and defaults (override)."""

    # -- tensors ----------------------------------------------------------------------------------
    def load_tensors(self, t: TensorLoader) -> None:
        """Declare the family's tensors (override); call ``self._finish_tensors(t)`` at the end."""
        raise NotImplementedError

    def _finish_tensors(self, t: TensorLoader) -> None:
        load_head_tensors(t, self.hp)  # optional rank / dense pooling heads (any family)
        self.w = Weights(t.tensors)
        self.blocks = [Weights(t.tensors, f"blk.{il}.") for il in range(self.hp.n_layer)]

    def output_weight(self) -> Tensor:
        """``output.weight``, or the token embeddings when the output is tied."""
        w = self.w.get("output.weight")
        return w if w is not None else self.w["token_embd.weight"]

    # -- per-layer choices -----------------------------------------------------------------------
    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        """Rope of layer ``il`` for a context of ``n_ctx`` cells per sequence, None for no rope (NoPE).
        The one source for the forward graph (``GraphBuilder.attention``) and the K-shift."""
        return rope_for_layer(self.hp, il, freq_factors=self.w.get("rope_freqs.weight"))

    def pooled_rows(self, pooling: int) -> PoolingType:
        """The rows ``pooling`` reads: NONE, MEAN, CLS or LAST (RANK: the family's ``rank_rows``)."""
        kind = PoolingType(pooling)
        return self.rank_rows if kind == PoolingType.RANK else kind

    def layer_moe(self, il: int) -> bool:
        """Whether layer ``il``'s feed-forward is a mixture of experts (else dense)."""
        return self.hp.n_expert > 0

    # -- graph ------------------------------------------------------------------------------------
    def build(self, g: GraphBuilder) -> Outputs:
        """Logits F32[n_outputs, n_vocab] and the normed hidden state of one ubatch (override)."""
        raise NotImplementedError


__all__ = ["REGISTRY", "Architecture", "get_architecture", "register"]
