"""The limits of :mod:`.limits` on JSON schemas: nesting, ``$ref`` chains, patterns, and ``$ref`` cycles
that can never end (``{"$ref": "#"}``: llguidance accepts them, then fails while sampling)."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from .errors import GrammarError
from .limits import MAX_JSON_NESTING, MAX_SCHEMA_CHAIN, chain_bound, chain_error, components, regex_cost

_MAPS = ("properties", "patternProperties", "dependentSchemas", "dependencies")
_DEFS = ("$defs", "definitions")
_ONE = ("additionalProperties", "items", "additionalItems", "contains", "propertyNames", "unevaluatedItems",
        "unevaluatedProperties", "not", "if", "then", "else")  # fmt: skip
_LISTS = ("prefixItems", "items", "allOf", "anyOf", "oneOf")
_NOT_GENERATED = ("not", "if")  # what only tests the value: an unsatisfiable one there blocks nothing


def _json_depth(value: Any, what: str) -> None:
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            items: Any = v.values()
        elif isinstance(v, list):
            items = v
        else:
            continue
        if d > MAX_JSON_NESTING:
            raise GrammarError(
                f"{what} is nested too deeply (objects and arrays more than {MAX_JSON_NESTING} deep)"
            )
        stack.extend((x, d + 1) for x in items)


def _escape(key: str) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


class _Graph:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.nodes: list[Any] = []
        self.ptrs: list[str] = []
        self.ids: dict[int, int] = {}
        self.children: list[list[tuple[str, int]]] = []  # (keyword, node)
        self.refs: list[int] = []  # resolved $ref target, or -1
        self.anchors: dict[str, Any] = {}
        self.todo: list[int] = []

    def add(self, node: Any, ptr: str) -> int:
        k = self.ids.get(id(node))
        if k is not None:
            return k
        k = len(self.nodes)
        self.ids[id(node)] = k
        self.nodes.append(node)
        self.ptrs.append(ptr)
        self.children.append([])
        self.refs.append(-1)
        self.todo.append(k)
        return k

    def build(self) -> None:
        self.add(self.root, "#")
        self.drain()
        k = 0
        while k < len(self.nodes):  # refs last: every anchor is known; new places are walked as found
            node = self.nodes[k]
            if isinstance(node, dict) and isinstance(node.get("$ref"), str):
                self.refs[k] = self.resolve(node["$ref"])
                self.drain()
            k += 1

    def drain(self) -> None:
        while self.todo:
            k = self.todo.pop()
            node, ptr = self.nodes[k], self.ptrs[k]
            if not isinstance(node, dict):
                continue
            for key in ("$anchor", "$id", "id"):
                a = node.get(key)
                if isinstance(a, str):
                    self.anchors.setdefault(a.lstrip("#") if key != "$anchor" else a, node)
            kids = self.children[k]
            for key in _MAPS + _DEFS:
                sub = node.get(key)
                if isinstance(sub, dict):
                    for name, s in sub.items():
                        if isinstance(s, (dict, bool)):
                            c = self.add(s, f"{ptr}/{key}/{_escape(name)}")
                            if key not in _DEFS:  # definitions are used through $ref only
                                kids.append((key, c))
            for key in _ONE:
                s = node.get(key)
                if isinstance(s, (dict, bool)):
                    kids.append((key, self.add(s, f"{ptr}/{key}")))
            for key in _LISTS:
                sub = node.get(key)
                if isinstance(sub, list):
                    for i, s in enumerate(sub):
                        if isinstance(s, (dict, bool)):
                            kids.append((key, self.add(s, f"{ptr}/{key}/{i}")))

    def resolve(self, ref: str) -> int:
        base, _, frag = ref.partition("#")
        if base:
            node = self.anchors.get(base)
            if node is None or frag:
                return -1
            return self.ids.get(id(node), -1)
        if frag and not frag.startswith("/"):
            node = self.anchors.get(frag)
            return -1 if node is None else self.ids.get(id(node), -1)
        node = self.root
        for part in frag.split("/")[1:]:
            part = unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return -1
        if not isinstance(node, (dict, bool)):
            return -1
        return self.add(node, "#" + frag)  # the node already seen, or a new place to walk


def check_schema(schema: Any, what: str = "JSON schema") -> None:
    """GrammarError if ``schema`` nests too deeply, chains too many subschemas and ``$ref``\\ s, has a
    ``pattern`` whose repetitions expand too far, or a ``$ref`` cycle that no value can ever end."""
    _json_depth(schema, what)
    if not isinstance(schema, dict):
        return
    g = _Graph(schema)
    g.build()
    n = len(g.nodes)
    edges = [
        sorted({c for _, c in g.children[k]} | ({g.refs[k]} if g.refs[k] >= 0 else set())) for k in range(n)
    ]
    bound, path = chain_bound(n, edges, [0])
    lost = next((node["$ref"] for k, node in enumerate(g.nodes) if isinstance(node, dict)
                 and isinstance(node.get("$ref"), str) and g.refs[k] < 0), None)  # fmt: skip
    if lost is not None and n > MAX_SCHEMA_CHAIN:  # it may lead anywhere: every subschema may be on the chain
        raise GrammarError(
            f"{what}: the $ref {lost[:100]!r} cannot be followed here, and with {n} subschemas a chain of them "
            f"might be deeper than the limit of {MAX_SCHEMA_CHAIN}"
        )
    if bound > MAX_SCHEMA_CHAIN:
        raise chain_error(what, bound, [g.ptrs[k] for k in path], MAX_SCHEMA_CHAIN, "subschemas and $refs")
    for k, node in enumerate(g.nodes):
        if not isinstance(node, dict):
            continue
        if isinstance(node.get("pattern"), str):
            regex_cost(node["pattern"], f"{what}: pattern at {g.ptrs[k]}")
        props = node.get("patternProperties")
        if isinstance(props, dict):
            for rx in props:
                regex_cost(str(rx), f"{what}: patternProperties at {g.ptrs[k]}")
    _check_cycles(g, edges, what)


def _check_cycles(g: _Graph, edges: list[list[int]], what: str) -> None:
    """A subschema that only a value of itself can satisfy (``{"$ref": "#"}``, a required property that
    refers back, two ``$ref``\\ s to each other): no finite value matches it."""
    _, comps = components(len(g.nodes), edges, [0])
    good = [False] * len(g.nodes)
    for members in comps:
        cyclic = len(members) > 1 or members[0] in edges[members[0]]
        for _ in range(len(members) if cyclic else 1):
            changed = False
            for v in members:
                if not good[v] and _productive(g, v, good):
                    good[v] = changed = True
            if not changed:
                break
        if not cyclic:
            continue
        for v in members:
            if not good[v] and isinstance(g.nodes[v], dict):
                raise GrammarError(
                    f"{what}: no value can ever match {g.ptrs[v]}: its $ref cycle has no way out (each way "
                    "through it needs another value of itself)"
                )


def _productive(g: _Graph, v: int, good: list[bool]) -> bool:
    node = g.nodes[v]
    if not isinstance(node, dict):
        return node is not False
    kids: dict[str, list[int]] = {}
    for key, c in g.children[v]:
        kids.setdefault(key, []).append(c)
    if "$ref" in node and g.refs[v] >= 0 and not good[g.refs[v]]:
        return False
    if not all(good[c] for c in kids.get("allOf", ())):
        return False
    for key in ("anyOf", "oneOf"):
        if kids.get(key) and not any(good[c] for c in kids[key]):
            return False
    props = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    required = node.get("required") if isinstance(node.get("required"), list) else []
    for name in required:
        s = props.get(name) if isinstance(name, str) else None
        if isinstance(s, (dict, bool)) and not good[g.ids[id(s)]]:
            return False
    n_min = node.get("minItems", 0)
    if isinstance(n_min, int) and n_min > 0:
        prefix = node.get("prefixItems") if isinstance(node.get("prefixItems"), list) else []
        for s in prefix[:n_min]:
            if isinstance(s, (dict, bool)) and not good[g.ids[id(s)]]:
                return False
        items = node.get("items")
        if n_min > len(prefix) and isinstance(items, (dict, bool)) and not good[g.ids[id(items)]]:
            return False
    return True
