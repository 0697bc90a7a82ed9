"""The Jinja sandbox chat templates render in, with bounds on everything that can amplify size or time.

jinja2's ``ImmutableSandboxedEnvironment`` keeps templates away from Python internals but not from
arithmetic: ``10 ** 10 ** 8`` or ``'a' * 2 * 10 ** 9`` is a single C call that holds the GIL for minutes
or takes gigabytes, and no deadline between Python calls can interrupt it. So every operation that can
make a value much larger than its operands is checked *before* it runs:

- ``**``, ``*``, ``+``, ``%`` and ``~`` (``intercepted_binops`` and the concatenation): integers at most
  :data:`MAX_INT_BITS` bits; strings, lists and tuples at most :data:`MAX_VALUE_SIZE` (the size of a
  value is its characters plus one per item, nested; see :func:`value_size`); printf widths at most
  :data:`MAX_FORMAT_WIDTH`;
- ``str.format``/``format_map``, the ``str``/``bytes`` methods ``center ljust rjust zfill expandtabs
  replace join translate``, and the filters ``center indent wordwrap format join replace sum batch
  tojson``, and the globals ``lipsum`` and ``strftime_now``: the same bounds on their result;
- ``range`` gives at most :data:`MAX_RANGE` items.

Rendering also runs under :class:`RenderGuard`, a tracer that stops a render past its deadline or after
its memory grew by :data:`MAX_RENDER_MEMORY` (checked at every Python call and at every line of the
template's own code, so an empty ``for`` loop is interrupted too). A violated bound raises
:class:`TemplateLimitError`.
"""

from __future__ import annotations

import functools
import os
import re
import string
import sys
import time
import types
from collections.abc import Mapping
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment

MAX_OUTPUT_CHARS = 8 * 1024 * 1024
MAX_VALUE_SIZE = 2 * MAX_OUTPUT_CHARS
MAX_INT_BITS = 1 << 15
MAX_FORMAT_WIDTH = 10_000
MAX_RANGE = 100_000
MAX_RENDER_MEMORY = 512 << 20
_MEMORY_CHECK_S = 0.002


class TemplateLimitError(Exception):
    """A template went past one of the sandbox's bounds (or called ``raise_exception``)."""


_ITEM = 16  # an item of a list or dict: ", " and quotes when written out, and the cost of walking it
_TEXT = (str, bytes)
_CONTAINERS = (list, tuple, set, frozenset, dict)  # (exact ABC checks cost a microsecond an item)


