"""Split models: open_model over PREFIX-0000i-of-0000n.gguf, split_model / merge_model round trips, and
missing or inconsistent splits."""

from __future__ import annotations

import os

import numpy as np
import pytest

from llamapy.ggml.types import GGMLType
from llamapy.gguf import GGUFError, GGUFReader, GGUFValueType, GGUFWriter, open_model
from llamapy.gguf.split import merge_model, parse_size, plan_splits, split_model, split_path, split_prefix

VT = GGUFValueType


def _model(path, alignment=32, n=7):
    """A small model: metadata of several types and n tensors of mixed types and sizes."""
    rng = np.random.default_rng(0)
    w = GGUFWriter(path, arch="llama", alignment=alignment)
    w.add_key_value("llama.block_count", 3, VT.UINT32)
    w.add_key_value("tokenizer.ggml.tokens", ["a", "b", "ç"])
    w.add_key_value("llama.rope.freq_base", 10000.0)
    for i in range(n):
        if i % 2:
            w.add_tensor(
                f"blk.{i}.w", rng.integers(0, 256, (i + 1, 34), dtype=np.uint8), ggml_type=GGMLType.Q8_0
            )
        else:
            w.add_tensor(f"blk.{i}.w", rng.standard_normal((i + 1, 40)).astype(np.float32))
    w.write()
    return path


def _same_model(a, b):
    assert list(a.fields) == list(b.fields)
    for k, f in a.fields.items():
        assert (f.type, f.sub_type) == (b.fields[k].type, b.fields[k].sub_type)
        assert a.raw_value(k) == b.raw_value(k), k
    assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
    for t in a.tensors:
        u = b.tensor_index[t.name]
        assert (t.ggml_type, t.ne, t.nbytes) == (u.ggml_type, u.ne, u.nbytes)
        assert bytes(t.data) == bytes(u.data)


def test_naming():
    assert split_path("out/m", 0, 3) == "out/m-00001-of-00003.gguf"
    assert split_prefix("out/m-00002-of-00003.gguf", 1, 3) == "out/m"
    assert split_prefix("out/m-00002-of-00003.gguf", 0, 3) is None
    assert split_prefix("out/m.gguf", 0, 1) is None


def test_parse_size():
    assert parse_size("500M") == 500_000_000 and parse_size("2G") == 2_000_000_000
    assert parse_size("10k") == 10_000 and parse_size("123") == 123
    for bad in ("0M", "-5M", "5X", "", "M"):
        with pytest.raises(GGUFError, match="bad size"):
            parse_size(bad)


def test_single_file_opens_as_itself(tmp_path):
    p = _model(tmp_path / "m.gguf")
    with open_model(p) as m, GGUFReader(p) as r:
        assert m.n_split == 1 and m.paths == [str(p)]
        _same_model(m, r)
        assert m.get("llama.block_count") == 3 and m.metadata["general.architecture"] == "llama"


@pytest.mark.parametrize("alignment", [32, 128])
@pytest.mark.parametrize(
    "mode", [{"max_tensors": 2}, {"max_tensors": 100}, {"max_size": 300}, {"max_size": 1}]
)
def test_split_open_merge_round_trip(tmp_path, alignment, mode):
    src = _model(tmp_path / "m.gguf", alignment=alignment)
    plan = split_model(src, str(tmp_path / "s"), **mode)
    n = len(plan)
    assert [p for p, _ in plan] == [split_path(str(tmp_path / "s"), i, n) for i in range(n)]
    if mode.get("max_tensors") == 2:
        assert [len(g) for _, g in plan] == [2, 2, 2, 1]
    if mode.get("max_size") == 1:  # every tensor alone
        assert n == 7
    for i, (p, group) in enumerate(plan):
        r = GGUFReader(p)
        assert r.alignment == alignment
        assert (r.fields["split.no"].type, r.get("split.no")) == (VT.UINT16, i)
        assert (r.fields["split.count"].type, r.get("split.count")) == (VT.UINT16, n)
        assert (r.fields["split.tensors.count"].type, r.get("split.tensors.count")) == (VT.INT32, 7)
        assert ("llama.block_count" in r.fields) == (i == 0)  # metadata in the first split only
        assert [t.name for t in r.tensors] == [t.name for t in group]
    with open_model(plan[0][0]) as m, GGUFReader(src) as orig:
        assert m.n_split == n and len(m.tensors) == 7
        assert m.file_size == sum(GGUFReader(p).file_size for p, _ in plan)
        for t in orig.tensors:
            assert bytes(m.tensor_index[t.name].data) == bytes(t.data)
        out = tmp_path / "merged.gguf"
        assert merge_model(plan[0][0], out) == m.paths
        with GGUFReader(out) as merged:
            _same_model(orig, merged)
        assert out.read_bytes() == src.read_bytes()  # gguf-split keys removed: the very same file


