"""dequantize: bit-exact with gguf-py (test-only oracle) on the real models and on random blocks."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.ggml.quants import (
    QUANTS,
    QuantError,
    dequantize,
    dequantize_numpy,
    dequantize_rows_into,
    get_quant,
    has_fast_dequantize,
    rows_dequantizer,
)
from llamapy.ggml.types import TRAITS, GGMLType
from llamapy.gguf import GGUFReader

gguf = pytest.importorskip("gguf")

BLOCK_TYPES = [t for t in GGMLType if TRAITS[t].quantized]
# types gguf-py can dequantize (its Q8_1 is 40 bytes, not llama.cpp's 36: checked separately)
ORACLE_TYPES = [
    t
    for t in BLOCK_TYPES + [GGMLType.BF16, GGMLType.F16, GGMLType.F32]
    if t != GGMLType.Q8_1
    and gguf.GGMLQuantizationType(int(t)) in gguf.quants._type_traits
    or t in (GGMLType.F16, GGMLType.F32)
]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal as float32 bit patterns (any NaN equals any NaN)."""
    if a.shape != b.shape or a.dtype != np.float32 or b.dtype != np.float32:
        return False
    nan = np.isnan(a)
    return bool(
        np.array_equal(nan, np.isnan(b)) and np.array_equal(a.view(np.uint32)[~nan], b.view(np.uint32)[~nan])
    )


def oracle(raw: np.ndarray, t: GGMLType) -> np.ndarray:
    with np.errstate(all="ignore"):
        return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(int(t)))


def test_every_type_has_a_codec():
    assert set(QUANTS) == set(GGMLType)
    for t in GGMLType:
        q = get_quant(t)
        assert q.block_size == TRAITS[t].block_size and q.type_size == TRAITS[t].type_size


@pytest.mark.parametrize("t", ORACLE_TYPES, ids=lambda t: t.name)
def test_random_blocks_match_gguf_py(t: GGMLType):
    rng = np.random.default_rng(int(t))
    ts = TRAITS[t].type_size
    raw = rng.integers(0, 256, size=(3, 7 * ts), dtype=np.uint8)
    with np.errstate(all="ignore"):
        mine = dequantize(raw, t)
    assert mine.shape == (3, 7 * TRAITS[t].block_size)
    assert same_bits(mine, oracle(raw, t))


@pytest.mark.parametrize("t", BLOCK_TYPES, ids=lambda t: t.name)
def test_rows_into_matches_dequantize(t: GGMLType):
    rng = np.random.default_rng(100 + int(t))
    tr = TRAITS[t]
    raw = rng.integers(0, 256, size=(5, 3 * tr.type_size), dtype=np.uint8)
    # finite scales so that the comparison is meaningful everywhere
    with np.errstate(all="ignore"):
        ref = dequantize_numpy(raw, t)
        out = np.full((5, 3 * tr.block_size), np.nan, dtype=np.float32)
        assert dequantize_rows_into(raw, t, out) is out
    assert same_bits(out, ref)


@pytest.mark.parametrize("t", BLOCK_TYPES, ids=lambda t: t.name)
def test_rows_dequantizer_is_rows_into(t: GGMLType):
    """The prepared function gives dequantize_rows_into's bytes, call after call into the same ``out``
    (the Numba kernel where the type has one, the NumPy codec otherwise)."""
    rng = np.random.default_rng(200 + int(t))
    tr = TRAITS[t]
    out = np.full((4, 2 * tr.block_size), np.nan, dtype=np.float32)
    deq = rows_dequantizer(t, 4, 2 * tr.type_size, out)
    for _ in range(2):
        raw = rng.integers(0, 256, size=(4, 2 * tr.type_size), dtype=np.uint8)
        with np.errstate(all="ignore"):
            ref = dequantize_rows_into(raw, t, np.empty_like(out))
            assert deq(raw) is out
        assert same_bits(out, ref)


def test_rows_dequantizer_checks_once_when_made():
    out = np.zeros((2, 32), np.float32)
    with pytest.raises(QuantError, match="not a whole number of 18-byte blocks"):
        rows_dequantizer(GGMLType.Q4_0, 2, 19, out)
    with pytest.raises(QuantError, match=r"out must be float32\[3, 32\]"):
        rows_dequantizer(GGMLType.Q4_0, 3, 18, out)
    with pytest.raises(QuantError, match=r"out must be float32\[2, 64\]"):
        rows_dequantizer(GGMLType.Q4_0, 2, 36, out)
    with pytest.raises(QuantError, match="out must be float32"):
        rows_dequantizer(GGMLType.Q4_0, 2, 18, out.astype(np.float64))
    out.flags.writeable = False
    with pytest.raises(QuantError, match="read-only"):
        rows_dequantizer(GGMLType.Q4_0, 2, 18, out)
    with pytest.raises(QuantError, match="unknown ggml type"):
        rows_dequantizer(4, 2, 18, np.zeros((2, 32), np.float32))
    assert rows_dequantizer(GGMLType.Q4_K, 0, 144, np.zeros((0, 256), np.float32))(
        np.zeros((0, 144), np.uint8)
    ).shape == (0, 256)


def test_q8_1_layout_is_llama_cpp():
    # half d, half s, 32 x int8; x = d * q
    d = np.float16(0.5)
    q = np.arange(-16, 16, dtype=np.int8)
    blk = np.concatenate(
        [
            np.frombuffer(d.tobytes(), np.uint8),
            np.frombuffer(np.float16(123).tobytes(), np.uint8),
            q.view(np.uint8),
        ]
    )
    assert blk.size == 36
    np.testing.assert_array_equal(dequantize(blk, GGMLType.Q8_1), q.astype(np.float32) * np.float32(0.5))