def value_size(obj: Any, limit: int = MAX_VALUE_SIZE) -> int:
    """How many characters ``obj`` becomes when written out, roughly: the length of strings and bytes,
    a digit count for ints, :data:`_ITEM` per item of lists, tuples, sets and dicts plus their items'
    sizes, 1 for anything else. Shared references count each time (``[s] * 3`` is three times ``s``).
    Stops counting past ``limit``."""
    total = 0
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, _TEXT):
            total += len(o) + 1
        elif isinstance(o, int):
            total += o.bit_length() // 3 + 1
        elif isinstance(o, _CONTAINERS):
            total += _ITEM * len(o) + 1
            if total > limit:
                return total
            items = [*o.keys(), *o.values()] if isinstance(o, dict) else o
            texts = [len(x) for x in items if isinstance(x, _TEXT)]
            total += sum(texts)
            if len(texts) < len(items):
                total += sum([x.bit_length() // 3 for x in items if isinstance(x, int)])
                stack.extend([x for x in items if isinstance(x, _CONTAINERS)])
        else:
            total += 1
        if total > limit:
            return total
    return total


def _too_big(what: str, size: int) -> TemplateLimitError:
    return TemplateLimitError(
        f"{what} would make a value of about {size} characters, over the limit of {MAX_VALUE_SIZE}"
    )


def _check_size(what: str, size: int) -> None:
    if size > MAX_VALUE_SIZE:
        raise _too_big(what, size)


def _check_pow(left: Any, right: Any) -> None:
    if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
        bits = left.bit_length() * right
        if bits > MAX_INT_BITS:
            raise TemplateLimitError(
                f"'**' would make an integer of about {bits} bits (limit {MAX_INT_BITS})"
            )


def _check_mul(left: Any, right: Any) -> None:
    if isinstance(left, int) and isinstance(right, int):
        bits = left.bit_length() + right.bit_length()
        if bits > MAX_INT_BITS:
            raise TemplateLimitError(f"'*' would make an integer of about {bits} bits (limit {MAX_INT_BITS})")
        return
    seq, n = (left, right) if isinstance(right, int) else (right, left)
    if not (isinstance(n, int) and n > 1):
        return
    if isinstance(seq, (str, bytes)):
        _check_size("'*'", len(seq) * n)
    elif isinstance(seq, (list, tuple)):  # the items' sizes, without the container's own 1
        _check_size("'*'", max(1, value_size(seq, MAX_VALUE_SIZE // n + 2) - 1) * n)


def _check_add(left: Any, right: Any) -> None:
    if isinstance(left, (str, bytes)) and isinstance(right, (str, bytes)):
        _check_size("'+'", len(left) + len(right))
    elif isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
        _check_size("'+'", _ITEM * (len(left) + len(right)))
        a = value_size(left)
        _check_size("'+'", a + (a if right is left else value_size(right)))


_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d*))?[hlL]?(.?)", re.S)


def _width(digits: str | None, what: str) -> int:
    if not digits:
        return 0
    if digits == "*" or len(digits) > 6 or int(digits) > MAX_FORMAT_WIDTH:
        raise TemplateLimitError(
            f"{what}: a field width or precision of {digits!r} (limit {MAX_FORMAT_WIDTH})"
        )
    return int(digits)


def _largest(values: Any) -> int:
    return max((value_size(v) for v in values), default=0)


def check_printf(fmt: Any, args: Any) -> None:
    """Bounds of ``fmt % args``: widths and precisions, and the number of fields times the largest
    argument."""
    if not isinstance(fmt, (str, bytes)):
        return
    text = fmt.decode("latin-1") if isinstance(fmt, bytes) else fmt
    upper = text.count("%")  # at least the number of fields
    if not upper:
        return
    vals = args.values() if isinstance(args, Mapping) else args if isinstance(args, tuple) else (args,)
    largest = _largest(vals)
    _check_size("'%' formatting", len(text) + upper * largest)
    n = width = 0
    for m in _PRINTF.finditer(text):
        if m.group(3) == "%":
            continue
        n += 1
        width = max(width, _width(m.group(1), "'%' formatting"), _width(m.group(2), "'%' formatting"))
    if width:
        _check_size("'%' formatting", len(text) + n * (largest + width))


def check_format(fmt: str, values: Any) -> None:
    """Bounds of ``fmt.format(...)``: no nested fields in a format spec, widths, fields times the largest
    argument."""
    upper = fmt.count("{")  # at least the number of fields
    if not upper:
        return
    _check_size("str.format", len(fmt) + upper * _largest(values))
    n = width = 0
    try:
        parsed = list(string.Formatter().parse(fmt))
    except ValueError:
        return  # str.format raises the same error itself
    for _, field, spec, _ in parsed:
        if field is None:
            continue
        n += 1
        if spec:
            if "{" in spec:
                raise TemplateLimitError("str.format: nested fields in a format spec are not allowed")
            for digits in re.findall(r"\d+", spec):
                width = max(width, _width(digits, "str.format"))
    if n:
        _check_size("str.format", len(fmt) + n * (_largest(values) + width))


def _bounded_list(sep: Any, items: Any, what: str = "join") -> list[Any]:
    """``items`` read into a list, stopping as soon as joining them with ``sep`` would be too large."""
    out = []
    size = 0
    step = len(sep) if isinstance(sep, (str, bytes)) else 1
    for x in items:
        size += value_size(x) + step
        if size > MAX_VALUE_SIZE:
            raise _too_big(what, size)
        out.append(x)
    return out


def _replace_size(s: Any, old: Any, new: Any, count: Any = None) -> int:
    if (
        not isinstance(s, (str, bytes))
        or not isinstance(new, (str, bytes))
        or not isinstance(old, (str, bytes))
    ):
        return 0
    hits = (len(s) + 1) if not old else s.count(old)
    if isinstance(count, int) and 0 <= count < hits:
        hits = count
    return len(s) + hits * max(0, len(new) - len(old))


def _check_str_method(
    owner: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, ...]:
    """Bounds of a ``str``/``bytes`` method call; returns the arguments to call it with (``join``'s
    iterable read into a list)."""
    n = len(owner)
    if name in ("center", "ljust", "rjust", "zfill"):
        w = args[0] if args else kwargs.get("width", 0)
        if isinstance(w, int):
            _check_size(f"str.{name}", max(n, w))
    elif name == "expandtabs":
        tab = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(tab, int):
            t = "\t" if isinstance(owner, str) else b"\t"
            _check_size("str.expandtabs", n + owner.count(t) * max(0, tab))
    elif name == "replace" and len(args) >= 2:
        _check_size("str.replace", _replace_size(owner, *args[:3], kwargs.get("count")))
    elif name == "join" and args:
        return (_bounded_list(owner, args[0]), *args[1:])
    elif name == "translate" and args and isinstance(args[0], Mapping):
        longest = max((len(v) if isinstance(v, (str, bytes)) else 1 for v in args[0].values()), default=1)
        _check_size("str.translate", n * longest)
    return args


class _BoundedCodeGenerator(CodeGenerator):
    """``a ~ b`` compiles to ``environment.bounded_concat((a, b))`` (a size check, then the join)."""

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.bounded_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


#: the list methods a template may call although they change the list: Kimi-K2's templates queue tool
#: call ids with ``ns.ids.append(id)`` / ``ns.ids.pop(0)``, as llama.cpp's Jinja engine allows. One item
#: at a time, so the render guard's memory check sees a list grow; ``ChatTemplate`` renders such a
#: template on copies of its inputs.
LIST_MUTATORS = frozenset({"append", "pop"})


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox with size bounds (see the module's doc) and unsafe attribute access an error
    at once (``__class__``, ``dict.update``, ...), not a silent empty value; lists may ``append`` and
    ``pop`` (:data:`LIST_MUTATORS`)."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"**", "*", "+", "%"})

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if isinstance(obj, list) and attr in LIST_MUTATORS:
            return SandboxedEnvironment.is_safe_attribute(self, obj, attr, value)
        return super().is_safe_attribute(obj, attr, value)

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__!r} object is unsafe")

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**":
            _check_pow(left, right)
        elif operator == "*":
            _check_mul(left, right)
        elif operator == "+":
            # llama.cpp's Jinja: an undefined value or none added to a string is an empty string
            if isinstance(right, str) and (left is None or isinstance(left, jinja2.Undefined)):
                left = ""
            elif isinstance(left, str) and (right is None or isinstance(right, jinja2.Undefined)):
                right = ""
            _check_add(left, right)
        elif operator == "%":
            check_printf(left, right)
        return self.binop_table[operator](left, right)

    def bounded_concat(self, items: tuple[Any, ...]) -> str:
        parts = [str(x) for x in items]
        _check_size("'~'", sum(map(len, parts)))
        return "".join(parts)

    def wrap_str_format(self, value: Any) -> Any:
        fn = super().wrap_str_format(value)
        if fn is None:
            return None
        fmt, is_map = value.__self__, value.__name__ == "format_map"

        def checked(*args: Any, **kwargs: Any) -> str:
            vals = list(args[0].values()) if is_map and args and isinstance(args[0], Mapping) else []
            check_format(fmt, vals or [*args, *kwargs.values()])
            return fn(*args, **kwargs)

        return checked

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, (str, bytes)) and isinstance(__obj, types.BuiltinMethodType):
            args = _check_str_method(owner, __obj.__name__, args, kwargs)
        return super().call(__context, __obj, *args, **kwargs)


def _bounded(original: Any, check: Any) -> Any:
    """A filter that runs ``check(*args, **kwargs)`` before ``original`` (keeping its pass_* marker)."""

    @functools.wraps(original)
    def filt(*args: Any, **kwargs: Any) -> Any:
        check(*args, **kwargs)
        return original(*args, **kwargs)

    return filt


def _center_check(value: Any, width: Any = 80) -> None:
    if isinstance(width, int):
        _check_size("center", max(len(str(value)), width))


def _indent_check(s: Any, width: Any = 4, first: bool = False, blank: bool = False) -> None:
    unit = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
    text = str(s)
    _check_size("indent", len(text) + (text.count("\n") + 1) * max(0, unit))


def _wordwrap_check(
    env: Any, s: Any, width: Any = 79, brk: Any = True, wrapstring: Any = None, *a: Any, **k: Any
) -> None:
    wrap = k.get("wrapstring", wrapstring)
    sep = len(wrap) if isinstance(wrap, str) else 1
    text = str(s)
    _check_size("wordwrap", len(text) + (len(text) + 1) * sep)


def _format_check(value: Any, *args: Any, **kwargs: Any) -> None:
    check_printf(str(value), kwargs or args)


def _replace_check(eval_ctx: Any, s: Any, old: Any, new: Any, count: Any = None) -> None:
    _check_size("replace", _replace_size(str(s), str(old), str(new), count))


def _batch_check(value: Any, linecount: Any, fill_with: Any = None) -> None:
    if fill_with is not None and isinstance(linecount, int) and linecount > MAX_RANGE:
        raise TemplateLimitError(f"batch of {linecount} with fill_with (limit {MAX_RANGE})")


def _bounded_join(original: Any) -> Any:
    @functools.wraps(original)
    def join(eval_ctx: Any, value: Any, d: str = "", attribute: Any = None) -> Any:
        return original(eval_ctx, _bounded_list(d, value), d, attribute)

    return join


def _bounded_sum(original: Any) -> Any:
    @functools.wraps(original)
    def total(environment: Any, iterable: Any, attribute: Any = None, start: Any = 0) -> Any:
        items = _bounded_list("", iterable, "sum")
        if isinstance(start, (list, tuple, str)):
            _check_size("sum", value_size(start) + sum(value_size(x) for x in items))
        return original(environment, items, attribute, start)

    return total


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002
    if not all(isinstance(x, int) for x in (n, min, max)) or n > 1000 or max > 10_000:
        raise TemplateLimitError("lipsum(): at most 1000 paragraphs of 10000 words")
    from jinja2.utils import generate_lorem_ipsum

    return generate_lorem_ipsum(n, html, min, max)


def safe_range(*args: int) -> range:
    r = range(*args)
    if len(r) > MAX_RANGE:
        raise TemplateLimitError(f"range() of {len(r)} items is over the limit of {MAX_RANGE}")
    return r


def bound_filters(env: jinja2.Environment) -> None:
    """Put the bounded versions of the size-amplifying filters and globals into ``env``."""
    f = env.filters
    f["center"] = _bounded(f["center"], _center_check)
    f["indent"] = _bounded(f["indent"], _indent_check)
    f["wordwrap"] = _bounded(f["wordwrap"], _wordwrap_check)
    f["format"] = _bounded(f["format"], _format_check)
    f["replace"] = _bounded(f["replace"], _replace_check)
    f["batch"] = _bounded(f["batch"], _batch_check)
    f["join"] = _bounded_join(f["join"])
    f["sum"] = _bounded_sum(f["sum"])
    env.globals.update(range=safe_range, lipsum=_lipsum)


def _rss() -> int:
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return -1


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class RenderGuard:
    """Stops a render that runs past ``seconds`` or grows the process's memory by more than
    ``max_memory`` bytes: a tracer checked at every Python call and every line of template code (the
    template's frames get a local tracer), installed only when no other tracer (debugger, coverage) is
    active. Memory is read from ``/proc/self/statm`` every 2 ms (where it exists)."""

    def __init__(self, seconds: float, max_memory: int = MAX_RENDER_MEMORY) -> None:
        self.end = time.monotonic() + seconds
        self.seconds = seconds
        self.max_memory = max_memory
        self.installed = False
        self.rss0 = _rss()
        self.next_mem = 0.0  # the next full check (deadline and memory): every 2 ms

    def check(self) -> None:
        now = time.monotonic()
        if now > self.end:
            raise TemplateLimitError(f"rendering took longer than {self.seconds:g} s")
        if now >= self.next_mem:
            self.next_mem = now + _MEMORY_CHECK_S
            if self.rss0 >= 0 and _rss() - self.rss0 > self.max_memory:
                raise TemplateLimitError(f"rendering took more than {self.max_memory >> 20} MiB of memory")

    def _local(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "line" and time.monotonic() >= self.next_mem:
            self.check()
        return self._local

    def _trace(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "call":
            if time.monotonic() >= self.next_mem:
                self.check()
            if frame.f_code.co_filename == "<template>":
                return self._local
        return None

    def __enter__(self) -> RenderGuard:
        if sys.gettrace() is None:
            sys.settrace(self._trace)
            self.installed = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.installed:
            sys.settrace(None)
