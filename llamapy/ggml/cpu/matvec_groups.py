"""Weights that multiply the same activations, read by one kernel call: a decoder layer's Q, K and V
projections (or K and V, or Q and K, where V's type differs) and its FFN's gate and up.

On a small model a decode token is hundreds of short mat-vec calls, and each pays a parallel launch, the
threads' ramp-up and the first lines of its weight: SmolLM2-135M's 192 x 576 K and V read at ~7 GB/s
where its 1536 x 576 FFN matrices read at ~16 (``benchmarks/decode_steps.py``). So the CPU backend finds,
in a graph, the ``mul_mat`` nodes of one type and width whose activations are the same tensor
(``find``); their repacked copies are made as one block, each member's rows after the previous one's
(``repack.together``: each member's own copy is a view of it, so prompts and every other graph read the
same bytes, none stored twice); and in a decode graph (one activation row) the first member's step runs
the layout's one-row kernel over the whole block into a buffer of its own, then copies its part of the
result out, and each later member's step copies its part (``steps``). The kernels compute each row of
the output from that row's weights and the activations alone (the split of the rows among threads
changes no bits, ``rowgroups.x8_rows``), so the outputs are the separate calls' bytes
(tests/ggml/test_matvec_groups.py).

Measured (haswell target, 2 threads, Intel Xeon VM, the weights cycling through 60 copies so that they
come from DRAM, us a layer): SmolLM2's Q4_1 576 + 192 + 192 rows x 576, three calls 35-46 against one
21-28; its gate and up, 2 x 1536 rows, 76-80 against 63-70.

A run that does not repack (a short ``llamapy run``) groups its Q4_0 and Q4_1 weights too: the grouped
kernel of ``q40_r8_kernels`` reads the members' rows where the file has them, in one parallel loop over
all their row groups, each row's bits the one-weight kernel's. SmolLM2-135M Q4_1 without repacking (the
AMD VM, haswell target, 2 threads, 16 alternating runs of 96 tokens each way, median ms a token): the same
(5.1-5.7) while the VM ran fast, 0.25-0.5 ms less (6.2-6.5 -> 5.8-6.1) while it ran slow; Q + K + V alone,
hot: 28.5 -> 16.0 us.

``ENABLED = False`` (or ``LLAMAPY_MATVEC_GROUPS=0`` in the environment) turns it off (for A/B).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ..backend import ArrayMap, Step
from ..tensor import INPLACE_OPS, Tensor
from ..types import GGMLType
from .repack import LAYOUTS, X8Weight, layout_of, mapped_source, together

__all__ = ["ENABLED", "Group", "find", "steps"]

#: group the mat-vecs of shared activations (``LLAMAPY_MATVEC_GROUPS=0``: no)
ENABLED = os.environ.get("LLAMAPY_MATVEC_GROUPS", "1") not in ("0", "false", "no", "off")


def _weight_ok(a: Tensor) -> bool:
    return a.op == "weight" and a.ndim == 2 and a.type in LAYOUTS and a.shape[0] % 8 == 0 and a.shape[0] > 0


class Group(NamedTuple):
    """A group's ``mul_mat`` nodes (graph order) and, by member id, the ``add`` of a bias vector that is
    the member's one consumer (Qwen2's Q, K and V biases): the group's steps write that sum, from the
    block's result, and neither the member's own output nor an ``add`` step is needed."""

    nodes: list[Tensor]
    bias: dict[int, Tensor]


def find(graph: Any, nodes: list[Tensor], taken: set[int]) -> list[Group]:
    """The groups (two or more ``mul_mat`` nodes, in graph order) among ``nodes`` (less ``taken``: nodes
    other fusions compute) whose weights are model weights of one 8-row layout type and one width and
    whose activations are one tensor that no in-place op writes."""
    if not ENABLED or graph is None:
        return []
    written = {id(n.owner) for n in graph.nodes if n.op in INPLACE_OPS}
    by_key: dict[tuple[int, Any, int], list[Tensor]] = {}
    for n in nodes:
        if n.op != "mul_mat" or len(n.src) != 2 or id(n) in taken:
            continue
        a, b = n.src
        if not _weight_ok(a) or id(b.owner) in written:
            continue
        by_key.setdefault((id(b), a.type, a.shape[-1]), []).append(n)
    groups = [g for g in by_key.values() if len(g) > 1]
    if not groups:
        return []
    mine = {id(n) for n in nodes} - taken
    users: dict[int, list[Tensor]] = {}
    for n in graph.nodes:
        for src in n.src:
            users.setdefault(id(src), []).append(n)
    out = []
    for g in groups:
        bias = {}
        for m in g:
            u = users.get(id(m), [])
            if len(u) == 1 and _bias_add(u[0], m) and id(u[0]) in mine and not graph.is_output(m):
                bias[id(m)] = u[0]
        out.append(Group(g, bias))
    return out


def _bias_add(add: Tensor, m: Tensor) -> bool:
    """``add`` is ``m + v``, ``v`` a float32 weight vector as wide as ``m``'s rows, the result ``m``'s shape."""
    if add.op != "add" or len(add.src) != 2 or add.src[0] is not m or add.shape != m.shape:
        return False
    v = add.src[1]
    return (
        v.op == "weight" and v.type == GGMLType.F32 and v.shape == (m.shape[-1],) and m.type == GGMLType.F32
    )


def _members(group: list[Tensor], arrays: ArrayMap) -> list[tuple[Tensor, np.ndarray]] | None:
    out = []
    for n in group:
        a = n.src[0]
        A = arrays[id(a)]
        if A.ndim != 2 or A.dtype != np.uint8 or not A.flags.c_contiguous or mapped_source(A) is None:
            return None
        out.append((a, A))
    return out


def steps(be: Any, group: Group, arrays: ArrayMap) -> tuple[dict[int, Step], set[int]] | None:
    """The steps of the ``group``'s nodes (by node id) where its weights are one repacked block and its
    activations one row, and the ids of the bias ``add`` nodes they compute (no step of their own); None:
    each node gets its own step (the block is still made, when its weights can be, so that the decode
    graph finds it). A backend that does not repack reads Q4_0 / Q4_1 weights where the file has them
    (``_in_place``)."""
    if not be.repack:
        return _in_place(be, group, arrays)
    nodes = group.nodes
    a0 = nodes[0].src[0]
    layout = layout_of(a0.type)
    members = _members(nodes, arrays)
    if layout is None or not getattr(layout, "ENABLED", True) or members is None:
        return None
    R = together(members, layout._cache, lambda a, A: layout._repacked(a, A, False))
    row = None if R is None else _one_row(be, group, arrays)
    if row is None:
        return None
    x, pre = row
    widths = [n.src[0].shape[0] for n in nodes]
    out = np.zeros((1, sum(widths)), np.float32)  # this group's own: read by the later members' steps
    run = layout.mul_mat_step(be, a0, members[0][1], x, out, pre, R=R)
    if run is None:
        return None
    result, absorbed = _steps_over(group, arrays, widths, out, run)
    info = getattr(run, "weight", None)
    if isinstance(info, X8Weight):
        names = [n.src[0].name for n in nodes]
        block = (
            names[0][: names[0].find(".", names[0].find(".") + 1) + 1] if names[0].startswith("blk.") else ""
        )
        name = "+".join(
            [names[0], *(m[len(block) :] if block and m.startswith(block) else m for m in names[1:])]
        )
        result[id(nodes[0])].weight = info._replace(name=name, rows=sum(widths), nbytes=R.nbytes)  # type: ignore[attr-defined]
    return result, absorbed


def _in_place(be: Any, group: Group, arrays: ArrayMap) -> tuple[dict[int, Step], set[int]] | None:
    """``steps`` for a backend that does not repack (a short run): Q4_0 and Q4_1 weights read where the
    file has them, all of the group's in one call of ``q40_r8_kernels``' grouped kernel (each row's bits
    those of the one-weight kernel, which ``matmul_steps`` would call); other types: None."""
    from .matmul_steps import prefetch_into_l1

    nodes = group.nodes
    a0 = nodes[0].src[0]
    if a0.type not in (GGMLType.Q4_0, GGMLType.Q4_1):
        return None
    ws = tuple(arrays[id(n.src[0])] for n in nodes)
    if any(A.ndim != 2 or A.dtype != np.uint8 or not A.flags.c_contiguous for A in ws):
        return None
    row = _one_row(be, group, arrays)
    if row is None:
        return None
    x, pre = row
    from . import q40_r8_kernels

    kern = q40_r8_kernels.GROUP_KERNELS[(a0.type.name, prefetch_into_l1(ws[0]))]
    widths = [A.shape[0] for A in ws]
    if len(ws) < 3:  # gate and up as three weights, the third of no rows: one compiled signature to load
        pad = np.empty((0, ws[0].shape[1]), np.uint8)
        pad.flags.writeable = ws[0].flags.writeable  # (a mapped file's weights are read-only)
        ws = (*ws, *[pad] * (3 - len(ws)))
    be.need(kern)
    out = np.zeros((1, sum(widths)), np.float32)

    def run() -> None:
        if pre is not None:
            pre()
        kern(ws, x, out, None)

    return _steps_over(group, arrays, widths, out, run)


def _one_row(be: Any, group: Group, arrays: ArrayMap) -> tuple[np.ndarray, Step | None] | None:
    """The group's activations as one float32 row and the step that makes it, if any
    (``backend._f32_rows``); None where they are more than one row."""
    from .backend import _f32_rows

    B = arrays[id(group.nodes[0].src[1])]
    if B.ndim < 1 or int(np.prod(B.shape[:-1], dtype=np.int64)) != 1:
        return None
    return _f32_rows(be, B, "mm_x")


def _steps_over(
    group: Group, arrays: ArrayMap, widths: list[int], out: np.ndarray, run: Callable[[], None]
) -> tuple[dict[int, Step], set[int]]:
    """The first member's step (``run``, which writes the group's result ``out``, then its own part out)
    and each later member's (its part out, or the bias add that consumes it)."""
    nodes = group.nodes
    parts: list[Callable[[], None]] = []
    absorbed: set[int] = set()
    lo = 0
    for n, w in zip(nodes, widths, strict=True):
        add = group.bias.get(id(n))
        part = out[:, lo : lo + w]
        if add is not None:  # the bias add's own operation on the same values: its bits
            absorbed.add(id(add))
            parts.append(_add_step(arrays[id(add)].reshape(1, w), part, arrays[id(add.src[1])]))
        else:
            parts.append(_copy_step(arrays[id(n)].reshape(1, w), part))
        lo += w
    first = parts[0]

    def step_group() -> None:
        run()
        first()

    result: dict[int, Step] = {id(nodes[0]): step_group}
    for n, part_step in zip(nodes[1:], parts[1:], strict=True):
        result[id(n)] = part_step
    return result, absorbed


def _copy_step(dst: np.ndarray, src: np.ndarray) -> Callable[[], None]:
    def step_group_part() -> None:
        np.copyto(dst, src)

    return step_group_part


def _add_step(dst: np.ndarray, src: np.ndarray, bias: np.ndarray) -> Callable[[], None]:
    def step_group_part() -> None:
        np.add(src, bias, out=dst)

    return step_group_part