def test_plain_typed_arrays():
    x = np.array([[1.5, -2.0, 3.25]], dtype=np.float16)
    np.testing.assert_array_equal(dequantize(x, GGMLType.F16), x.astype(np.float32))
    np.testing.assert_array_equal(dequantize(x.view(np.uint8), GGMLType.F16), x.astype(np.float32))
    bf = np.array([0x3FC0, 0xC000], dtype=np.uint16)  # 1.5, -2.0
    np.testing.assert_array_equal(dequantize(bf, GGMLType.BF16), [1.5, -2.0])
    np.testing.assert_array_equal(dequantize(np.array([7, -3], np.int32), GGMLType.I32), [7.0, -3.0])


def test_bad_input_raises_typed_errors():
    with pytest.raises(QuantError, match="not a whole number of 18-byte blocks"):
        dequantize(np.zeros((2, 19), np.uint8), GGMLType.Q4_0)
    with pytest.raises(QuantError, match="unknown ggml type"):
        dequantize(np.zeros(18, np.uint8), 4)
    with pytest.raises(QuantError, match="scalar"):
        dequantize(np.uint8(3), GGMLType.Q8_0)
    with pytest.raises(QuantError, match="got float64"):
        dequantize(np.zeros(4, np.float64), GGMLType.F32)
    with pytest.raises(QuantError, match="expected uint8 bytes"):
        dequantize(np.zeros((2, 9), np.uint16), GGMLType.Q4_0)
    with pytest.raises(QuantError, match="out must be float32"):
        dequantize_rows_into(np.zeros((2, 18), np.uint8), GGMLType.Q4_0, np.zeros((2, 31), np.float32))
    with pytest.raises(QuantError, match="2-D"):
        dequantize_rows_into(np.zeros(18, np.uint8), GGMLType.Q4_0, np.zeros((1, 32), np.float32))
    assert issubclass(QuantError, ValueError)


def _check_model(path, max_rows: int = 48) -> set[GGMLType]:
    seen = set()
    for ti in GGUFReader(path).tensors:
        a = ti.array()
        if a.ndim >= 2:  # big tensors: a slice of rows from the start and from the end
            a = a.reshape((-1, a.shape[-1]))
            a = np.concatenate([a[: max_rows // 2], a[-max_rows // 2 :]]) if a.shape[0] > max_rows else a
        mine = dequantize(a, ti.ggml_type)
        assert same_bits(mine, oracle(a, ti.ggml_type)), ti.name
        if a.ndim == 2 and TRAITS[ti.ggml_type].quantized:
            out = np.empty_like(mine)
            assert same_bits(dequantize_rows_into(a, ti.ggml_type, out), mine), ti.name
        seen.add(ti.ggml_type)
    return seen


def test_smollm2_tensors_match_gguf_py(smollm2_path):
    assert _check_model(smollm2_path) >= {GGMLType.Q4_1, GGMLType.Q8_0, GGMLType.F32}


def test_gemma3_tensors_match_gguf_py(gemma3_path):
    assert _check_model(gemma3_path) >= {
        GGMLType.Q4_K,
        GGMLType.Q5_0,
        GGMLType.Q6_K,
        GGMLType.Q8_0,
        GGMLType.F32,
    }


HOT = "Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS".split()


@pytest.mark.parametrize("name", HOT)
def test_numba_kernels_match_numpy_on_big_inputs(name: str):
    t = GGMLType[name]
    assert has_fast_dequantize(t)
    tr = TRAITS[t]
    rng = np.random.default_rng(300 + int(t))
    nblk = 613  # odd, and big enough (>= 64 KiB) for dequantize to take the Numba path
    raw = rng.integers(0, 256, size=(7, nblk * tr.type_size), dtype=np.uint8)
    assert raw.size >= 1 << 16
    with np.errstate(all="ignore"):
        assert same_bits(dequantize(raw, t), dequantize_numpy(raw, t))
        assert same_bits(dequantize(raw.reshape(-1), t), dequantize_numpy(raw.reshape(-1), t))


def test_q8_k_dequantize():
    d = np.float32(0.25)
    q = (np.arange(256) - 128).astype(np.int8)
    blk = np.concatenate([np.frombuffer(d.tobytes(), np.uint8), q.view(np.uint8), np.zeros(32, np.uint8)])
    np.testing.assert_array_equal(dequantize(blk, GGMLType.Q8_K), q.astype(np.float32) * d)


def test_codecs_register_on_first_read_of_the_registry() -> None:
    """Importing the package registers no codec (a model run reads none); the first read of ``QUANTS``
    imports them all, once, also when several threads read it first."""
    import subprocess
    import sys

    code = (
        "import sys, threading\n"
        "from llamapy.ggml.quants import QUANTS, get_quant\n"
        "from llamapy.ggml.types import GGMLType\n"
        "print(any(m in sys.modules for m in ('llamapy.ggml.quants.kquants', 'llamapy.ggml.quants.legacy')))\n"
        "got = []\n"
        "ts = [threading.Thread(target=lambda: got.append(QUANTS[GGMLType.Q4_K].__name__)) for _ in range(8)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n"
        "print(sorted(set(got)), len(got), GGMLType.Q8_0 in QUANTS, len(QUANTS) == len(dict(QUANTS)) > 30)\n"
        "print(get_quant(GGMLType.IQ4_NL).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert lines[0] == "False"
    assert lines[1] == f"[{QUANTS[GGMLType.Q4_K].__name__!r}] 8 True True"
    assert lines[2] == QUANTS[GGMLType.IQ4_NL].__name__
