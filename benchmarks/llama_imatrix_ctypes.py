"""llama-imatrix through llama.cpp's library (``libllama.so``) with ctypes, for when the ``llama-imatrix``
binary is not built: its ``compute_imatrix`` loop (chunks of ``-c`` tokens, ``-b / -c`` sequences per
batch, BOS first when the model adds one, every token an output) and its ``collect_imatrix`` eval
callback (float32 sums of squared ``src1`` rows per weight, per expert for ``MUL_MAT_ID``; batches
under 16 tokens skipped), written in its GGUF format.

    python benchmarks/llama_imatrix_ctypes.py -m MODEL -f TEXT -o OUT [-c 512] [-b 2048] [--chunks N] [-t N]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import ctypes as C  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.harness import llamacpp_bin  # noqa: E402

LIB = llamacpp_bin("avx2")


class Tensor(C.Structure):
    pass


Tensor._fields_ = [
    ("type", C.c_int), ("buffer", C.c_void_p), ("ne", C.c_int64 * 4), ("nb", C.c_size_t * 4), ("op", C.c_int),
    ("op_params", C.c_int32 * 16), ("flags", C.c_int32), ("src", C.POINTER(Tensor) * 10),
    ("view_src", C.POINTER(Tensor)), ("view_offs", C.c_size_t), ("data", C.c_void_p), ("name", C.c_char * 64),
    ("extra", C.c_void_p), ("padding", C.c_char * 8),
]  # fmt: skip


class Batch(C.Structure):
    _fields_ = [
        ("n_tokens", C.c_int32), ("token", C.POINTER(C.c_int32)), ("embd", C.POINTER(C.c_float)),
        ("pos", C.POINTER(C.c_int32)), ("n_seq_id", C.POINTER(C.c_int32)),
        ("seq_id", C.POINTER(C.POINTER(C.c_int32))), ("logits", C.POINTER(C.c_int8)),
    ]  # fmt: skip


# the parameter structs are passed as opaque blobs (each is the last argument and, returned, written by
# the callee), larger than the real ones; only these offsets of llama_context_params are touched
CTX_N_CTX, CTX_N_BATCH, CTX_N_UBATCH, CTX_N_SEQ_MAX, CTX_N_THREADS, CTX_N_THREADS_BATCH = 0, 4, 8, 12, 28, 32
CTX_CB_EVAL, CTX_CB_USER, CTX_TYPE_K, CTX_TYPE_V = 88, 96, 104, 108
_KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 8}


class Blob(C.Structure):
    _fields_ = [("b", C.c_uint8 * 1024)]


CB = C.CFUNCTYPE(C.c_bool, C.POINTER(Tensor), C.c_bool, C.c_void_p)


def _arr(t: Tensor, dtype: type) -> np.ndarray:
    """A strided NumPy view of a host tensor (ggml order reversed: NumPy shape [ne3, ne2, ne1, ne0])."""
    item = np.dtype(dtype).itemsize
    n_bytes = sum((t.ne[i] - 1) * t.nb[i] for i in range(4)) + item
    base = np.frombuffer((C.c_uint8 * n_bytes).from_address(t.data), dtype=dtype)
    shape = tuple(t.ne[i] for i in (3, 2, 1, 0))
    return np.lib.stride_tricks.as_strided(base, shape=shape, strides=tuple(t.nb[i] for i in (3, 2, 1, 0)))


class Collector:
    def __init__(self, lib: C.CDLL, chunk_size: int, process_output: bool) -> None:
        self.lib = lib
        self.chunk_size = chunk_size
        self.process_output = process_output
        self.values: dict[str, np.ndarray] = {}
        self.counts: dict[str, np.ndarray] = {}
        self.cb = CB(self._cb)

    def _cb(self, tp, ask, _ud):  # noqa: ANN001
        try:
            return self.collect(tp.contents, bool(ask))
        except Exception as e:  # never raise through C
            print(f"collector error: {e!r}", file=sys.stderr)
            return False

    def collect(self, t: Tensor, ask: bool) -> bool:
        op = self.lib.ggml_op_name(t.op).decode()
        if op not in ("MUL_MAT", "MUL_MAT_ID"):
            return False
        src0, src1 = t.src[0].contents, t.src[1].contents
        name = src0.name.decode()
        if "#" in name:  # CUDA0#blk.0.attn_k.weight#0
            name = name.split("#")[1]
        if ask:
            if op == "MUL_MAT_ID":
                return True
            if src1.ne[1] < 16 or src1.type != 0:
                return False
            return name.startswith("blk.") or (self.process_output and name == "output.weight")
        x = _arr(src1, np.float32)  # [ne3, ne2, ne1, ne0]
        ne0 = src1.ne[0]
        if op == "MUL_MAT_ID":
            ids_t = t.src[2].contents
            ids = _arr(ids_t, np.int32)[0, 0]  # [n_tokens, n_ids]
            n_as = src0.ne[2]
            v = self.values.setdefault(name, np.zeros((n_as, ne0), np.float32))
            c = self.counts.setdefault(name, np.zeros(n_as, np.int64))
            if len(c) == 1 and n_as > 1:
                c = self.counts[name] = np.full(n_as, c[0], np.int64)
            n_ids, n_tokens = ids_t.ne[0], src1.ne[2]
            for idx in range(n_ids):
                for row in range(n_tokens):
                    ex = int(ids[row, idx])
                    xr = x[0, row, idx % src1.ne[1]]
                    c[ex] += 1
                    v[ex] += xr * xr
            return True
        n_mat = src0.ne[2] * src0.ne[3]
        v = self.values.setdefault(name, np.zeros((n_mat, ne0), np.float32))
        c = self.counts.setdefault(name, np.zeros(1, np.int64))
        for i3 in range(src1.ne[3]):
            for i2 in range(src1.ne[2]):
                mat = (i3 % src0.ne[3]) * src0.ne[2] + (i2 % src0.ne[2])
                acc = v[mat]
                for row in range(src1.ne[1]):  # row by row, float32, as the C loop
                    xr = x[i3, i2, row]
                    acc += xr * xr
        nrows = src1.ne[1] * src1.ne[2] * src1.ne[3]
        c += nrows // n_mat
        return True


def compute(lib_dir: Path, model: str, text_path: str, out: str, n_ctx: int, n_batch: int, n_chunks: int,
            threads: int, process_output: bool, type_k: str = "f16", type_v: str = "f16") -> int:  # fmt: skip
    from llamapy.quantize import Imatrix, ImatrixEntry, save_imatrix

    C.CDLL(str(lib_dir / "libggml-base.so"), mode=C.RTLD_GLOBAL)
    C.CDLL(str(lib_dir / "libggml.so"), mode=C.RTLD_GLOBAL)
    lib = C.CDLL(str(lib_dir / "libllama.so"))
    base = C.CDLL(str(lib_dir / "libggml-base.so"))
    base.ggml_op_name.restype = C.c_char_p
    lib.ggml_op_name = base.ggml_op_name
    lib.llama_model_default_params.restype = Blob
    lib.llama_context_default_params.restype = Blob
    lib.llama_model_load_from_file.restype = C.c_void_p
    lib.llama_model_load_from_file.argtypes = [C.c_char_p, Blob]
    lib.llama_init_from_model.restype = C.c_void_p
    lib.llama_init_from_model.argtypes = [C.c_void_p, Blob]
    lib.llama_model_get_vocab.restype = C.c_void_p
    lib.llama_model_get_vocab.argtypes = [C.c_void_p]
    lib.llama_vocab_get_add_bos.argtypes = [C.c_void_p]
    lib.llama_vocab_get_add_bos.restype = C.c_bool
    lib.llama_vocab_bos.argtypes = [C.c_void_p]
    lib.llama_tokenize.argtypes = [C.c_void_p, C.c_char_p, C.c_int32, C.POINTER(C.c_int32), C.c_int32, C.c_bool,
                                   C.c_bool]  # fmt: skip
    lib.llama_get_memory.restype = C.c_void_p
    lib.llama_get_memory.argtypes = [C.c_void_p]
    lib.llama_memory_clear.argtypes = [C.c_void_p, C.c_bool]
    lib.llama_batch_init.restype = Batch
    lib.llama_batch_init.argtypes = [C.c_int32, C.c_int32, C.c_int32]
    lib.llama_decode.argtypes = [C.c_void_p, Batch]
    lib.llama_backend_init()

    n_seq = max(1, n_batch // n_ctx)
    n_kv = n_seq * n_ctx
    n_batch = min(n_batch, n_kv)
    col = Collector(lib, n_ctx, process_output)
    mp = lib.llama_model_default_params()
    m = lib.llama_model_load_from_file(model.encode(), mp)
    if not m:
        print("cannot load the model", file=sys.stderr)
        return 1
    cp = lib.llama_context_default_params()
    raw = bytearray(bytes(cp.b))

    def put(off: int, fmt: str, v: object) -> None:
        import struct

        raw[off : off + struct.calcsize(fmt)] = struct.pack(fmt, v)

    put(CTX_N_CTX, "<I", n_kv)
    put(CTX_N_BATCH, "<I", n_batch)
    put(CTX_N_UBATCH, "<I", min(512, n_batch))
    put(CTX_N_SEQ_MAX, "<I", n_seq)
    put(CTX_N_THREADS, "<i", threads)
    put(CTX_N_THREADS_BATCH, "<i", threads)
    put(CTX_CB_EVAL, "<Q", C.cast(col.cb, C.c_void_p).value)
    put(CTX_CB_USER, "<Q", 0)
    put(CTX_TYPE_K, "<i", _KV_TYPES[type_k])
    put(CTX_TYPE_V, "<i", _KV_TYPES[type_v])
    blob = Blob()
    C.memmove(C.addressof(blob), bytes(raw), len(raw))
    ctx = lib.llama_init_from_model(m, blob)
    if not ctx:
        print("cannot make a context", file=sys.stderr)
        return 1
    vocab = lib.llama_model_get_vocab(m)
    text = Path(text_path).read_bytes()
    buf = (C.c_int32 * (len(text) + 16))()
    n = lib.llama_tokenize(vocab, text, len(text), buf, len(buf), True, False)
    tokens = list(buf[:n])
    add_bos = lib.llama_vocab_get_add_bos(vocab)
    bos = lib.llama_vocab_bos(vocab)
    n_chunk_max = len(tokens) // n_ctx
    n_chunk = n_chunk_max if n_chunks < 0 else min(n_chunks, n_chunk_max)
    num_batches = (n_ctx + n_batch - 1) // n_batch
    batch = lib.llama_batch_init(n_batch, 0, n_seq)
    for i in range(0, n_chunk, n_seq):
        start = i * n_ctx
        n_seq_batch = min(n_seq, n_chunk - i)
        lib.llama_memory_clear(lib.llama_get_memory(ctx), True)
        for j in range(num_batches):
            b0 = start + j * n_batch
            size = min(start + n_ctx - b0, n_batch)
            k = 0
            for s in range(n_seq_batch):
                s0 = b0 + s * n_ctx
                for q in range(size):
                    tok = bos if (add_bos and j == 0 and q == 0) else tokens[s0 + q]
                    batch.token[k] = tok
                    batch.pos[k] = j * n_batch + q
                    batch.n_seq_id[k] = 1
                    batch.seq_id[k][0] = s
                    batch.logits[k] = 1
                    k += 1
            batch.n_tokens = k
            if lib.llama_decode(ctx, batch):
                print("decode failed", file=sys.stderr)
                return 1
    im = Imatrix(datasets=[text_path], chunk_size=n_ctx)
    for name in sorted(col.values):
        im.entries[name] = ImatrixEntry(col.values[name].reshape(-1).copy(), col.counts[name].copy())
    mx = max((int(c.max()) for c in col.counts.values()), default=0)
    im.chunk_count = mx // n_ctx
    save_imatrix(im, out)
    print(f"stored {len(im.entries)} entries after {im.chunk_count} chunks in {out}", file=sys.stderr)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", type=Path, default=LIB)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-f", "--file", required=True)
    ap.add_argument("-o", "--output", default="imatrix.gguf")
    ap.add_argument("-c", "--ctx-size", type=int, default=512)
    ap.add_argument("-b", "--batch-size", type=int, default=2048)
    ap.add_argument("--chunks", type=int, default=-1)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--process-output", action="store_true")
    ap.add_argument("-ctk", "--cache-type-k", default="f16")
    ap.add_argument("-ctv", "--cache-type-v", default="f16")
    ap.add_argument("--no-ppl", action="store_true", help="(accepted for llama-imatrix compatibility)")
    a = ap.parse_args()
    return compute(
        a.lib, a.model, a.file, a.output, a.ctx_size, a.batch_size, a.chunks, a.threads, a.process_output
    )


if __name__ == "__main__":
    sys.exit(main())
