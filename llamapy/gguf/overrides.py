"""Metadata overrides: llama.cpp's ``--override-kv KEY=TYPE:VALUE`` (``string_parse_kv_override``) and
llama-cpp-python's ``kv_overrides={key: value}``, parsed in one place, and applied to a file's metadata
before anything reads it (``llama_model_loader``'s ``kv_overrides``).

TYPE is ``int``, ``float``, ``bool`` (``true``/``false``) or ``str`` (at most 127 bytes); keys are
shorter than 128 characters. Unlike llama.cpp's ``atol``/``atof``, a value that is not a number of its
type is an error, not 0. Applying: an overridden key keeps its kind (an ``int`` override of a float key is
an error where llama.cpp warns and keeps the file's value), a key the file lacks is added (as llama.cpp,
whose reads see the override), and array keys cannot be overridden. Float values are read as float32,
as llama.cpp's ``float`` hyper-parameters are.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from typing import Any

import numpy as np

from .._dataclass import dataclass
from ..errors import LlamapyError

__all__ = [
    "KVOverride",
    "KVOverrideError",
    "apply_kv_overrides",
    "kv_override",
    "kv_overrides",
    "parse_kv_override",
    "parse_kv_overrides",
]

TYPES = ("int", "float", "bool", "str")
MAX_KEY = 127  # llama_model_kv_override.key is char[128]
MAX_STR = 127  # .val_str is char[128]


class KVOverrideError(LlamapyError, ValueError):
    """A malformed metadata override, or one whose type does not fit the key it replaces."""


@dataclass(frozen=True)
class KVOverride:
    """One override: ``key`` gets ``value`` of ``type`` (``int``, ``float``, ``bool`` or ``str``)."""

    key: str
    type: str
    value: int | float | bool | str

    def __str__(self) -> str:
        v = ("true" if self.value else "false") if self.type == "bool" else self.value
        return f"{self.key}={self.type}:{v}"


def _check_key(key: str, what: str) -> None:
    if not key:
        raise KVOverrideError(f"malformed KV override {what}: the key is empty")
    if len(key) > MAX_KEY:
        raise KVOverrideError(f"malformed KV override {what}: the key is longer than {MAX_KEY} characters")


def parse_kv_override(spec: str) -> KVOverride:
    """``KEY=TYPE:VALUE`` (llama.cpp's ``string_parse_kv_override``, one item)."""
    key, sep, rest = spec.partition("=")
    ty, colon, val = rest.partition(":")
    if not sep or not colon or ty not in TYPES:
        raise KVOverrideError(
            f"malformed KV override {spec!r}: expected KEY=TYPE:VALUE with TYPE int, float, bool or str"
        )
    _check_key(key, repr(spec))
    try:
        if ty == "int":
            return KVOverride(key, ty, int(val))
        if ty == "float":
            f = float(val)
            if not math.isfinite(f):
                raise ValueError
            return KVOverride(key, ty, float(np.float32(f)))
    except (ValueError, OverflowError):
        raise KVOverrideError(f"KV override {spec!r}: {val!r} is not a finite {ty}") from None
    if ty == "bool":
        if val not in ("true", "false"):
            raise KVOverrideError(f"KV override {spec!r}: a bool is true or false, not {val!r}")
        return KVOverride(key, ty, val == "true")
    if len(val.encode("utf-8", "surrogateescape")) > MAX_STR:
        raise KVOverrideError(f"KV override {spec!r}: a str value is at most {MAX_STR} bytes")
    return KVOverride(key, ty, val)


def _csv(value: str) -> list[str]:
    """llama.cpp's ``parse_csv_row``: comma-separated fields; a field starting with ``"`` is quoted (its
    commas kept, ``""`` an escaped quote)."""
    fields: list[str] = []
    field: list[str] = []
    quoted = False
    i = 0
    while i < len(value):
        ch = value[i]
        if ch == '"':
            if not quoted:
                if field:
                    field.append('"')
                else:
                    quoted = True
            elif i + 1 < len(value) and value[i + 1] == '"':
                field.append('"')
                i += 1
            else:
                quoted = False
        elif ch == "," and not quoted:
            fields.append("".join(field))
            field = []
        else:
            field.append(ch)
        i += 1
    fields.append("".join(field))
    return fields


def parse_kv_overrides(value: str) -> list[KVOverride]:
    """One ``--override-kv`` value of llama.cpp's common flags: ``KEY=TYPE:VALUE[,KEY=TYPE:VALUE...]``."""
    return [parse_kv_override(item) for item in _csv(value)]


def kv_override(key: str, value: Any) -> KVOverride:
    """llama-cpp-python's ``kv_overrides`` entry: the Python type of ``value`` picks the override's type
    (bool, int, float, str), or a :class:`KVOverride` of the same key as it is."""
    if not isinstance(key, str):
        raise KVOverrideError(f"kv_overrides: keys are strings, got {key!r}")
    _check_key(key, repr(key))
    if isinstance(value, KVOverride):
        if value.key != key:
            raise KVOverrideError(f"kv_overrides[{key!r}] is an override of {value.key!r}")
        return value
    if isinstance(value, (bool, np.bool_)):
        return KVOverride(key, "bool", bool(value))
    if isinstance(value, (int, np.integer)):
        return KVOverride(key, "int", int(value))
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(float(value)):
            raise KVOverrideError(f"kv_overrides[{key!r}] = {value!r} is not a finite float")
        return KVOverride(key, "float", float(np.float32(value)))
    if isinstance(value, str):
        if len(value.encode("utf-8", "surrogateescape")) > MAX_STR:
            raise KVOverrideError(f"kv_overrides[{key!r}]: a str value is at most {MAX_STR} bytes")
        return KVOverride(key, "str", value)
    raise KVOverrideError(
        f"kv_overrides[{key!r}] = {value!r}: the value must be a bool, int, float or str, "
        f"not {type(value).__name__}"
    )


def kv_overrides(
    overrides: Mapping[str, Any] | Iterable[KVOverride | str] | None,
) -> list[KVOverride]:
    """Overrides given as llama-cpp-python's dict, or as a sequence of :class:`KVOverride` or
    ``KEY=TYPE:VALUE`` strings (each string may hold several, comma-separated)."""
    if not overrides:
        return []
    if isinstance(overrides, Mapping):
        return [kv_override(k, v) for k, v in overrides.items()]
    if isinstance(overrides, str):
        return parse_kv_overrides(overrides)
    out: list[KVOverride] = []
    for o in overrides:
        if isinstance(o, KVOverride):
            out.append(o)
        elif isinstance(o, str):
            out += parse_kv_overrides(o)
        else:
            raise KVOverrideError(f"not a KV override: {o!r} (a KVOverride or a KEY=TYPE:VALUE string)")
    return out


def _kind(v: Any) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "bool"
    if isinstance(v, (int, np.integer)):
        return "int"
    if isinstance(v, (float, np.floating)):
        return "float"
    if isinstance(v, str):
        return "str"
    return "array"


def apply_kv_overrides(
    metadata: MutableMapping[str, Any], overrides: Sequence[KVOverride], where: str = ""
) -> MutableMapping[str, Any]:
    """Replace (or add) the overridden keys of ``metadata`` in place and return it; the last override of
    a key wins. A type that does not fit the file's value is a :class:`KVOverrideError`."""
    for o in overrides:
        if o.key in metadata:
            kind = _kind(metadata[o.key])
            if kind != o.type:
                at = f"{where}: " if where else ""
                article = "an" if kind in ("int", "array") else "a"
                raise KVOverrideError(
                    f"{at}KV override {str(o)!r}: the model's {o.key!r} is {article} {kind}, not {o.type}"
                    + ("" if kind == "array" else f" (write {o.key}={kind}:...)")
                )
        metadata[o.key] = o.value
    return metadata