def test_plan_like_gguf_split(tmp_path):
    with GGUFReader(_model(tmp_path / "m.gguf")) as r:
        sizes = [t.nbytes + (-t.nbytes % 32) for t in r.tensors]
        for limit in (200, 500, 1000):
            groups = plan_splits(r.tensors, max_size=limit)
            assert sum(len(g) for g in groups) == 7
            i = 0
            for g in groups:
                total = sum(sizes[i : i + len(g)])
                assert total <= limit or len(g) == 1
                if i + len(g) < 7:  # the next tensor did not fit
                    assert total + sizes[i + len(g)] > limit
                i += len(g)
        with pytest.raises(GGUFError, match="exactly one"):
            plan_splits(r.tensors)
        with pytest.raises(GGUFError, match="at least 1"):
            plan_splits(r.tensors, max_tensors=0)


def test_gguf_py_reads_splits(tmp_path):
    gguf = pytest.importorskip("gguf")
    plan = split_model(_model(tmp_path / "m.gguf"), str(tmp_path / "s"), max_tensors=3)
    for p, group in plan:
        g = gguf.GGUFReader(p)
        assert [t.name for t in g.tensors] == [t.name for t in group]
        assert int(g.fields["split.count"].contents()) == len(plan)


def _splits(tmp_path, n=3):
    return [p for p, _ in split_model(_model(tmp_path / "m.gguf"), str(tmp_path / "s"), max_tensors=3)][:n]


def _rewrite(path, **changes):
    """Rewrite one split with some metadata changed (None removes a key)."""
    with GGUFReader(path) as r:
        tmp = str(path) + ".new"
        w = GGUFWriter(tmp)
        for k, f in r.fields.items():
            if k in changes:
                v = changes[k]
                if v is not None:
                    w.add_key_value(k, v, None if isinstance(v, str) else f.type)
            else:
                w.add_key_value_raw(k, f.type, r.raw_value(k))
        for t in r.tensors:
            w.add_tensor(t.name, t.data.copy(), ggml_type=t.ggml_type, raw_shape=t.shape)
        w.write()
    os.replace(tmp, path)


def test_missing_split(tmp_path):
    paths = _splits(tmp_path)
    os.remove(paths[1])
    with pytest.raises(GGUFError, match=r"split 2 of 3 is missing: .*s-00002-of-00003\.gguf"):
        open_model(paths[0])


def test_open_a_later_split(tmp_path):
    paths = _splits(tmp_path)
    with pytest.raises(GGUFError, match="this is split 2 of 3; open the first split"):
        open_model(paths[1])


def test_inconsistent_splits(tmp_path):
    paths = _splits(tmp_path)
    _rewrite(paths[2], **{"split.no": 1})
    with pytest.raises(GGUFError, match="split.no is 1, expected 2"):
        open_model(paths[0])
    paths = _splits(tmp_path)
    _rewrite(paths[1], **{"split.count": 4})
    with pytest.raises(GGUFError, match="split.count is 4, expected 3"):
        open_model(paths[0])
    paths = _splits(tmp_path)
    _rewrite(paths[0], **{"split.tensors.count": 8})
    with pytest.raises(GGUFError, match="split.tensors.count is 7, but the first split says 8"):
        open_model(paths[0])
    paths = _splits(tmp_path)
    _rewrite(paths[1], **{"split.no": None})
    with pytest.raises(GGUFError, match="split.no is None, expected 1"):
        open_model(paths[0])
    paths = _splits(tmp_path)
    _rewrite(paths[0], **{"split.no": None})
    with pytest.raises(GGUFError, match="split.count = 3 but there is no split.no"):
        open_model(paths[0])
    paths = _splits(tmp_path)
    _rewrite(paths[0], **{"split.count": "3"})
    with pytest.raises(GGUFError, match="split.count at offset \\d+ has type STRING, expected an integer"):
        open_model(paths[0])


def test_tensor_count_and_duplicates(tmp_path):
    paths = _splits(tmp_path)
    for p in paths:
        _rewrite(p, **{"split.tensors.count": 9})
    with pytest.raises(GGUFError, match="split.tensors.count = 9, but the 3 splits hold 7 tensors"):
        open_model(paths[0])
    # a tensor in two splits
    paths = _splits(tmp_path)
    with GGUFReader(paths[1]) as r:
        t = r.tensors[0]
        w = GGUFWriter(str(paths[2]) + ".x")
        for k, f in GGUFReader(paths[2]).fields.items():
            w.add_key_value_raw(k, f.type, GGUFReader(paths[2]).raw_value(k))
        w.add_tensor(t.name, t.data.copy(), ggml_type=t.ggml_type, raw_shape=t.shape)
        w.write()
    os.replace(str(paths[2]) + ".x", paths[2])
    with pytest.raises(GGUFError, match=rf"tensor '{t.name}' .* is also in .*00002-of-00003"):
        open_model(paths[0])


def test_bad_names_and_outputs(tmp_path):
    paths = _splits(tmp_path)
    renamed = tmp_path / "model.gguf"
    os.rename(paths[0], renamed)
    with pytest.raises(GGUFError, match="name does not end in -00001-of-00003.gguf"):
        open_model(renamed)
    paths = _splits(tmp_path)
    with pytest.raises(GGUFError, match="already exists"):
        merge_model(paths[0], paths[1])
    with pytest.raises(GGUFError, match="not a split model"):
        merge_model(tmp_path / "m.gguf", tmp_path / "o.gguf")
    with pytest.raises(GGUFError, match="already split into 3 files"):
        split_model(paths[0], str(tmp_path / "again"), max_tensors=1)
    assert not list(tmp_path.glob("*.tmp"))
