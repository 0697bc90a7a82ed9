"""llamapy._dataclass: classes made from cached code equal the standard library's, the cache is read
by the next process, and a damaged or unwritable cache only means compiling again."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from llamapy import _dataclass

SPECS = [
    {},
    {"frozen": True},
    {"order": True},
    {"eq": False},
    {"slots": True},
    {"kw_only": True},
    {"unsafe_hash": True},
    {"repr": False, "init": False},
    {"frozen": True, "slots": True, "order": True},
]


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LLAMAPY_CACHE", str(tmp_path))
    monkeypatch.setattr(_dataclass, "_codes", {})
    monkeypatch.setattr(_dataclass, "_index", None)
    monkeypatch.setattr(_dataclass, "_data", b"")
    monkeypatch.setattr(_dataclass, "_rewrite", False)
    return Path(_dataclass.cache_path())


def make(decorator, kwargs):  # type: ignore[no-untyped-def]
    """The same class body under ``decorator``: defaults, a factory, an InitVar, a ClassVar, a
    non-init field, a string annotation (``from __future__ import annotations`` in this file)."""

    class Point:
        x: int
        y: float = 2.5
        tags: list[str] = dataclasses.field(default_factory=list)
        hidden: int = dataclasses.field(default=7, init=False, repr=False)
        scale: dataclasses.InitVar[int] = 1
        KIND: typing.ClassVar[str] = "p"  # noqa: F821

        def __post_init__(self, scale: int) -> None:
            if not kwargs.get("frozen"):
                self.hidden = self.hidden * scale

    return decorator(**kwargs)(Point)


def methods(cls: type) -> dict[str, object]:
    out = {}
    for name in ("__init__", "__repr__", "__eq__", "__lt__", "__hash__", "__setattr__", "__delattr__"):
        fn = cls.__dict__.get(name)
        code = getattr(fn, "__code__", None)
        if code is not None:
            out[name] = (code.co_code, code.co_consts, code.co_names, code.co_varnames, code.co_flags,
                         code.co_filename, fn.__qualname__, fn.__defaults__, fn.__kwdefaults__,
                         dict(getattr(fn, "__annotations__", {})))  # fmt: skip
        else:
            out[name] = fn
    return out


@pytest.mark.parametrize("kwargs", SPECS, ids=lambda k: ",".join(k) or "plain")
def test_same_class_as_the_standard_library(fresh_cache: Path, kwargs: dict) -> None:
    std = make(dataclasses.dataclass, kwargs)
    for attempt in ("compiled", "cached"):
        ours = make(_dataclass.dataclass, kwargs)
        assert _dataclass._codes is not None
        if attempt == "compiled":
            entries = len(_dataclass._codes)
        assert len(_dataclass._codes) == entries  # the second class compiled nothing new
        assert methods(ours) == methods(std), attempt
        assert [(f.name, f.type, f.default, f.init, f.repr, f.kw_only) for f in dataclasses.fields(ours)] == [
            (f.name, f.type, f.default, f.init, f.repr, f.kw_only) for f in dataclasses.fields(std)
        ]
        assert ours.__doc__.replace("Point", "") == std.__doc__.replace("Point", "")
        assert ours.__dataclass_params__.__repr__() == std.__dataclass_params__.__repr__()
        if kwargs.get("init", True):
            a, b = ours(x=1, tags=["t"]), std(x=1, tags=["t"])
            assert repr(a) == repr(b) or not kwargs.get("repr", True)
            assert dataclasses.asdict(a) == dataclasses.asdict(b)
            if kwargs.get("eq", True):
                assert a == ours(x=1, tags=["t"]) and a != ours(x=2)
    assert "exec" not in dataclasses.__dict__  # the module global is taken away again
    assert fresh_cache.is_file()


def test_decorator_forms_and_no_leftover_global(fresh_cache: Path) -> None:
    @_dataclass.dataclass
    class A:
        x: int = 1

    @_dataclass.dataclass(frozen=True)
    class B:
        x: int = 1

    assert A() == A(1) and B() == B(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        B().x = 2  # type: ignore[misc]
    assert "exec" not in dataclasses.__dict__


def test_errors_as_the_standard_library(fresh_cache: Path) -> None:
    with pytest.raises(TypeError, match="non-default argument"):

        @_dataclass.dataclass
        class Bad:
            x: int = 1
            y: int  # type: ignore[misc]

    assert "exec" not in dataclasses.__dict__


SCRIPT = textwrap.dedent(
    """
    import dataclasses, json, sys
    compiled = []
    real = compile
    import builtins
    def counting(*a, **k):
        compiled.append(1)
        return real(*a, **k)
    from llamapy import _dataclass
    _dataclass.compile = counting
    @_dataclass.dataclass(order=True)
    class C:
        a: int
        b: str = "x"
    assert C(1) < C(2) and repr(C(1)) == "C(a=1, b='x')"
    print(len(compiled))
    """
)


def run_script(cache: Path) -> int:
    env = {**os.environ, "LLAMAPY_CACHE": str(cache)}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


def test_next_process_compiles_nothing(tmp_path: Path) -> None:
    assert run_script(tmp_path) > 0
    assert run_script(tmp_path) == 0


@pytest.mark.parametrize("damage", ["cut", "garbage", "foreign", "too_large", "code"])
def test_damaged_cache_compiles_and_is_rewritten(tmp_path: Path, damage: str) -> None:
    run_script(tmp_path)
    (path,) = (tmp_path / "pycode").iterdir()
    good = path.read_bytes()
    if damage == "cut":
        path.write_bytes(good[:-5])
    elif damage == "garbage":
        path.write_bytes(b"\xff" * 40)
    elif damage == "foreign":
        import marshal

        entry = marshal.dumps(("text", 12))
        path.write_bytes(len(entry).to_bytes(4, "little") + entry)
    elif damage == "code":  # a record whose header and text are whole but whose code is not
        import struct

        at = len(_dataclass._MAGIC)
        _, n_text, n_code = struct.unpack_from("<III", good, at)
        code_at = at + 12 + n_text
        path.write_bytes(good[:code_at] + b"\xff" * n_code + good[code_at + n_code :])
    else:
        path.write_bytes(good + b"\0" * (_dataclass.MAX_BYTES + 1))
    assert run_script(tmp_path) > 0  # what could not be read compiles again
    assert path.stat().st_size <= len(good) * 2  # rewritten whole, not appended after the damage
    assert run_script(tmp_path) == 0  # and the rewritten file serves the next process


def test_unwritable_cache_still_makes_classes(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert run_script(blocker) > 0
    assert run_script(blocker) > 0


def test_every_llamapy_class_uses_the_cached_decorator() -> None:
    import re

    import llamapy

    root = Path(llamapy.__file__).parent
    plain = re.compile(r"^\s*from dataclasses import [^\n]*\bdataclass\b|@dataclasses\.dataclass\b", re.M)
    found = [
        str(p.relative_to(root))
        for p in sorted(root.rglob("*.py"))
        if p.name != "_dataclass.py" and plain.search(p.read_text(encoding="utf-8"))
    ]
    assert found == []
