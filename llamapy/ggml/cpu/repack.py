"""Weights repacked eight rows at a time for the 8-lane mat-vec kernels (``q4k_x8``, ``q5k_x8``,
``q40_x8``; experts: ``moe_x8``): what every layout shares.

- ``mapped_source`` / ``release_pages`` / ``anonymous``: the mapped file a weight is a view of, dropping
  its pages once repacked, and fresh memory in transparent huge pages for the copy;
- ``copy_rows``: a weight's repacked copy in fresh memory, made by its layout's copy kernel in chunks of
  rows, each chunk's mapped source pages dropped once copied;
- ``repacked``: the one cached repack per weight tensor (only model weights, rows a multiple of 8, bytes a
  view of a mapped file unless ``any_memory``), its source pages released after;
- ``x8_step``: the ``mul_mat`` step on a repacked weight: the layout's 8-row kernel, or (``kern`` None:
  more activation rows than it takes) tiles unpacked back to plain bytes, dequantized, sgemm;
- ``mul_mat_step``: the step for any repacked type (``LAYOUTS``: type -> its module), None where the
  weight is not repacked.
"""

from __future__ import annotations

import importlib
import mmap
import threading
import weakref
from collections.abc import Callable, Collection, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..tensor import Tensor
from ..types import GGMLType
from .prefetch_tune import Choice, distance_of, streams_of

__all__ = [
    "CHUNK_BYTES", "LAYOUTS", "anonymous", "copy_rows", "mapped_source", "mul_mat_step", "release_pages", "repacked",
    "X8Weight", "layout_of", "together", "x8_step",
]  # fmt: skip

#: the repacked 2-D types and the module of each layout (its ``mul_mat_step``)
LAYOUTS = {GGMLType.Q4_K: "q4k_x8", GGMLType.Q5_K: "q5k_x8", GGMLType.Q4_0: "q40_x8"}
LAYOUTS[GGMLType.Q8_0] = "q80_x8"
LAYOUTS[GGMLType.Q6_K] = "q6k_x8"
LAYOUTS[GGMLType.Q5_0] = "q50_x8"
LAYOUTS[GGMLType.Q4_1] = "q40_x8"

_lock = threading.Lock()

#: a layout's cache: weight tensor -> (address of its bytes, repacked copy)
Cache = weakref.WeakKeyDictionary[Tensor, tuple[int, np.ndarray]]


def mapped_source(A: np.ndarray) -> mmap.mmap | None:
    """The ``mmap`` object ``A`` is a view of (None: ``A``'s memory is not a mapped file)."""
    b: Any = A
    while b is not None:
        if isinstance(b, mmap.mmap):
            try:
                b.size()  # a file's size; an anonymous map (no file) raises
            except OSError:
                return None
            return b
        b = b.obj if isinstance(b, memoryview) else getattr(b, "base", None)
    return None


