"""How a family's Hugging Face checkpoints become its GGUF file: the small declaration each
architecture file (``llamapy/model/arch/<family>.py``) makes as ``HF_CONVERT``, read by
``llamapy.convert``.

The common part lives in the converter, as in llama.cpp's ``convert_hf_to_gguf.py``: the HF -> GGUF
tensor names (gguf-py's ``TensorNameMap``, the table llama.cpp's converters use), the hyper-parameters
every ``TextModel`` writes, experts stacked into 3-D tensors. A declaration says what differs: which
``architectures`` entries it takes, its tokenizer, the llama q/k row permutation, the Gemma norm
offset, and hooks for the rest (``params``: extra keys; ``tensor``: renames or reshapes before the
common mapping).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from .._dataclass import dataclass

# ctx: llamapy.convert.convert.Context (hparams, find_hparam, rope_parameters, block_count, ...);
# kv: gguf-py's GGUFWriter used as the key/value collector (its add_* helpers name the keys)
ParamsHook = Callable[[Any, Any], None]
# (ctx, HF name, float array, block id) -> (name, array) pairs, still HF-named or already GGUF-named
TensorHook = Callable[[Any, str, np.ndarray, "int | None"], Iterable[tuple[str, np.ndarray]]]


@dataclass(frozen=True)
class HFConvert:
    """One GGUF architecture's conversion from Hugging Face checkpoints."""

    arch: str  # general.architecture written
    hf_archs: tuple[str, ...]  # config.json "architectures" entries converted to it
    # "gpt2" (tokenizer.json), "spm" (tokenizer.model), "spm|gpt2" (the first present), or a hook that
    # calls ctx.set_vocab(kind) and adds its own keys around it
    vocab: str | ParamsHook = "gpt2"
    permute_qk: bool = False  # llama's q/k rows: HF rotate-half -> ggml's interleaved rope
    norm_shift: float = 0.0  # added to every "*norm.weight" (Gemma stores w, computes with 1 + w)
    generic_params: bool = True  # TextModel.set_gguf_parameters' keys before ``params``
    params: ParamsHook | None = None
    tensor: TensorHook | None = None
    skip: tuple[str, ...] = ()  # HF tensor names not converted (e.g. a tied lm_head)
    drop_hparams: tuple[str, ...] = ()  # config.json keys ignored (Granite's head_dim)
    adjust_hparams: Callable[[dict[str, Any]], dict[str, Any]] | None = (
        None  # config.json as the family reads it
    )
    vocab_size_key: bool = False  # also write {arch}.vocab_size (LlamaModel does)
    rope_dim_key: bool = False  # also write {arch}.rope.dimension_count = head_dim
    extra_tensors: Callable[[Any], Iterable[tuple[str, np.ndarray]]] | None = None  # before the weights
    # (ctx, the checkpoint's tensor names) -> blocks past num_hidden_layers (MTP / NextN layers)
    extra_blocks: Callable[[Any, list[str]], int] | None = None
