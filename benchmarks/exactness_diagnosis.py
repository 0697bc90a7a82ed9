"""Diagnosis variants of ``benchmarks/exactness.py``: llamapy with its k-quant mat-vec kernels bypassed, and
the exact model with its linear layers' inputs rounded as llamapy's or llama.cpp's mat-vec does."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.exactness_reference import exact_logits  # noqa: E402

KQ_FLOAT_LABEL = (
    "llamapy decode, f16 KV, k-quant mat-vec kernels bypassed (dequantized tiles + sgemm: float activations)"
)


@contextlib.contextmanager
def kquant_matvec_off() -> Any:
    """An experiment, in this process only: while active, graphs built by the CPU backend send k-quant
    weights to its dequantized-tile + sgemm path (float activations) instead of the mat-vec kernels that
    round the activations to Q8_K (``matmul_kernels.MATVEC`` without its ``*_K`` entries)."""
    from llamapy.ggml.cpu import matmul_kernels as mk

    saved = {k: mk.MATVEC.pop(k) for k in list(mk.MATVEC) if k.endswith("_K")}
    try:
        yield
    finally:
        mk.MATVEC.update(saved)


def exact_logits_with(model: Any, types: set[str], tokens: list[int], rows: slice) -> np.ndarray:
    """``exact_logits`` with the activations of the linear layers whose weight type is in ``types`` rounded
    as a quantized mat-vec does (``ActivationRounding``)."""
    hooks = ActivationRounding(model, model.gguf_path, types)
    try:
        return exact_logits(model, tokens, rows)
    finally:
        hooks.close()


# llama.cpp's vec_dot_type: the type its CPU mat-vec rounds the activations to, per weight type
VEC_DOT = {"Q4_0": "Q8_0", "Q5_0": "Q8_0", "Q8_0": "Q8_0", "Q4_1": "Q8_1", "Q5_1": "Q8_1",
           "Q2_K": "Q8_K", "Q3_K": "Q8_K", "Q4_K": "Q8_K", "Q5_K": "Q8_K", "Q6_K": "Q8_K"}  # fmt: skip
_HF_LINEAR = {
    "attn_q.weight": "self_attn.q_proj",
    "attn_k.weight": "self_attn.k_proj",
    "attn_v.weight": "self_attn.v_proj",
    "attn_output.weight": "self_attn.o_proj",
    "ffn_gate.weight": "mlp.gate_proj",
    "ffn_up.weight": "mlp.up_proj",
    "ffn_down.weight": "mlp.down_proj",
}


class ActivationRounding:
    """Hooks on the exact model's linear layers that round their inputs as a quantized mat-vec does:
    ``dequantize(quantize(float32(x), vec_dot_type))`` for the weights whose GGUF type is in ``types``
    (everything else stays float64). Simulates one source of error at a time."""

    def __init__(self, model: Any, path: Path, types: set[str]) -> None:
        from llamapy.gguf import GGUFReader

        self.handles = []
        with GGUFReader(path) as r:
            wtypes = {t.name: t.ggml_type.name for t in r}
        mods = dict(model.named_modules())
        for name, wt in wtypes.items():
            if wt not in types:
                continue
            if name == "token_embd.weight" and "output.weight" not in wtypes:
                mod = mods["lm_head"]
            elif name == "output.weight":
                mod = mods["lm_head"]
            elif name.startswith("blk.") and name.split(".", 2)[2] in _HF_LINEAR:
                il, rest = name[4:].split(".", 1)
                mod = mods[f"model.layers.{il}.{_HF_LINEAR[rest]}"]
            else:
                continue
            self.handles.append(mod.register_forward_pre_hook(self._hook(VEC_DOT[wt])))

    @staticmethod
    def _hook(vt: str) -> Any:
        import torch

        from llamapy.ggml import quants
        from llamapy.ggml.types import GGMLType

        t = GGMLType[vt]

        def hook(mod: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
            x = args[0]
            xf = x.detach().numpy().astype(np.float32).reshape(-1, x.shape[-1])
            y = np.asarray(quants.dequantize(quants.quantize(xf, t), t), dtype=np.float64)
            return (torch.from_numpy(y.reshape(x.shape)),) + tuple(args[1:])

        return hook

    def close(self) -> None:
        for h in self.handles:
            h.remove()
