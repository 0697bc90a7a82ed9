"""Hostile hyper-parameters (issue 33 §2.12): a NaN, infinite or non-positive epsilon or rope base is a
one-line ModelLoadError naming the key (it was a ZeroDivisionError traceback in the first decode), and the
CLI answers such a file, or one with millions of nested metadata arrays, with ``error:`` and exit 1."""

from __future__ import annotations

import struct
import time

import pytest

from llamapy.model import Model
from llamapy.model.hparams import ModelLoadError
from tests.cli.test_run import llamapy_cmd
from tests.gguf.craft import ARR, STR, build, kv
from tests.model.tiny import llama_config, random_llama_weights, write_gguf

NAN, INF = float("nan"), float("inf")


def tiny_with(path, **meta) -> str:
    cfg = llama_config()
    extra = {f"llama.{k}": float(v) for k, v in meta.items()}
    return str(write_gguf(path, "llama", cfg, random_llama_weights(cfg), extra_meta=extra))


@pytest.mark.parametrize(
    "key, value, why",
    [
        ("attention.layer_norm_rms_epsilon", NAN, "is not a finite number"),
        ("attention.layer_norm_rms_epsilon", INF, "is not a finite number"),
        ("attention.layer_norm_rms_epsilon", 0.0, "must be positive"),
        ("attention.layer_norm_rms_epsilon", -1e-5, "must be positive"),
        ("attention.layer_norm_epsilon", NAN, "is not a finite number"),
        ("rope.freq_base", 0.0, "must be positive"),
        ("rope.freq_base", -INF, "is not a finite number"),
        ("rope.scaling.attn_factor", NAN, "is not a finite number"),
    ],
)
def test_bad_float_hparams_name_the_key(tmp_path, key, value, why):
    path = tiny_with(tmp_path / "bad.gguf", **{key: value})
    with pytest.raises(ModelLoadError) as ei:
        Model.load(path)
    msg = str(ei.value)
    assert f"'llama.{key}'" in msg and why in msg and "\n" not in msg, msg


def test_good_float_hparams_still_load(tmp_path):
    m = Model.load(tiny_with(tmp_path / "ok.gguf", **{"attention.layer_norm_rms_epsilon": 1e-6}))
    assert m.hparams.norm_rms_eps == pytest.approx(1e-6)


def _one_line_error(r, *needles: str) -> None:
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr and all(n in lines[0] for n in needles), r.stderr
    assert r.stdout == ""


def test_cli_nan_epsilon_is_one_line_error(tmp_path):
    path = tiny_with(tmp_path / "nan.gguf", **{"attention.layer_norm_rms_epsilon": NAN})
    t0 = time.perf_counter()
    r = llamapy_cmd("run", "-m", path, "-p", "hi", "-n", "2", timeout=120)
    _one_line_error(r, "llama.attention.layer_norm_rms_epsilon", "not a finite number")
    assert time.perf_counter() - t0 < 60  # the interpreter's start on this box; the check itself is instant


def test_cli_millions_of_nested_arrays_is_one_line_error(tmp_path):
    n = 4_000_000
    lay = build([kv("evil.nested", ARR, struct.pack("<IQ", ARR, n) + struct.pack("<IQ", STR, 0) * n)])
    path = tmp_path / "nested.gguf"
    path.write_bytes(lay.data)
    with pytest.raises(ModelLoadError, match="nested arrays hold more than"):
        Model.load(str(path))
    t0 = time.perf_counter()
    r = llamapy_cmd("run", "-m", str(path), "-p", "hi", timeout=120)
    _one_line_error(r, "evil.nested", "nested arrays")
    assert time.perf_counter() - t0 < 60
