"""``llamapy gguf``: inspect, dump, split and merge GGUF files.

- ``info FILE``: architecture, name, size, metadata (big arrays abbreviated), tensor table, totals per type
- ``dump --json FILE``: everything as JSON
- ``split --split-max-tensors N | --split-max-size 500M IN OUT_PREFIX``: llama.cpp gguf-split naming and keys
- ``merge FIRST_SPLIT OUT``
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

import numpy as np


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gguf", help="inspect, dump, split and merge GGUF files")
    gs = p.add_subparsers(dest="gguf_command", metavar="ACTION")
    p.set_defaults(func=lambda a: (p.print_help(sys.stderr), 2)[1])

    q = gs.add_parser("info", help="summary: metadata, tensors, totals per type")
    q.add_argument("file", help="GGUF file (the first file of a split model opens the whole model)")
    q.add_argument("--no-tensors", action="store_true", help="leave out the tensor table")
    q.set_defaults(func=run_info)

    q = gs.add_parser("dump", help="all metadata and tensor infos as JSON")
    q.add_argument("file")
    q.add_argument("--json", action="store_true", help="JSON output (the only format; accepted for clarity)")
    q.add_argument(
        "--max-array", type=int, default=None, metavar="N", help="keep only the first N array elements"
    )
    q.set_defaults(func=run_dump)

    q = gs.add_parser(
        "split", help="split a model into PREFIX-0000i-of-0000n.gguf files (llama.cpp gguf-split)"
    )
    mode = q.add_mutually_exclusive_group(required=True)
    mode.add_argument("--split-max-tensors", type=int, metavar="N", help="at most N tensors per file")
    mode.add_argument(
        "--split-max-size", metavar="SIZE", help="at most SIZE of tensor data per file (e.g. 500M, 2G)"
    )
    q.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    q.add_argument("input")
    q.add_argument("out_prefix")
    q.set_defaults(func=run_split)

    q = gs.add_parser("merge", help="merge split files into one GGUF file")
    q.add_argument("first_split", help="PREFIX-00001-of-0000n.gguf")
    q.add_argument("output")
    q.set_defaults(func=run_merge)


# -- formatting ----------------------------------------------------------------------------------------


def _human(n: float) -> str:
    for unit in ("", "K", "M", "G", "T"):
        if abs(n) < 1000 or unit == "T":
            return f"{n:.2f} {unit}B" if unit else f"{int(n)} B"
        n /= 1000
    return f"{n} B"


def _count(n: int) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)


def _short(v: Any, limit: int = 60) -> str:
    if isinstance(v, str):
        r = json.dumps(v, ensure_ascii=False)
        return r if len(r) <= limit else r[: limit - 4] + '..."'
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _value_text(f: Any) -> tuple[str, str]:
    """(type label, short value) for one field."""
    from ..gguf import GGUFValueType as VT

    if f.type == VT.FLOAT32:
        return "float32", str(np.float32(f.value))  # shortest text that round-trips in float32
    if f.type != VT.ARRAY:
        return f.type.name.lower(), _short(f.value)
    n = len(f.value)
    sub = f.sub_type.name.lower() if f.sub_type is not None else "?"
    head = list(f.value[:5])
    items = ", ".join(_short(x.item() if isinstance(x, np.generic) else x, 24) for x in head)
    return f"arr[{sub},{n}]", f"[{items}{', ...' if n > 5 else ''}]"


def _model_file(name: str) -> str:
    """A GGUF path, or a Hugging Face ``user/repo[:quant]`` / known model name (fetched once)."""
    import os

    from .. import hub

    if os.path.exists(name) or (hub.canonical_name(name) is None and not hub.looks_like_ref(name)):
        return name
    return str(hub.resolve_model(name))


def run_info(args: argparse.Namespace) -> int:
    from ..gguf import open_model

    with open_model(_model_file(args.file)) as m:
        n_params = sum(t.n_elements for t in m.tensors)
        data_bytes = sum(t.nbytes for t in m.tensors)
        out = [
            f"file:         {m.path}" + (f" (+{m.n_split - 1} more splits)" if m.n_split > 1 else ""),
            f"architecture: {m.get('general.architecture', '?')}",
            f"name:         {m.get('general.name', '?')}",
            f"format:       GGUF v{m.version}, alignment {m.alignment}",
            f"size:         {_human(m.file_size)} ({m.file_size} bytes), tensor data {_human(data_bytes)}",
            f"tensors:      {len(m.tensors)}, parameters {_count(n_params)} ({n_params}), "
            f"{8 * data_bytes / max(n_params, 1):.2f} bits per weight",
            "",
            f"metadata ({len(m.fields)} keys):",
        ]
        w = max((len(k) for k in m.fields), default=0)
        for k, f in m.fields.items():
            t, v = _value_text(f)
            out.append(f"  {k:<{w}}  {t:<18} = {v}")
        if not args.no_tensors:
            nw = max([4, *(len(t.name) for t in m.tensors)])
            out += [
                "",
                f"tensors ({len(m.tensors)}):",
                f"  {'#':>4}  {'name':<{nw}}  {'type':<7} {'shape':<22} {'bytes':>12}",
            ]
            for i, t in enumerate(m.tensors):
                shape = "[" + ", ".join(str(d) for d in t.shape) + "]"
                out.append(f"  {i:>4}  {t.name:<{nw}}  {t.ggml_type.name:<7} {shape:<22} {t.nbytes:>12}")
        totals: dict[str, list[int]] = {}
        for t in m.tensors:
            e = totals.setdefault(t.ggml_type.name, [0, 0, 0])
            e[0] += 1
            e[1] += t.n_elements
            e[2] += t.nbytes
        out += [
            "",
            "totals per type:",
            f"  {'type':<7} {'tensors':>7} {'parameters':>14} {'bytes':>12}  bits/weight",
        ]
        for name, (n, p, b) in sorted(totals.items(), key=lambda kv: -kv[1][2]):
            out.append(f"  {name:<7} {n:>7} {p:>14} {b:>12}  {8 * b / p:.2f}")
        out.append(f"  {'total':<7} {len(m.tensors):>7} {n_params:>14} {data_bytes:>12}")
    _print("\n".join(out))
    return 0


def _jsonable(v: Any, max_array: int | None) -> Any:
    from ..gguf.strings import StringArray

    if isinstance(v, np.ndarray):
        v = v[:max_array] if max_array is not None else v
        if v.dtype.kind == "f":
            return [_jsonable(float(x), None) for x in v]
        return v.tolist()
    if isinstance(v, (list, StringArray)):
        v = v[:max_array] if max_array is not None else list(v)
        return [_jsonable(x, max_array) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # "nan", "inf", "-inf": JSON has no literal for them
    if isinstance(v, np.generic):
        return v.item()
    return v


def run_dump(args: argparse.Namespace) -> int:
    from ..gguf import open_model

    with open_model(_model_file(args.file)) as m:
        doc = {
            "files": m.paths,
            "version": m.version,
            "alignment": m.alignment,
            "file_size": m.file_size,
            "metadata": {
                k: {
                    "type": f.type.name,
                    **({"sub_type": f.sub_type.name} if f.sub_type is not None else {}),
                    **({"length": len(f.value)} if f.sub_type is not None else {}),
                    "value": _jsonable(f.value, args.max_array),
                }
                for k, f in m.fields.items()
            },
            "tensors": [
                {
                    "name": t.name,
                    "type": t.ggml_type.name,
                    "shape": list(t.shape),
                    "ne": list(t.ne),
                    "offset": t.offset,
                    "nbytes": t.nbytes,
                    "file": m.paths.index(next(r.path for r in m.readers if t.name in r.tensor_index)),
                }
                for t in m.tensors
            ],
        }
    _print(json.dumps(doc, ensure_ascii=False, indent=1))
    return 0


def run_split(args: argparse.Namespace) -> int:
    from ..gguf.split import parse_size, split_model

    max_size = parse_size(args.split_max_size) if args.split_max_size is not None else None
    plan = split_model(args.input, args.out_prefix, args.split_max_tensors, max_size, dry_run=args.dry_run)
    print(f"n_split: {len(plan)}")
    for i, (path, tensors) in enumerate(plan):
        size = sum(t.nbytes for t in tensors)
        print(f"split {i + 1:05d}: n_tensors = {len(tensors)}, tensor data = {_human(size)} -> {path}")
    if args.dry_run:
        print("dry run: nothing written")
    return 0


def run_merge(args: argparse.Namespace) -> int:
    from ..gguf.split import merge_model

    paths = merge_model(args.first_split, args.output)
    print(f"merged {len(paths)} splits into {args.output}")
    return 0


def _print(text: str) -> None:
    """Print, keeping undecodable bytes from the file visible instead of failing on them."""
    data = (text + "\n").encode("utf-8", errors="backslashreplace")
    try:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    except BrokenPipeError:  # `llamapy gguf dump ... | head`: stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
