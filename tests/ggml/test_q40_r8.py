"""Q4_0 / Q4_1 rows read eight at a time where the file stores them (``q40_r8_kernels``): bit for bit the
repacked 8-row kernel's result (``q40_x8_kernels``) for any row count (the last rows past a multiple of 8
through a padded copy), ``W @ (x quantized to 16 bits)`` in float64, exact where every float step is,
non-finite activation rows give NaN rows, the decode dispatch picks them, and a model decodes the same
logits whether or not its weights are repacked."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.ggml import GGMLType as T
from llamapy.ggml.cpu import matmul_kernels as mk
from llamapy.ggml.cpu import matmul_steps, q40_x8
from llamapy.ggml.cpu.q40_r8_kernels import mm_q4_0_r8, mm_q4_0_r8_l1, mm_q4_1_r8, mm_q4_1_r8_l1
from llamapy.ggml.cpu.q40_x8_kernels import mm_q4_0_x8, mm_q4_1_x8
from llamapy.ggml.quants import dequantize
from tests.ggml.generic_target import run_on_generic_target
from tests.ggml.test_q40_x8 import q4_0_integer_case, q16, random_bytes, weights

F16 = mk.F16_TABLE
R8 = {T.Q4_0: (mm_q4_0_r8, mm_q4_0_r8_l1), T.Q4_1: (mm_q4_1_r8, mm_q4_1_r8_l1)}
X8 = {T.Q4_0: mm_q4_0_x8, T.Q4_1: mm_q4_1_x8}


def x8_result(raw: np.ndarray, t: T, x: np.ndarray) -> np.ndarray:
    """The repacked kernel's result for the rows ``raw``, padded to a multiple of 8 with the last row."""
    N = raw.shape[0]
    pad = np.concatenate([raw, np.repeat(raw[-1:], -N % 8, 0)]) if N % 8 else raw
    out = np.zeros((x.shape[0], pad.shape[0]), np.float32)
    X8[t](q40_x8.repack(np.ascontiguousarray(pad), t), x, out, 0)
    return out[:, :N]


@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_1])
@pytest.mark.parametrize(
    ("N", "K"), [(8, 32), (24, 96), (64, 1536), (40, 2816), (1, 64), (13, 96), (37, 576)]
)
@pytest.mark.parametrize("M", [1, 3])
def test_r8_kernel_gives_the_repacked_kernels_bits(t, N, K, M):
    raw = random_bytes(t, N, K, N + K) if N % 2 else weights(t, N, K, N + K)
    x = np.random.default_rng(M).standard_normal((M, K)).astype(np.float32)
    expect = x8_result(raw, t, x)
    for kern in R8[t]:
        out = np.full((M, N), -7.0, np.float32)
        kern(raw, x, out, F16)
        assert np.array_equal(out.view(np.uint32), expect.view(np.uint32)), kern
    ref = q16(x) @ dequantize(raw, t).astype(np.float64).T
    assert float(((out - ref) ** 2).sum() / (ref**2).sum()) < 1e-12


def test_r8_kernel_integer_sums_are_exact():
    """Every float step exact (``q4_0_integer_case``): the result is the integer dot product bit for bit
    (the nibble order, the transposition of the rows' bytes, the -8 folded into the activation sums)."""
    raw, x, expect = q4_0_integer_case(21, 256)
    out = np.zeros((2, 21), np.float32)
    mm_q4_0_r8(raw, x, out, F16)
    np.testing.assert_array_equal(out, expect)


@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_1])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_r8_kernel_nonfinite_activation_rows_give_nan(t, bad):
    raw = weights(t, 19, 512, 2)
    x = np.random.default_rng(3).standard_normal((3, 512)).astype(np.float32)
    x[1, 300] = bad
    out = np.zeros((3, 19), np.float32)
    R8[t][0](raw, x, out, F16)
    assert np.isfinite(out[[0, 2]]).all()
    assert np.isnan(out[1]).all()


_GENERIC = """
import numpy as np
from llamapy.ggml import GGMLType as T
from llamapy.ggml.cpu import q40_x8, x8simd
from llamapy.ggml.cpu.matmul_kernels import F16_TABLE
from llamapy.ggml.cpu.q40_r8_kernels import mm_q4_1_r8
from llamapy.ggml.cpu.q40_x8_kernels import mm_q4_1_x8
from llamapy.ggml.quants import dequantize, quantize
assert not x8simd.HAVE_F16C
rng = np.random.default_rng(5)
raw = np.asarray(quantize(rng.standard_normal((21, 96)).astype(np.float32), T.Q4_1)).reshape(21, -1)
x = rng.standard_normal((2, 96)).astype(np.float32)
out = np.zeros((2, 21), np.float32)
mm_q4_1_r8(raw, x, out, F16_TABLE)
pad = np.concatenate([raw, np.repeat(raw[-1:], 3, 0)])
x8 = np.zeros((2, 24), np.float32)
mm_q4_1_x8(q40_x8.repack(pad, T.Q4_1), x, x8, 0)
assert np.array_equal(out, x8[:, :21])
ref = x.astype(np.float64) @ dequantize(raw, T.Q4_1).astype(np.float64).T
assert np.abs(out - ref).max() < 1e-3 * np.abs(ref).max()
print("ok")
"""


def test_r8_kernel_generic_ir_on_a_plain_x86_64_target():
    """NUMBA_CPU_NAME=generic: no AVX2 or F16C, so the scales' half floats are converted in integer IR
    and the multiplies are generic IR; the transposition is generic IR on every target."""
    run_on_generic_target(_GENERIC)


@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_1])
def test_one_row_of_a_plain_weight_runs_the_r8_kernel(t):
    assert mk.matvec_kernel(t.name, 1) is R8[t][0]
    assert matmul_steps.matvec_l1(t.name) is R8[t][1]
    assert mk.matvec_kernel(t.name, 2) is mk.MATVEC_BATCH[t.name]  # a few rows: each block decoded once


@pytest.mark.parametrize("ftype", ["Q4_0", "Q4_1"])
def test_a_model_decodes_the_same_logits_repacked_or_not(tmp_path, ftype):
    """Token by token (one activation row: the r8 kernels where the weights stay in the file, the x8
    kernels on the repacked copies), the logits agree bit for bit."""
    from llamapy.batch import Batch
    from llamapy.context import Context, ContextParams
    from llamapy.gguf.reader import GGUFReader
    from llamapy.model import Model
    from llamapy.quantize import quantize_file
    from tests.quantize.models import write_model

    src = write_model("tied8", tmp_path / "tied8.gguf")
    path = tmp_path / f"tied8-{ftype}.gguf"
    quantize_file(src, path, ftype, pure=True)
    with GGUFReader(path) as r:
        assert {t.ggml_type.name for t in r.tensors if t.name.startswith("blk.") and len(t.shape) == 2} == {
            ftype
        }
    model = Model.load(path)
    runs = []
    for repack in (False, True):
        ctx = Context(model, ContextParams(n_ctx=64, n_threads=2, repack=repack))
        rows = []
        for i, tok in enumerate([1, 17, 42, 99, 200, 3]):
            ctx.decode(Batch.from_tokens([tok], pos0=i))
            rows.append(ctx.get_logits()[-1].copy())
        runs.append(np.stack(rows))
    assert np.isfinite(runs[0]).all()
    assert np.array_equal(runs[0].view(np.uint32), runs[1].view(np.uint32))