def release_pages(A: np.ndarray, mm: mmap.mmap) -> None:
    """Drop the whole pages of ``A``'s bytes from this process's resident set (the file keeps them)."""
    try:
        start = np.frombuffer(mm, dtype=np.uint8, count=1).ctypes.data
    except (ValueError, TypeError):
        return
    lo = A.ctypes.data - start
    hi = lo + A.nbytes
    page = mmap.PAGESIZE
    lo = -(-lo // page) * page
    hi = hi // page * page
    if hi > lo and hasattr(mm, "madvise"):
        try:
            mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
        except (OSError, ValueError):
            pass


#: repacked copies of at most this many bytes share 2 MiB-aligned arena chunks of ``ARENA_CHUNK`` bytes
ARENA_MAX = 2 << 20
ARENA_CHUNK = 32 << 20
_HUGE = 2 << 20
_arena_lock = threading.Lock()
_arena: list[Any] = [None, 0, 0]  # (weak reference to the current chunk's mapping, its start, next offset)


def _arena_take(nbytes: int) -> np.ndarray | None:
    """``nbytes`` (64-byte aligned) of the current arena chunk, a fresh chunk when it is full or gone;
    None where no private mapping can be made.

    A weight below 2 MiB in its own mapping gets 4 KiB pages only (a transparent huge page needs an
    aligned 2 MiB of one mapping), and a small model is all such weights: SmolLM2's 192 x 576 Q4_1
    projections, 67 KB each, took 7.8 us a call from 4 KiB pages against 5.8 from one huge-page
    arena, 200 of them swept in order after the caches were flushed (one thread; 6.4 against 5.5 with
    two): a TLB miss and a page walk every 4 KiB, and the hardware prefetchers stop at each 4 KiB page.
    Each copy is a view of its chunk's mapping, which lives as long as any of them (the module keeps
    only a weak reference)."""
    with _arena_lock:
        ref, start, off = _arena
        m = ref() if ref is not None else None
        off = (off + 63) & ~63
        if m is None or off + nbytes > ARENA_CHUNK:
            m = _huge_mapping(ARENA_CHUNK + _HUGE)
            if m is None:
                return None
            start, off = _huge_start(m), 0
        _arena[:] = [weakref.ref(m), start, off + nbytes]
        return np.frombuffer(m, np.uint8, count=nbytes, offset=start + off)


def _huge_mapping(nbytes: int) -> mmap.mmap | None:
    """A fresh private anonymous mapping of ``nbytes``, advised for transparent huge pages (None where
    the platform has no private mapping)."""
    private = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    if not private:
        return None
    try:
        m = mmap.mmap(-1, max(nbytes, 1), flags=private)
    except OSError:
        return None
    if hasattr(m, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            m.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    return m


def _huge_start(m: mmap.mmap) -> int:
    """The offset of the first 2 MiB boundary in the mapping ``m``."""
    return (-np.frombuffer(m, np.uint8, count=1).ctypes.data) % _HUGE


def anonymous(nbytes: int) -> np.ndarray:
    """``nbytes`` of fresh memory, in transparent huge pages where the kernel gives them (up to
    ``ARENA_MAX`` bytes from a shared chunk: ``_arena_take``): on this KVM
    machine a first write to a 4 KiB page costs ~6 us of system time, so 4 KiB pages made repacking
    a 1.5B model's 625 MB of Q4_K cost ~1 s of CPU instead of ~0.3 s. A private mapping: ``mmap(-1, n)``
    alone is MAP_SHARED, shared memory (shmem), which gets no huge pages where ``shmem_enabled`` is
    ``never`` (the default): 256 MiB then took 199 ms to fault in and 42 ms to free, 35 and 1 ms private."""
    if 0 < nbytes <= ARENA_MAX:
        a = _arena_take(nbytes)
        if a is not None:
            return a
    m = _huge_mapping(nbytes + _HUGE)  # starting on a 2 MiB boundary: all of it in huge pages, not the middle
    if m is not None:
        return np.frombuffer(m, np.uint8, count=nbytes, offset=_huge_start(m))
    try:
        m = mmap.mmap(-1, max(nbytes, 1))
    except OSError:
        return np.empty(nbytes, np.uint8)
    return np.frombuffer(m, np.uint8, count=nbytes)


class _Block:
    """The one allocation that the repacked copies of a group of weights share (``together``): the row
    groups of each member in order; the block is made when the first member's bytes per row group are
    known (the members have one type and one width, so one size of row group)."""

    def __init__(self, groups: list[int]) -> None:
        self.groups = groups
        self.block: np.ndarray | None = None
        self.gb = 0
        self.taken = 0  # members placed


_group = threading.local()


def _fresh(G: int, gb: int) -> np.ndarray:
    """Fresh memory for ``G`` repacked row groups of ``gb`` bytes: the next member's rows of the block of
    ``together`` when one is open and this is that member's size, else ``anonymous``."""
    blk: _Block | None = getattr(_group, "block", None)
    if blk is not None and blk.taken < len(blk.groups) and blk.groups[blk.taken] == G:
        if blk.block is None:
            blk.gb = gb
            blk.block = anonymous(sum(blk.groups) * gb).reshape(sum(blk.groups), gb)
        if gb == blk.gb:
            lo = sum(blk.groups[: blk.taken])
            blk.taken += 1
            return blk.block[lo : lo + G]
    return anonymous(G * gb).reshape(G, gb)


def together(
    members: Sequence[tuple[Tensor, np.ndarray]],
    cache: Cache,
    repacked_of: Callable[[Tensor, np.ndarray], np.ndarray | None],
) -> np.ndarray | None:
    """The repacked copies of the weights ``members`` ((tensor, bytes) pairs: one type, one width, rows a
    multiple of 8) as one array, each member's rows after the previous one's (``[sum of row groups, bytes
    a group]``), so that one kernel call can read them all (``matvec_groups``). Each member's own copy,
    which every other step reads through its layout's ``cache`` (``repacked_of``: the layout's
    ``repacked``), is a view of it: no byte is stored twice. Made on the first call, when none of them is
    repacked yet; found again on later calls. None where they are not one block: one of them is not
    repacked (``repacked_of`` says None), or some were repacked alone before."""
    with _lock:
        hits = [cache.get(a) for a, _ in members]
    groups = [A.shape[0] // 8 for _, A in members]
    blk = _Block(groups)
    if all(h is None for h in hits):
        _group.block = blk
        try:
            Rs = [repacked_of(a, A) for a, A in members]
        finally:
            _group.block = None
    elif all(h is not None and h[0] == A.ctypes.data for h, (_, A) in zip(hits, members, strict=True)):
        Rs = [h[1] for h in hits]  # type: ignore[index]
    else:
        return None
    if any(R is None for R in Rs):
        return None
    first = Rs[0]
    base, gb, lo = first.ctypes.data, first.shape[-1], 0
    for R, G in zip(Rs, groups, strict=True):
        if R.ndim != 2 or R.shape != (G, gb) or R.ctypes.data != base + lo * gb or not R.flags.c_contiguous:
            return None
        lo += G
    with _lock:
        if blk.block is not None and blk.block.ctypes.data == base and blk.block.shape == (lo, gb):
            _blocks[members[0][0]] = blk.block
        made = _blocks.get(members[0][0])  # made now, or by an earlier graph (the members' views of it)
    if made is not None and made.ctypes.data == base and made.shape[1] == gb and made.shape[0] >= lo:
        return made[:lo]  # (another graph may group the first few members only)
    return None


#: ``together``'s blocks, by their first member (the members' cached copies are views of them)
_blocks: weakref.WeakKeyDictionary[Tensor, np.ndarray] = weakref.WeakKeyDictionary()


#: source bytes repacked per chunk (``copy_rows``)
CHUNK_BYTES = 8 << 20


def copy_rows(A: np.ndarray, group_bytes: int, copy: Callable[[np.ndarray, np.ndarray], None]) -> np.ndarray:
    """The repacked copy ``R`` (``anonymous`` uint8[N // 8, group_bytes]) of the rows ``A`` (2-D, N a multiple
    of 8), made by ``copy(A[r0:r1], R[r0 // 8 : r1 // 8])`` over chunks of about ``CHUNK_BYTES``, the whole
    pages of each chunk dropped once copied where ``A`` is a view of a mapped file: a large matrix's source
    and copy are then never resident together (the output matrix, 191 MB of Q6_K at 1.5B: peak RSS +95 MB,
    measured; SmolLM2's tied Q8_0 embedding, 29 MB: the run's peak). One call where ``A`` is small or not
    mapped."""
    N = A.shape[0]
    R = _fresh(N // 8, group_bytes)
    mm = mapped_source(A) if A.nbytes > CHUNK_BYTES else None
    if mm is None:
        copy(A, R)
        return R
    step = max(8, CHUNK_BYTES // max(A.shape[1] * A.itemsize, 1) // 8 * 8)
    for r0 in range(0, N, step):
        r1 = min(N, r0 + step)
        copy(A[r0:r1], R[r0 // 8 : r1 // 8])
        release_pages(A[r0:r1], mm)
    return R


def repacked(
    a: Tensor,
    A: np.ndarray,
    any_memory: bool,
    enabled: bool,
    types: Collection[GGMLType],
    cache: Cache,
    repack: Callable[[np.ndarray, GGMLType], np.ndarray],
) -> np.ndarray | None:
    """The cached repacked copy of the 2-D weight ``a`` (bytes ``A``), made on first use by ``repack``; None
    where it is not repacked (``enabled`` off, not one of ``types``, not a model weight, rows not a multiple
    of 8, not a view of a mapped file unless ``any_memory``)."""
    if not enabled or a.type not in types or A.ndim != 2 or A.dtype != np.uint8:
        return None
    if a.op != "weight":  # a view or a computed tensor: a new Tensor per graph, so no cache by tensor
        return None
    if A.shape[0] % 8 or A.shape[0] == 0 or not A.flags.c_contiguous:
        return None
    mm = mapped_source(A)
    if mm is None and not any_memory:
        return None
    with _lock:
        hit = cache.get(a)
        if hit is not None and hit[0] == A.ctypes.data:
            return hit[1]
        R = repack(A, a.type)
        cache[a] = (A.ctypes.data, R)
    if mm is not None:
        release_pages(A, mm)
    return R


class X8Weight(NamedTuple):
    """What a decode step of an 8-row kernel reads (its ``weight`` attribute, for
    ``benchmarks/decode_steps.py``): the weight's name, type, rows and columns, repacked bytes, kernel."""

    name: str
    type: str
    rows: int
    cols: int
    nbytes: int
    kernel: str


def x8_step(
    be: Any,
    a: Tensor,
    A: np.ndarray,
    x: np.ndarray,
    out2: np.ndarray,
    pre: Callable[[], None] | None,
    R: np.ndarray,
    kern: Any,
    unpack: Callable[[np.ndarray, int, int, np.ndarray], None],
    unpack_kernel: Any,
    scratch: str,
    chunk_rows: int = 0,
) -> Callable[[], None]:
    """The ``mul_mat`` step on the repacked ``R`` of ``a`` (plain bytes ``A``): ``kern(R, x, out2, distance)``
    (a one-row kernel, which takes a fifth argument: also the backend's threads)
    with the prefetch distance of ``a``'s type in ``be.prefetch`` (``prefetch_tune``; one activation row: its decode
    steps, which it may measure) (``chunk_rows`` > 0 and more activation rows than that: one call per chunk of rows, the chunks as
    even as possible, each at most ``chunk_rows``); or, ``kern`` None, per tile of rows ``unpack(R, r0,
    r1, q)`` into the scratch ``scratch`` (plain bytes, bit for bit), dequantize, sgemm. ``unpack_kernel``:
    the Numba kernel ``unpack`` runs. Chunks change no bits: each row's result in the x8 kernels does not
    depend on the other rows of the call."""
    from .backend import TILE_FLOATS, _threads

    if kern is not None:
        tuner = be.prefetch.for_type(a.type.name)
        be.need(kern)
        M = x.shape[0]
        if 0 < chunk_rows < M:
            n = -(-M // chunk_rows)
            bounds = [M * i // n for i in range(n + 1)]
            parts = [(x[b0:b1], out2[b0:b1]) for b0, b1 in zip(bounds[:-1], bounds[1:], strict=True)]

            def step_x8_chunks() -> None:
                if pre is not None:
                    pre()
                for xc, oc in parts:
                    kern(R, xc, oc, tuner.distance)

            return step_x8_chunks
        # the one-row kernels' fifth argument: the threads (``rowgroups.x8_rows``' parts; 0: one stream)
        code = getattr(getattr(kern, "py_func", kern), "__code__", None)
        takes_nth = code is not None and code.co_argcount > 4
        nth = (_threads(be),) if takes_nth else ()
        if M == 1:  # decode: the tuner may measure it (``prefetch_tune``)
            state = tuner.counter()
            # each candidate's last kernel arguments, made once (one stream a thread: ``nth`` 0)
            args = {
                c: (distance_of(c), *(nth if streams_of(c) == 2 else (0,) * len(nth)))
                for c in {*tuner.candidates, tuner.choice}
            }

            def call(c: Choice) -> None:
                kern(R, x, out2, *args[c])

            def step_x8_decode() -> None:
                if pre is not None:
                    pre()
                if tuner.tuning:
                    tuner.run(call, state)
                else:
                    kern(R, x, out2, *args[tuner.choice])

            info = X8Weight(a.name, a.type.name, a.shape[-2], a.shape[-1], R.nbytes, kern.__name__)
            step_x8_decode.weight = info  # type: ignore[attr-defined]
            return step_x8_decode

        def step_x8() -> None:
            if pre is not None:
                pre()
            kern(R, x, out2, tuner.distance, *nth)

        return step_x8
    be.need(unpack_kernel)
    from ..quants import dequantize_rows_into
    from .blas import gemm_nt

    t = a.type
    N, rb = A.shape
    K = a.shape[-1]
    threads = _threads(be)
    tile = max(16, min(N, TILE_FLOATS // max(K, 1)))

    def step_tiles() -> None:
        if pre is not None:
            pre()
        for r0 in range(0, N, tile):
            n = min(tile, N - r0)
            q = be.scratch(scratch, (n, rb), np.uint8)
            W = be.scratch("mm_tile", (n, K))
            unpack(R, r0, r0 + n, q)
            dequantize_rows_into(q, t, W)
            gemm_nt(x, W, out2[:, r0 : r0 + n], threads)

    return step_tiles


def mul_mat_step(
    be: Any,
    a: Tensor,
    A: np.ndarray,
    x: np.ndarray,
    out2: np.ndarray,
    pre: Callable[[], None] | None,
    R: np.ndarray | None = None,
) -> Callable[[], None] | None:
    """The ``mul_mat`` step of the weight ``a`` on its repacked layout, or None (no layout for its type, or
    not repacked). ``R`` given: the repacked rows to read instead of ``a``'s own (``matvec_groups``: a
    block of several weights of ``a``'s type and width, ``out2`` as wide as all of them)."""
    module = layout_of(a.type)
    if module is None:
        return None
    return module.mul_mat_step(be, a, A, x, out2, pre, R=R)


def layout_of(t: GGMLType) -> Any:
    """The module of type ``t``'s 8-row layout (its ``mul_mat_step``, ``_repacked``, ``_cache``,
    ``ENABLED``), or None."""
    module = LAYOUTS.get(t)
    return None if module is None else importlib.import_module(f"{__package__}.{module}")
