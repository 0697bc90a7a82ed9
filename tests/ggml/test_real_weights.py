"""The CPU kernels on real model weights (every type the two test models use) against gguf-py's
dequantize-then-matmul, an independent implementation (few tokens of k-quants: with the activations
quantized to Q8_K, as the kernels do)."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.ggml import GGMLType as T
from llamapy.ggml import Graph, Scheduler, ops
from llamapy.ggml.cpu import q40_x8, q50_x8, q80_x8
from llamapy.ggml.cpu.backend import CPUBackend, matvec_max_rows
from llamapy.gguf import GGUFReader
from tests.util import as_kernel_sees

gguf = pytest.importorskip("gguf")

SMOLLM2 = ["blk.0.attn_q.weight", "blk.3.ffn_down.weight"]  # Q4_1
GEMMA3 = ["blk.0.attn_v.weight", "blk.0.attn_q.weight", "blk.0.attn_output.weight", "blk.0.ffn_down.weight"]


def _check(path, names, embd):
    r = GGUFReader(path)
    s = Scheduler([CPUBackend(2)])
    rng = np.random.default_rng(0)
    for name in names:
        info = r.tensor_index[name]
        w = ops.weight(name, info.ggml_type, tuple(info.shape), info.array())
        ref_w = gguf.quants.dequantize(info.array(), gguf.GGMLQuantizationType(int(info.ggml_type)))
        for m in (1, 5, 40):
            x = ops.new_tensor(T.F32, (m, info.shape[1]))
            y = ops.mul_mat(w, x)
            xv = rng.standard_normal((m, info.shape[1])).astype(np.float32)
            s.compute(Graph(y), {x: xv})
            # Q8_0 repacked (a mapped weight: ``q80_x8``; Q4_0 / Q4_1: ``q40_x8``; Q5_0: ``q50_x8``) multiplies 16-bit activations up
            # to its MAX_ROWS
            q16 = m == 1 or (info.ggml_type == T.Q8_0 and q80_x8.ENABLED and m <= q80_x8.MAX_ROWS)
            q16 = q16 or (info.ggml_type in q40_x8.TYPES and q40_x8.ENABLED and m <= q40_x8.MAX_ROWS)
            q16 = q16 or (info.ggml_type in q50_x8.TYPES and q50_x8.ENABLED and m <= q50_x8.MAX_ROWS)
            xk = (
                as_kernel_sees(info.ggml_type.name, xv, matvec=q16)
                if m <= matvec_max_rows(info.ggml_type.name) or q16
                else xv
            )
            ref = xk.astype(np.float64) @ ref_w.T.astype(np.float64)
            err = np.sum((s.get(y) - ref) ** 2) / np.sum(ref**2)
            assert err < 1e-10, (name, info.ggml_type.name, m, err)
    info = r.tensor_index[embd]
    tab = ops.weight(embd, info.ggml_type, tuple(info.shape), info.array())
    ids = ops.new_tensor(T.I32, (3,))
    rows = ops.get_rows(tab, ids)
    iv = np.array([0, 1234, info.shape[0] - 1], np.int32)
    s.compute(Graph(rows), {ids: iv})
    ref = gguf.quants.dequantize(info.array()[iv], gguf.GGMLQuantizationType(int(info.ggml_type)))
    np.testing.assert_array_equal(s.get(rows), ref)


def test_smollm2_q4_1_and_q8_0(smollm2_path):
    _check(smollm2_path, SMOLLM2, "token_embd.weight")


def test_gemma3_q8_0_q5_0_q4_k_q6_k(gemma3_path):
    _check(gemma3_path, GEMMA3, "token_embd.weight")
