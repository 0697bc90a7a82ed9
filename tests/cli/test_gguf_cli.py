"""``llamapy gguf`` as a subprocess: info, dump --json, split -> merge on SmolLM2, and bad files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from llamapy.gguf import GGUFReader, open_model

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llamapy", "gguf", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_info(smollm2_path):
    r = _run("info", smollm2_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "architecture: llama" in out
    assert "Smollm2 135M" in out
    assert "tensors:      272, parameters 134.52M (134515008)" in out
    assert "token_embd.weight" in out and "[49152, 576]" in out
    assert "tokenizer.ggml.tokens" in out and "arr[string,49152]" in out
    assert '"<|endoftext|>", "<|im_start|>"' in out and "<|im_end|>" in out
    assert len(out) < 40_000  # the big token arrays are abbreviated
    lines = {
        ln.split()[0]: ln.split() for ln in out.split("totals per type:")[1].splitlines()[2:] if ln.strip()
    }
    with GGUFReader(smollm2_path) as g:
        for t in ("Q4_1", "Q8_0", "F32"):
            ts = [x for x in g.tensors if x.ggml_type.name == t]
            assert lines[t][1:4] == [
                str(len(ts)),
                str(sum(x.n_elements for x in ts)),
                str(sum(x.nbytes for x in ts)),
            ]


def test_dump_json(smollm2_path):
    r = _run("dump", "--json", smollm2_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    with GGUFReader(smollm2_path) as g:
        assert doc["version"] == 3 and doc["alignment"] == 32 and doc["file_size"] == g.file_size
        assert list(doc["metadata"]) == list(g.fields)
        for k, f in g.fields.items():
            d = doc["metadata"][k]
            assert d["type"] == f.type.name
            v = f.value.tolist() if isinstance(f.value, np.ndarray) else f.value
            if f.type.name == "FLOAT32":
                assert np.float32(d["value"]) == np.float32(v)
            else:
                assert d["value"] == v, k
        assert [t["name"] for t in doc["tensors"]] == [t.name for t in g.tensors]
        t0, g0 = doc["tensors"][0], g.tensors[0]
        assert (t0["type"], t0["shape"], t0["ne"], t0["offset"], t0["nbytes"]) == (
            g0.ggml_type.name,
            list(g0.shape),
            list(g0.ne),
            g0.offset,
            g0.nbytes,
        )


def test_split_then_merge(smollm2_path, tmp_path):
    r = _run("split", "--split-max-size", "40M", smollm2_path, tmp_path / "smol")
    assert r.returncode == 0, r.stderr
    parts = sorted(tmp_path.glob("smol-*.gguf"))
    assert [p.name for p in parts] == [f"smol-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert "n_split: 3" in r.stdout
    with open_model(parts[0]) as m:
        assert m.n_split == 3 and len(m.tensors) == 272
    info = _run("info", parts[0])
    assert info.returncode == 0 and "(+2 more splits)" in info.stdout and "tensors:      272" in info.stdout

    merged = tmp_path / "merged.gguf"
    r = _run("merge", parts[0], merged)
    assert r.returncode == 0, r.stderr
    with GGUFReader(smollm2_path) as a, GGUFReader(merged) as b:
        assert list(a.fields) == list(b.fields)
        for k in a.fields:
            assert a.raw_value(k) == b.raw_value(k)
        assert [(t.name, t.ggml_type, t.ne) for t in a.tensors] == [
            (t.name, t.ggml_type, t.ne) for t in b.tensors
        ]
        for t in a.tensors:
            assert np.array_equal(t.data, b.tensor_index[t.name].data), t.name
    assert merged.stat().st_size == Path(smollm2_path).stat().st_size


def test_split_by_tensor_count_dry_run(smollm2_path, tmp_path):
    r = _run("split", "--split-max-tensors", "100", "--dry-run", smollm2_path, tmp_path / "x")
    assert r.returncode == 0, r.stderr
    assert "n_split: 3" in r.stdout and "n_tensors = 100" in r.stdout and "n_tensors = 72" in r.stdout
    assert not list(tmp_path.iterdir())


def _bad_files(tmp_path: Path) -> list[Path]:
    files = {
        "empty.gguf": b"",
        "text.gguf": b"hello world, this is not a GGUF file at all\n",
        "counts.gguf": b"GGUF\x03\x00\x00\x00" + b"\xff" * 16,
        "version.gguf": b"GGUF\x09\x00\x00\x00" + b"\x00" * 16,
    }
    out = []
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        out.append(tmp_path / name)
    return out + [tmp_path / "missing.gguf", tmp_path]


@pytest.mark.parametrize("action", ["info", "dump"])
def test_bad_files_give_one_error_line(tmp_path, action):
    files = _bad_files(tmp_path)
    for p in files if action == "info" else files[2:4]:
        r = _run(action, p)
        assert r.returncode == 1, (p, r.stderr)
        assert r.stdout == ""
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
        assert "Traceback" not in r.stderr


def test_bad_split_and_merge_arguments(smollm2_path, tmp_path):
    r = _run("merge", smollm2_path, tmp_path / "o.gguf")
    assert r.returncode == 1 and r.stderr.startswith("error: ") and "not a split model" in r.stderr
    r = _run("split", "--split-max-size", "12X", smollm2_path, tmp_path / "o")
    assert r.returncode == 1 and "bad size" in r.stderr and "Traceback" not in r.stderr
    r = _run("split", smollm2_path, tmp_path / "o")  # a mode is required
    assert r.returncode == 2 and "--split-max-tensors" in r.stderr
