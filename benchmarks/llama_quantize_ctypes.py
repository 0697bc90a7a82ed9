"""llama-quantize through llama.cpp's library (``libllama.so``'s ``llama_model_quantize``) with ctypes,
for when the ``llama-quantize`` binary is not built: the same quantizer, called as its ``main`` calls it
(imatrix normalized as its ``load_imatrix`` does, the ``quantize.imatrix.*`` keys added).

    python benchmarks/llama_quantize_ctypes.py [--lib DIR] [--imatrix FILE] IN OUT TYPE [nthreads]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import ctypes as C  # noqa: E402

from benchmarks.harness import llamacpp_bin  # noqa: E402

LIB = llamacpp_bin("avx2")
GGML_TYPE_COUNT = 42  # not a type: "unset" for the output / token embedding types (any value >= the count)


class ImatrixData(C.Structure):
    _fields_ = [("name", C.c_char_p), ("data", C.POINTER(C.c_float)), ("size", C.c_size_t)]


class KvOverride(C.Structure):
    class _V(C.Union):
        _fields_ = [
            ("val_i64", C.c_int64),
            ("val_f64", C.c_double),
            ("val_bool", C.c_bool),
            ("val_str", C.c_char * 128),
        ]

    _anonymous_ = ("v",)
    _fields_ = [("tag", C.c_int), ("key", C.c_char * 128), ("v", _V)]


class Params(C.Structure):
    _fields_ = [
        ("nthread", C.c_int32), ("ftype", C.c_int), ("output_tensor_type", C.c_int), ("token_embedding_type", C.c_int),
        ("allow_requantize", C.c_bool), ("quantize_output_tensor", C.c_bool), ("only_copy", C.c_bool),
        ("pure", C.c_bool), ("keep_split", C.c_bool), ("dry_run", C.c_bool),
        ("imatrix", C.POINTER(ImatrixData)), ("kv_overrides", C.POINTER(KvOverride)), ("tt_overrides", C.c_void_p),
        ("prune_layers", C.POINTER(C.c_int32)), ("max_buf_size", C.c_size_t),
    ]  # fmt: skip


def quantize(
    lib_dir: Path,
    inp: str,
    out: str,
    type_name: str,
    nthread: int,
    imatrix: str | None,
    dry_run: bool = False,
) -> int:
    import numpy as np

    from llamapy.quantize import load_imatrix, parse_ftype

    C.CDLL(str(lib_dir / "libggml-base.so"), mode=C.RTLD_GLOBAL)
    C.CDLL(str(lib_dir / "libggml.so"), mode=C.RTLD_GLOBAL)
    lib = C.CDLL(str(lib_dir / "libllama.so"))
    lib.llama_model_quantize_default_params.restype = Params
    lib.llama_model_quantize.restype = C.c_uint32
    lib.llama_model_quantize.argtypes = [C.c_char_p, C.c_char_p, C.POINTER(Params)]
    lib.llama_backend_init()
    p = lib.llama_model_quantize_default_params()
    ft = parse_ftype(type_name)
    p.ftype = ft.ftype
    p.nthread = nthread
    p.only_copy = ft.name == "COPY"
    p.dry_run = dry_run
    keep = []
    if imatrix:
        im = load_imatrix(imatrix)
        weights = im.weights()
        arr = (ImatrixData * (len(weights) + 1))()
        for i, (name, w) in enumerate(weights.items()):
            w = np.ascontiguousarray(w, dtype=np.float32)
            keep += [w, name.encode()]
            arr[i] = ImatrixData(keep[-1], w.ctypes.data_as(C.POINTER(C.c_float)), w.size)
        p.imatrix = arr
        kvs = (KvOverride * 5)()
        kvs[0].tag, kvs[0].key, kvs[0].val_str = 3, b"quantize.imatrix.file", imatrix.encode()[:127]
        n = 1
        if im.datasets:
            kvs[n].tag, kvs[n].key, kvs[n].val_str = (
                3,
                b"quantize.imatrix.dataset",
                im.datasets[0].encode()[:127],
            )
            n += 1
        kvs[n].tag, kvs[n].key, kvs[n].val_i64 = 0, b"quantize.imatrix.entries_count", len(weights)
        n += 1
        if im.chunk_count > 0:
            kvs[n].tag, kvs[n].key, kvs[n].val_i64 = 0, b"quantize.imatrix.chunks_count", im.chunk_count
        p.kv_overrides = kvs
        keep += [arr, kvs]
    return int(lib.llama_model_quantize(inp.encode(), out.encode(), C.byref(p)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", type=Path, default=LIB)
    ap.add_argument("--imatrix")
    ap.add_argument("--dry-run", action="store_true", help="the per-tensor table on stderr, nothing written")
    ap.add_argument("inp")
    ap.add_argument("out")
    ap.add_argument("type")
    ap.add_argument("nthread", nargs="?", type=int, default=0)
    a = ap.parse_args()
    return 1 if quantize(a.lib, a.inp, a.out, a.type, a.nthread, a.imatrix, a.dry_run) else 0


if __name__ == "__main__":
    sys.exit(main())
