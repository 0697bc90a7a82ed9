"""Structure-aware mutations of valid request bodies, for property-based tests of the HTTP routes.

A mutation takes a valid body and, at one of its paths (any field at any depth, list items included),
puts a value of another JSON type, removes the field, or wraps the value in a list or an object. The
server must answer every mutant with a 2xx or a 4xx in the API's own error shape: never a 5xx.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from hypothesis import strategies as st

Path = tuple[str | int, ...]

# values of every JSON type, and the shapes that broke the server before (unhashable "type"s)
WRONG: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    2**70,
    1.5,
    1e308,
    "",
    "x",
    [],
    ["x"],
    [1],
    [None],
    {},
    {"a": 1},
    {"type": ["x"]},
    {"type": {"a": 1}},
    [{"type": ["text"]}],
]

_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    _scalars | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def paths(obj: Any, prefix: Path = ()) -> Iterator[Path]:
    """Every path below ``obj`` (not the root itself), depth first."""
    if isinstance(obj, dict):
        items: Any = obj.items()
    elif isinstance(obj, list):
        items = enumerate(obj)
    else:
        return
    for k, v in items:
        yield (*prefix, k)
        yield from paths(v, (*prefix, k))


def _parent(obj: Any, path: Path) -> Any:
    for k in path[:-1]:
        obj = obj[k]
    return obj


def replaced(body: dict[str, Any], path: Path, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(body)
    _parent(out, path)[path[-1]] = value
    return out


def removed(body: dict[str, Any], path: Path) -> dict[str, Any]:
    out = copy.deepcopy(body)
    del _parent(out, path)[path[-1]]
    return out


def _value_at(body: dict[str, Any], path: Path) -> Any:
    return _parent(body, path)[path[-1]]


@st.composite
def mutants(draw: st.DrawFn, seeds: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
    """A mutated copy of one of ``seeds``, and a description of the mutation (for failure messages)."""
    seed = draw(st.sampled_from(seeds))
    path = draw(st.sampled_from(list(paths(seed))))
    op = draw(st.sampled_from(["wrong", "wrong", "random", "remove", "wrap_list", "wrap_object"]))
    where = ".".join(map(str, path))
    if op == "remove":
        return removed(seed, path), f"removed {where}"
    if op == "wrap_list":
        return replaced(seed, path, [_value_at(seed, path)]), f"{where} wrapped in a list"
    if op == "wrap_object":
        return replaced(seed, path, {"value": _value_at(seed, path)}), f"{where} wrapped in an object"
    value = draw(st.sampled_from(WRONG) if op == "wrong" else json_values)
    return replaced(seed, path, value), f"{where} = {value!r}"
