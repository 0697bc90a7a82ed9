"""``quantize_file``: llama-quantize as a library function.

Streams tensor by tensor: each tensor is read from the input's memory map, dequantized and quantized
in row chunks by a thread pool, and written before the next is read, so memory stays near one output
tensor beyond the map. Output goes to a temporary file renamed at the end: an error leaves no file.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import field
from typing import Any

import numpy as np

from .._dataclass import dataclass
from ..ggml.quants import QuantError, dequantize, quantize
from ..ggml.quants._rowq import F16_TABLE, f16_kernel, f16_kernel_cvt
from ..ggml.types import TRAITS, GGMLType
from ..gguf.constants import GGUFValueType
from ..gguf.overrides import KVOverrideError, parse_kv_override
from ..gguf.reader import GGUFError, GGUFReader, TensorInfo
from ..gguf.split import SPLIT_KEYS, GGUFModelFiles, open_model, split_path
from ..gguf.writer import GGUFWriter
from .ftypes import FType, QuantizeError, parse_ftype, parse_ggml_type
from .imatrix_file import Imatrix, load_imatrix
from .rules import (
    ModelInfo,
    Options,
    TensorDesc,
    TypePlanner,
    allows_quantization,
    requires_imatrix,
    sort_key,
)

__all__ = ["QuantizeResult", "TensorPlan", "parse_override_kv", "plan_types", "quantize_file"]

GGML_QNT_VERSION = 2
_TOKEN_EMBD_NAMES = ("token_embd.weight", "per_layer_token_embd.weight")
# elements a worker quantizes at a time (whole rows, never across an expert)
_CHUNK_ELEMS = 1 << 18
_MIN_CHUNK_ELEMS = 1 << 15


Progress = Callable[[str], None]


@dataclass
class TensorPlan:
    name: str
    ne: tuple[int, ...]
    src_type: GGMLType
    dst_type: GGMLType
    src_size: int
    dst_size: int
    uses_imatrix: bool = False


@dataclass
class QuantizeResult:
    ftype: FType
    tensors: list[TensorPlan]
    outputs: list[str] = field(default_factory=list)  # files written (none for a dry run)
    n_fallback: int = 0
    seconds: float = 0.0
    will_require_imatrix: bool = False

    @property
    def size_in(self) -> int:
        return sum(t.src_size for t in self.tensors)

    @property
    def size_out(self) -> int:
        return sum(t.dst_size for t in self.tensors)

    def types(self) -> dict[str, str]:
        """tensor name -> chosen type name (the table the tests compare with llama-quantize's)."""
        return {t.name: t.dst_type.name for t in self.tensors}


def _row_size(t: GGMLType, n: int) -> int:
    tr = TRAITS[t]
    return n // tr.block_size * tr.type_size


def _model_info(files: GGUFModelFiles) -> ModelInfo:
    arch = files.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise QuantizeError(f"{files.path}: no general.architecture: not a model file")

    def first_int(key: str, default: int) -> int:
        v = files.get(f"{arch}.{key}")
        if v is None:
            return default
        if isinstance(v, (list, tuple, np.ndarray)):
            return int(v[0]) if len(v) else default
        return int(v)

    n_layer = first_int("block_count", 0)
    n_head = first_int("attention.head_count", 0)
    return ModelInfo(
        arch=arch,
        n_layer=n_layer,
        n_head=n_head,
        n_head_kv=first_int("attention.head_count_kv", n_head),
        n_expert=first_int("expert_count", 0),
    )


def parse_override_kv(spec: str) -> tuple[str, GGUFValueType, Any]:
    """``KEY=TYPE:VALUE`` (TYPE int, float, bool or str) as llama.cpp's ``--override-kv``
    (:func:`llamapy.gguf.overrides.parse_kv_override`); ints are written as UINT32 of the absolute value,
    as llama-quantize does."""
    try:
        o = parse_kv_override(spec)
    except KVOverrideError as e:
        raise QuantizeError(str(e)) from None
    if o.type == "int":
        return o.key, GGUFValueType.UINT32, abs(int(o.value)) & 0xFFFFFFFF
    if o.type == "float":
        return o.key, GGUFValueType.FLOAT32, float(o.value)
    if o.type == "bool":
        return o.key, GGUFValueType.BOOL, bool(o.value)
    return o.key, GGUFValueType.STRING, o.value


def _imatrix_weights(
    imatrix: str | os.PathLike | Imatrix | Mapping[str, np.ndarray] | None,
    include: Sequence[str],
    exclude: Sequence[str],
) -> tuple[dict[str, np.ndarray], Imatrix | None, str]:
    if imatrix is None:
        return {}, None, ""
    if include and exclude:
        raise QuantizeError("--include-weights and --exclude-weights cannot be used together")
    im: Imatrix | None = None
    path = ""
    if isinstance(imatrix, Imatrix):
        im = imatrix
    elif isinstance(imatrix, Mapping):
        data = {k: np.asarray(v, dtype=np.float32).reshape(-1) for k, v in imatrix.items()}
    else:
        path = os.fspath(imatrix)
        im = load_imatrix(path)
        if not im.is_legacy and not im.has_metadata:
            raise QuantizeError(f"{path}: missing imatrix metadata")
    if im is not None:
        data = im.weights()
    for pat in exclude:
        data = {k: v for k, v in data.items() if pat not in k}
    if include:
        data = {k: v for k, v in data.items() if any(p in k for p in include)}
    for k, v in data.items():
        if not np.isfinite(v).all():
            raise QuantizeError(f"imatrix contains non-finite values for {k}")
    return data, im, path


def plan_types(
    files: GGUFModelFiles, ftype: FType, opts: Options, keep_split: bool = False
) -> tuple[list[TensorInfo], list[GGMLType], TypePlanner]:
    """Every tensor in llama-quantize's order with the type it gets."""
    infos = list(files.tensors)
    if keep_split:
        idx = {id(t): i for i, r in enumerate(files.readers) for t in r.tensors}
        infos.sort(key=lambda t: (idx[id(t)], t.offset))
    else:
        infos.sort(key=lambda t: sort_key(t.name))
    planner = TypePlanner(_model_info(files), opts, [t.name for t in infos])
    types = [planner.target_type(desc(t)) for t in infos]
    return infos, types, planner


def desc(t: TensorInfo) -> TensorDesc:
    return TensorDesc(t.name, tuple(t.ne), t.ggml_type)


def _fmt_shape(ne: Sequence[int]) -> str:
    ne = list(ne) + [1] * (4 - len(ne))
    return ", ".join(f"{d:5d}" for d in ne)


def _mib(n: int) -> float:
    return n / 1024 / 1024


def quantize_file(
    in_path: str | os.PathLike,
    out_path: str | os.PathLike | None,
    ftype: str | int | FType,
    *,
    nthreads: int | None = None,
    imatrix: str | os.PathLike | Imatrix | Mapping[str, np.ndarray] | None = None,
    include_weights: Sequence[str] = (),
    exclude_weights: Sequence[str] = (),
    output_tensor_type: str | GGMLType | None = None,
    token_embedding_type: str | GGMLType | None = None,
    tensor_types: Sequence[tuple[str, str | GGMLType]] = (),
    pure: bool = False,
    leave_output_tensor: bool = False,
    allow_requantize: bool = False,
    keep_split: bool = False,
    override_kv: Sequence[str | tuple[str, GGUFValueType, Any]] = (),
    dry_run: bool = False,
    force: bool = False,
    progress: Progress | None = None,
) -> QuantizeResult:
    """Quantize the GGUF model ``in_path`` to ``out_path`` as llama-quantize does with mix ``ftype``
    (``"Q4_K_M"``, ``"IQ2_XS"``, ``"COPY"``, a LLAMA_FTYPE number...).

    ``imatrix``: a path (GGUF or legacy ``.dat``), an :class:`Imatrix`, or ``{tensor name: weights}``
    already normalized. ``tensor_types``: ``(regex, type)`` pairs (``--tensor-type``). ``progress``
    receives one line per tensor (``None``: quiet). Raises :class:`QuantizeError` on bad input; nothing
    is left at ``out_path`` then. ``out_path`` may be None only for a dry run.
    """
    t0 = time.perf_counter()
    ft = parse_ftype(ftype)
    say = progress or (lambda s: None)
    if out_path is None and not dry_run:
        raise QuantizeError("no output path")
    in_path = os.fspath(in_path)
    out_path = None if out_path is None else os.fspath(out_path)
    overrides = [parse_override_kv(o) if isinstance(o, str) else o for o in override_kv]
    tt = [(p.lower(), parse_ggml_type(ty)) for p, ty in tensor_types]
    for p, _ in tt:
        try:
            re.compile(p)
        except re.error as e:
            raise QuantizeError(
                f"--tensor-type pattern {p!r} is not a valid regular expression: {e}"
            ) from None
    otype = None if output_tensor_type is None else parse_ggml_type(output_tensor_type)
    etype = None if token_embedding_type is None else parse_ggml_type(token_embedding_type)
    for t in (otype, etype, *(ty for _, ty in tt)):
        if t is not None and TRAITS[t].quantized and not _can_quantize(t):
            raise QuantizeError(f"llamapy cannot quantize to {t.name}")
    weights, im, im_path = _imatrix_weights(imatrix, include_weights, exclude_weights)
    try:
        files = open_model(in_path)
    except GGUFError as e:
        raise QuantizeError(str(e)) from None
    except OSError as e:
        raise QuantizeError(f"{in_path}: cannot read: {e.strerror or e}") from None
    with files:
        if not dry_run and out_path is not None:
            _check_output(in_path, out_path, force or keep_split)
        file_ftype = ft
        if ft.name == "COPY":
            src = files.get("general.file_type")
            file_ftype = FType("COPY", int(src) if isinstance(src, int) else 0, GGMLType.F32, "")
        opts = Options(
            ftype=ft,
            pure=pure,
            quantize_output_tensor=not leave_output_tensor,
            output_tensor_type=otype,
            token_embedding_type=etype,
            tensor_types=tt,
            only_copy=ft.name == "COPY",
            has_imatrix=bool(weights),
        )
        infos, types, planner = plan_types(files, ft, opts, keep_split)
        for msg in planner.fallbacks:
            say(f"warning: {msg}")
        plans: list[TensorPlan] = []
        will_require = False
        for ti, dst in zip(infos, types, strict=True):
            req = allows_quantization(opts, planner.model.arch, desc(ti)) and requires_imatrix(
                ti.name, dst, ft
            )
            if req and not weights:
                if not dry_run:
                    raise QuantizeError(
                        f"this quantization requires an importance matrix (--imatrix): "
                        f"tensor {ti.name} would be {dst.name}"
                    )
                will_require = True
            if dst != ti.ggml_type and TRAITS[dst].quantized and not _can_quantize(dst):
                raise QuantizeError(f"{ti.name}: llamapy cannot quantize to {dst.name}")
            nrows = ti.n_elements // ti.ne[0]
            plans.append(
                TensorPlan(
                    ti.name, tuple(ti.ne), ti.ggml_type, dst, ti.nbytes, nrows * _row_size(dst, ti.ne[0])
                )
            )
        res = QuantizeResult(
            file_ftype, plans, n_fallback=planner.n_fallback, will_require_imatrix=will_require
        )
        if dry_run:
            for i, p in enumerate(plans):
                say(_line(i, len(plans), p) + _size_note(p))
            res.seconds = time.perf_counter() - t0
            return res
        assert out_path is not None
        kv = _output_kv(files, file_ftype, overrides, weights, im, im_path)
        _write(
            files,
            infos,
            plans,
            kv,
            out_path,
            keep_split,
            force,
            weights,
            allow_requantize,
            nthreads,
            say,
            res,
        )
    res.seconds = time.perf_counter() - t0
    return res


def _can_quantize(t: GGMLType) -> bool:
    from ..ggml.quants import QUANTS

    q = QUANTS.get(t)
    return q is not None and q.can_quantize


def _check_output(in_path: str, out_path: str, force: bool) -> None:
    if os.path.exists(out_path):
        try:
            same = os.path.samefile(in_path, out_path)
        except OSError:
            same = False
        if same:
            raise QuantizeError(f"input and output files are the same: {out_path!r}")
        if not force:
            raise QuantizeError(f"{out_path} exists (use --force to overwrite it)")
        if os.path.isdir(out_path):
            raise QuantizeError(f"{out_path} is a directory")
    parent = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(parent):
        raise QuantizeError(f"cannot write {out_path}: no directory {parent}")


def _line(i: int, n: int, p: TensorPlan) -> str:
    return f"[{i + 1:4d}/{n:4d}] {p.name:<36s} - [{_fmt_shape(p.ne)}], type = {p.src_type.name.lower():>6s}, "


def _size_note(p: TensorPlan) -> str:
    if p.src_type == p.dst_type:
        return f"size = {_mib(p.src_size):8.3f} MiB"
    return f"size = {_mib(p.src_size):8.2f} MiB -> {_mib(p.dst_size):8.2f} MiB ({p.dst_type.name.lower()})"


def _output_kv(
    files: GGUFModelFiles,
    ftype: FType,
    overrides: list[tuple[str, GGUFValueType, Any]],
    weights: Mapping[str, np.ndarray],
    im: Imatrix | None,
    im_path: str,
) -> list[tuple[str, GGUFValueType, Any, bool]]:
    """The output metadata in llama.cpp's order: the input's keys (exact copies), then each key that is
    set moved to the end (gguf_set_val removes and appends). Items: (key, type, value or raw bytes, raw)."""
    first: GGUFReader = files.readers[0]
    kv: list[tuple[str, GGUFValueType, Any, bool]] = [
        (k, f.type, first.raw_value(k), True) for k, f in first.fields.items()
    ]

    def set_(key: str, ty: GGUFValueType, value: Any) -> None:
        kv[:] = [x for x in kv if x[0] != key]
        kv.append((key, ty, value, False))

    set_("general.quantization_version", GGUFValueType.UINT32, GGML_QNT_VERSION)
    set_("general.file_type", GGUFValueType.UINT32, ftype.ftype)
    kv[:] = [x for x in kv if x[0] not in SPLIT_KEYS]
    extra = list(overrides)
    if weights:
        extra.append(("quantize.imatrix.file", GGUFValueType.STRING, im_path[:127]))
        if im is not None and im.datasets:
            extra.append(("quantize.imatrix.dataset", GGUFValueType.STRING, im.datasets[0][:127]))
        extra.append(("quantize.imatrix.entries_count", GGUFValueType.UINT32, len(weights)))
        if im is not None and im.chunk_count > 0:
            extra.append(("quantize.imatrix.chunks_count", GGUFValueType.UINT32, im.chunk_count))
    for key, ty, value in extra:
        set_(key, ty, value)
    return kv


def _write(
    files: GGUFModelFiles,
    infos: list[TensorInfo],
    plans: list[TensorPlan],
    kv: list[tuple[str, GGUFValueType, Any, bool]],
    out_path: str,
    keep_split: bool,
    force: bool,
    weights: Mapping[str, np.ndarray],
    allow_requantize: bool,
    nthreads: int | None,
    say: Progress,
    res: QuantizeResult,
) -> None:
    # which output file each tensor goes to
    if keep_split:  # llama.cpp names the shards PREFIX-0000i-of-0000n.gguf (even a single one)
        idx = {id(t): i for i, r in enumerate(files.readers) for t in r.tensors}
        part = [idx[id(t)] for t in infos]
        n_split = len(files.readers)
        prefix = out_path[:-5] if out_path.endswith(".gguf") else out_path
        paths = [split_path(prefix, i, n_split) for i in range(n_split)]
    else:
        part = [0] * len(infos)
        n_split = 1
        paths = [out_path]
    if keep_split and not force:
        for p in paths:
            if os.path.exists(p):
                raise QuantizeError(f"{p} exists (use --force to overwrite it)")
    tmps = [f"{p}.tmp.{os.getpid()}" for p in paths]
    writers: list[GGUFWriter] = []
    nthreads = nthreads if nthreads and nthreads > 0 else (os.cpu_count() or 1)
    pool = ThreadPoolExecutor(max_workers=nthreads) if nthreads > 1 else None
    out_buf: list[np.ndarray] = []
    from .._numba import numba, set_num_threads

    numba_threads = numba.get_num_threads()
    set_num_threads(nthreads)
    try:
        for i, tmp in enumerate(tmps):
            w = GGUFWriter(tmp)
            if i == 0:
                for key, ty, value, raw in kv:
                    if raw:
                        w.add_key_value_raw(key, ty, value)
                    else:
                        w.add_key_value(key, value, ty)
            if n_split > 1:
                w.add_key_value("split.no", i, GGUFValueType.UINT16)
                w.add_key_value("split.count", n_split, GGUFValueType.UINT16)
                w.add_key_value("split.tensors.count", len(infos), GGUFValueType.INT32)
            writers.append(w)
        for p, k in zip(plans, part, strict=True):
            writers[k].add_tensor_info(p.name, tuple(reversed(p.ne)), p.dst_type, p.dst_size)
        for w in writers:
            w.write_header()
        for i, (ti, p, k) in enumerate(zip(infos, plans, part, strict=True)):
            head = _line(i, len(plans), p)
            if p.src_type == p.dst_type:
                writers[k].write_tensor_data(ti.data, p.name)
                say(head + _size_note(p))
                continue
            if TRAITS[p.src_type].quantized and not allow_requantize:
                raise QuantizeError(
                    f"{p.name}: requantizing from type {p.src_type.name} is disabled (--allow-requantize)"
                )
            im = _tensor_imatrix(p, weights)
            p.uses_imatrix = im is not None
            if im is None and requires_imatrix(p.name, p.dst_type, res.ftype):
                raise QuantizeError(
                    f"missing importance matrix for tensor {p.name} in a very low-bit quantization"
                )
            t1 = time.perf_counter()
            data = _quantize_tensor(ti, p, im, pool, nthreads, out_buf)
            writers[k].write_tensor_data(data, p.name)
            say(head + f"converting to {p.dst_type.name.lower()} .. " + _size_note(p).split(" (")[0]
                + f" ({time.perf_counter() - t1:.2f} s)")  # fmt: skip
        for w in writers:
            w.close()
        for tmp, path in zip(tmps, paths, strict=True):
            os.replace(tmp, path)
        res.outputs = paths
    except BaseException as e:
        for w in writers:
            w.abort()
        for tmp in tmps:
            if os.path.exists(tmp):
                os.unlink(tmp)
        if isinstance(e, QuantError):
            raise QuantizeError(str(e)) from None
        if isinstance(e, (GGUFError, OSError)) and not isinstance(e, QuantizeError):
            raise QuantizeError(f"writing {out_path}: {e}") from None
        raise
    finally:
        numba.set_num_threads(numba_threads)
        if pool is not None:
            pool.shutdown()


def _tensor_imatrix(p: TensorPlan, weights: Mapping[str, np.ndarray]) -> np.ndarray | None:
    w = weights.get(p.name)
    if w is None:
        return None
    n_mat = p.ne[2] if len(p.ne) > 2 else 1
    if w.size != p.ne[0] * n_mat:
        if p.name in _TOKEN_EMBD_NAMES:
            return None
        raise QuantizeError(
            f"imatrix size {w.size} is different from tensor size {p.ne[0] * n_mat} for {p.name}"
        )
    return w.reshape(n_mat, p.ne[0])


_SCRATCH = threading.local()


def _f32_scratch(n: int) -> np.ndarray:
    """This thread's float32 buffer of ``n`` values (reused: F16 input converted chunk by chunk)."""
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.size < n:
        buf = _SCRATCH.buf = np.empty(n, np.float32)
    return buf[:n]


def _out_buffer(holder: list[np.ndarray], nbytes: int) -> np.ndarray:
    """``nbytes`` of the buffer kept in ``holder`` (grown when too small): every tensor's output reuses the
    same memory (written before the next tensor starts), so its pages are faulted in once, not per tensor."""
    if not holder or holder[0].size < nbytes:
        holder[:] = [np.empty(nbytes, np.uint8)]
    return holder[0][:nbytes]


def _quantize_tensor(
    ti: TensorInfo,
    p: TensorPlan,
    im: np.ndarray | None,
    pool: ThreadPoolExecutor | None,
    workers: int = 1,
    holder: list[np.ndarray] | None = None,
) -> np.ndarray:
    n = ti.ne[0]
    nrows = ti.n_elements // n
    rows_per_mat = ti.ne[1] if len(ti.ne) > 1 else 1
    src_row = _row_size(ti.ggml_type, n)
    dst_row = _row_size(p.dst_type, n)
    src = ti.data.reshape(nrows, src_row)
    out = _out_buffer([] if holder is None else holder, nrows * dst_row).reshape(nrows, dst_row)
    # chunks of at most _CHUNK_ELEMS, and at least two per worker when that leaves them _MIN_CHUNK_ELEMS:
    # a small tensor keeps every worker busy too
    step = max(1, _CHUNK_ELEMS // n)
    step = max(min(step, -(-rows_per_mat // (2 * workers))), -(-_MIN_CHUNK_ELEMS // n))
    jobs = []
    for r0 in range(0, nrows, rows_per_mat):  # one matrix (expert) at a time: its own imatrix row
        mat = r0 // rows_per_mat
        w = None if im is None else im[mat]
        for a in range(r0, r0 + rows_per_mat, step):
            jobs.append((a, min(a + step, r0 + rows_per_mat), w))

    def run(job: tuple[int, int, np.ndarray | None]) -> None:
        a, b, w = job
        x = src[a:b]
        if ti.ggml_type == GGMLType.F32:
            xf = x.view(np.float32)
        elif ti.ggml_type == GGMLType.F16:
            xf = _f32_scratch((b - a) * n)
            # the CPU's half->float for a quantized destination (NaN is an error there), else the table
            kern = f16_kernel_cvt if TRAITS[p.dst_type].quantized else f16_kernel
            kern(np.ascontiguousarray(x).reshape(-1).view("<u2"), F16_TABLE, xf)
        else:
            xf = dequantize(x, ti.ggml_type)
        out[a:b] = quantize(xf.reshape(b - a, n), p.dst_type, w)

    if pool is None or len(jobs) == 1:
        for j in jobs:
            run(j)
    else:
        for _ in pool.map(run, jobs):
            pass
    return out


def progress_to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
