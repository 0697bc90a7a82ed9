"""``Model.load``: file -> architecture -> hparams -> vocab -> tensors (llama.cpp's model_load)."""

from __future__ import annotations

import os
import time
from typing import Any

from ..ggml.types import GGMLType
from .hparams import HParams, ModelLoadError
from .loader import ModelLoader, ProgressCallback

# general.file_type -> llama.cpp's ftype name
_FTYPE_NAMES = {0: "all F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K - Medium",
                11: "Q3_K - Small", 12: "Q3_K - Medium", 13: "Q3_K - Large", 14: "Q4_K - Small",
                15: "Q4_K - Medium", 16: "Q5_K - Small", 17: "Q5_K - Medium", 18: "Q6_K", 32: "BF16"}  # fmt: skip


def _size_label(n_params: int) -> str:
    if n_params >= 1e9:
        return f"{n_params / 1e9:.0f}B" if n_params >= 1e10 else f"{n_params / 1e9:.1f}B"
    if n_params >= 1e6:
        return f"{n_params / 1e6:.0f}M"
    return f"{n_params / 1e3:.0f}K"


class Model:
    """A loaded model: hyper-parameters, vocabulary, and its architecture holding the weights."""

    def __init__(self, path: str, loader: ModelLoader, hparams: HParams, vocab: Any, arch_impl: Any) -> None:
        self.path = path
        self.loader = loader
        self.hparams = hparams
        self.vocab = vocab
        self.impl = arch_impl  # the Architecture instance (None when vocab_only)
        self.arch: str = loader.arch
        self.metadata: dict[str, Any] = loader.metadata
        self.load_time_s = 0.0

    # -- loading ------------------------------------------------------------------------------------
    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        use_mmap: bool = True,
        use_mlock: bool = False,
        progress_callback: ProgressCallback | None = None,
        vocab_only: bool = False,
        kv_overrides: Any = None,
    ) -> Model:
        """``kv_overrides``: metadata values replaced before the hparams and the vocabulary are read
        (llama.cpp's ``--override-kv``): llama-cpp-python's dict, or :class:`llamapy.gguf.overrides.KVOverride`
        items or ``KEY=TYPE:VALUE`` strings."""
        from .arch import Architecture, get_architecture, is_known_architecture
        from .blocks import TensorLoader

        t0 = time.perf_counter()
        overrides = None
        if kv_overrides:
            from ..gguf.overrides import kv_overrides as parse_overrides

            overrides = parse_overrides(kv_overrides)
        loader = ModelLoader(path, use_mmap=use_mmap, use_mlock=use_mlock, kv_overrides=overrides or ())
        if vocab_only and not is_known_architecture(loader.arch):
            arch_cls = Architecture  # the vocabulary needs no architecture: only the common hparams
        else:
            arch_cls = get_architecture(loader.arch)
        vocab = _load_vocab(loader)
        n_vocab_fallback = vocab.n_tokens if vocab is not None else 0
        if not n_vocab_fallback and "token_embd.weight" in loader.tensor_index:
            n_vocab_fallback = loader.tensor_index["token_embd.weight"].shape[0]
        hp = arch_cls.load_hparams(loader.meta(), n_vocab_fallback)
        if not hp.n_vocab:
            raise ModelLoadError(
                f"{loader.path}: cannot tell the vocabulary size (no tokens, no {hp.arch}.vocab_size)"
            )
        impl = None
        if not vocab_only:
            impl = arch_cls(hp)
            tl = TensorLoader(loader)
            impl.load_tensors(tl)
            loader.check_all_used()
            loader.finish(progress_callback)
        m = cls(os.fspath(path), loader, hp, vocab, impl)
        m.load_time_s = time.perf_counter() - t0
        return m

    # -- properties ---------------------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return self.hparams.n_vocab

    @property
    def n_ctx_train(self) -> int:
        return self.hparams.n_ctx_train

    @property
    def n_embd(self) -> int:
        return self.hparams.n_embd

    @property
    def n_layer(self) -> int:
        return self.hparams.n_layer

    @property
    def size(self) -> int:
        """Bytes of all tensors."""
        return self.loader.n_bytes

    @property
    def n_params(self) -> int:
        return self.loader.n_elements

    @property
    def ftype(self) -> str:
        ft = self.metadata.get("general.file_type")
        if isinstance(ft, int) and ft in _FTYPE_NAMES:
            return _FTYPE_NAMES[ft]
        types = {t.ggml_type for t in self.loader.tensor_index.values() if t.ggml_type != GGMLType.F32}
        return "/".join(sorted(t.name for t in types)) or "F32"

    @property
    def desc(self) -> str:
        """llama.cpp's model description, e.g. ``llama 135M Q4_1``."""
        label = self.metadata.get("general.size_label")
        if not isinstance(label, str):
            label = _size_label(self.n_params)
        return f"{self.arch} {label} {self.ftype}"

    def __repr__(self) -> str:
        return f"Model({self.desc!r}, path={self.path!r})"


def _load_vocab(loader: ModelLoader) -> Any:
    """The vocabulary from the file's tokenizer metadata (None when the file has none)."""
    if "tokenizer.ggml.model" not in loader.metadata:
        return None
    try:
        from ..vocab import Vocab
    except ImportError:  # the vocab layer is not available
        return None
    try:
        return Vocab.from_metadata(loader.metadata)
    except ModelLoadError:
        raise
    except Exception as e:  # a malformed tokenizer section
        raise ModelLoadError(f"{loader.path}: cannot load the vocabulary: {e}") from e
