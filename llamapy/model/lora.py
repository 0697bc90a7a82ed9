"""LoRA adapters as llama.cpp reads them (``llama-adapter.cpp``): a GGUF file with
``general.type = "adapter"``, ``adapter.type = "lora"``, ``adapter.lora.alpha`` and, per adapted weight
``W`` of the base model, a pair ``<name>.lora_a`` / ``<name>.lora_b``.

Nothing is merged: a graph built with adapters computes ``W x + s * B (A x)`` for every adapted weight
(``GraphBuilder.mm``), where ``s = scale * alpha / rank`` (``scale`` when alpha is 0). Shapes in NumPy
order, for ``W`` of shape (n_out, n_in): ``A`` (rank, n_in), ``B`` (n_out, rank). The token embeddings are
the exception (``convert_lora_to_gguf.py`` stores them flipped so that a row lookup works): ``A``
(n_vocab, rank), ``B`` (n_embd, rank), and the embedding of token t gains ``s * B A[t]``.
"""

from __future__ import annotations

import os
from dataclasses import field
from typing import Any

from .._dataclass import dataclass
from ..ggml import ops
from ..ggml.tensor import Tensor
from ..ggml.types import TRAITS
from ..gguf import GGUFError, GGUFReader
from .hparams import ModelLoadError

TOKEN_EMBD = "token_embd.weight"


class LoraError(ModelLoadError):
    """A LoRA adapter file that is malformed or does not fit the base model."""


@dataclass(frozen=True)
class LoraWeight:
    """The pair of one adapted weight."""

    a: Tensor
    b: Tensor
    embd: bool = False  # token embeddings (flipped layout)

    @property
    def rank(self) -> int:
        return int(self.b.shape[-1])

    def scale(self, alpha: float, adapter_scale: float) -> float:
        """llama.cpp's ``get_scale``: ``adapter_scale * alpha / rank`` (``adapter_scale`` when alpha is 0)."""
        return adapter_scale * alpha / self.rank if alpha else adapter_scale


@dataclass(eq=False)
class LoraAdapter:
    """One loaded adapter: its pairs by base-weight name and its metadata."""

    path: str
    alpha: float
    weights: dict[str, LoraWeight]
    metadata: dict[str, Any] = field(default_factory=dict, repr=False)
    alora_invocation_tokens: list[int] = field(default_factory=list)

    @classmethod
    def load(cls, path: str | os.PathLike, model: Any) -> LoraAdapter:
        """Read ``path`` and check it against ``model`` (a loaded ``llamapy.model.Model``)."""
        path = os.fspath(path)
        if not os.path.exists(path):
            raise LoraError(f"{path}: LoRA adapter file not found")
        try:
            reader = GGUFReader(path)
        except GGUFError as e:
            raise LoraError(f"cannot load LoRA adapter: {e}") from e
        md = dict(reader.metadata)
        where = f"{path}: LoRA adapter"
        if md.get("general.type") != "adapter":
            raise LoraError(f"{where}: general.type is {md.get('general.type')!r}, expected 'adapter'")
        if md.get("adapter.type") != "lora":
            raise LoraError(f"{where}: adapter.type is {md.get('adapter.type')!r}, expected 'lora'")
        arch = md.get("general.architecture")
        if arch != model.arch:
            raise LoraError(f"{where} is for architecture {arch!r}, the model is {model.arch!r}")
        alpha = md.get("adapter.lora.alpha", 0.0)
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
            raise LoraError(f"{where}: adapter.lora.alpha must be a number, got {alpha!r}")
        alora = md.get("adapter.alora.invocation_tokens", [])
        if not isinstance(alora, (list, tuple)) or not all(isinstance(t, int) for t in alora):
            raise LoraError(f"{where}: adapter.alora.invocation_tokens must be an array of token ids")
        pairs: dict[str, dict[str, Any]] = {}
        for name, info in reader.tensor_index.items():
            if name.endswith((".lora_a", ".lora_b")):
                pairs.setdefault(name[:-7], {})[name[-1]] = info
            elif name.endswith("_norm.weight"):
                continue  # as llama.cpp: norm vectors in adapters are ignored
            else:
                raise LoraError(f"{where}: tensor {name!r} has an unexpected suffix (not .lora_a / .lora_b)")
        weights = {base: _pair(where, base, p, model) for base, p in sorted(pairs.items())}
        if not weights:
            raise LoraError(f"{where} has no lora_a/lora_b tensors")
        return cls(path, float(alpha), weights, md, [int(t) for t in alora])

    @property
    def n_tensors(self) -> int:
        return 2 * len(self.weights)


def _pair(where: str, base: str, p: dict[str, Any], model: Any) -> LoraWeight:
    if "a" not in p or "b" not in p:
        raise LoraError(f"{where}: the pair for {base!r} is missing its lora_{'b' if 'a' in p else 'a'}")
    impl = getattr(model, "impl", None)
    w = impl.w.get(base) if impl is not None else None
    if w is None:
        raise LoraError(f"{where}: tensor {base!r} does not exist in the base model (wrong base model?)")
    a, b = p["a"], p["b"]
    for info in (a, b):
        if info.ggml_type not in TRAITS or len(info.shape) != 2:
            raise LoraError(f"{where}: tensor {info.name!r} must be a matrix of a supported type")
    ash, bsh, wsh = tuple(a.shape), tuple(b.shape), tuple(w.shape)
    embd = base == TOKEN_EMBD
    if len(wsh) != 2:
        raise LoraError(f"{where}: LoRA on {base!r} (shape {wsh}) is not supported (only matrices)")
    if embd:  # A (n_vocab, r), B (n_embd, r)
        ok = wsh[0] == ash[0] and wsh[1] == bsh[0] and ash[1] == bsh[1]
    else:  # A (r, n_in), B (n_out, r)
        ok = wsh[1] == ash[1] and wsh[0] == bsh[0] and ash[0] == bsh[1]
    if not ok:
        raise LoraError(
            f"{where}: tensor {base!r} has shapes lora_a {ash}, lora_b {bsh} that do not fit the model's "
            f"{wsh} (wrong base model?)"
        )
    ta = ops.weight(a.name, a.ggml_type, ash, a.array())
    tb = ops.weight(b.name, b.ggml_type, bsh, b.array())
    return LoraWeight(ta, tb, embd)


def lora_map(adapters: list[tuple[LoraAdapter, float]]) -> dict[str, tuple[tuple[LoraWeight, float], ...]]:
    """Base-weight name -> the (pair, effective scale) of every active adapter that adapts it, in order."""
    out: dict[str, list[tuple[LoraWeight, float]]] = {}
    for ad, s in adapters:
        for name, lw in ad.weights.items():
            out.setdefault(name, []).append((lw, lw.scale(ad.alpha, s)))
    return {k: tuple(v) for k, v in out.items()}


__all__ = ["LoraAdapter", "LoraError", "LoraWeight", "lora_map"]
