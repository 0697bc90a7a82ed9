"""``llamapy quantize`` / ``llamapy.quantize.quantize_file``: llama-quantize's per-tensor types and bytes.

The oracle is llama.cpp's ``llama-quantize``: tests/data/quantize/<model>.json holds, for each mix
(without and with the synthetic imatrix of tests/quantize/models.py), the type and the sha256 (first
16 hex digits) of every tensor of its output, made once by ``benchmarks/bench_quantize.py
--write-expectations``. CI compares with these stored tables (no llama.cpp needed); the benchmark
compares live when llama.cpp is built. Measured there (all 3 models x 34 mixes x with/without imatrix):
the same type and the same bytes for every tensor everywhere (IQ2_XXS differed in 0.3-2 % of its blocks
until make_qp_quants kept C's uint8 wrap of a negative level; the sample below includes it).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from llamapy.cli import main as cli_main
from llamapy.ggml.types import GGMLType
from llamapy.gguf.reader import GGUFReader
from llamapy.quantize import QuantizeError, parse_ftype, quantize_file
from tests.quantize.models import MODELS, write_imatrix, write_model

EXPECT = Path(__file__).resolve().parents[1] / "data" / "quantize"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("quantize")
    out: dict[str, Path] = {}
    for m in MODELS:
        out[m] = write_model(m, d / f"{m}.gguf")
        out[m + "-imatrix"] = write_imatrix(m, d / f"{m}-imatrix.gguf")
    return out


def _expect(model: str) -> dict:
    return json.loads((EXPECT / f"{model}.json").read_text())


def _table(path: Path) -> dict[str, tuple[str, str]]:
    with GGUFReader(path) as r:
        return {
            t.name: (t.ggml_type.name, hashlib.sha256(t.data.tobytes()).hexdigest()[:16]) for t in r.tensors
        }


# ---------------------------------------------------------------------------------------------
# the per-tensor types of every mix equal llama-quantize's (dry run: the rules alone)


@pytest.mark.parametrize("model", list(MODELS))
def test_types_of_every_mix_match_llama_quantize(files, model):
    exp = _expect(model)
    names = exp["names"]
    checked = 0
    for key, run in exp["runs"].items():
        mix, _, im = key.partition("+")
        imatrix = files[model + "-imatrix"] if im else None
        if "error" in run:  # llama-quantize refused (IQ1/IQ2 without an imatrix): so do we
            with pytest.raises(QuantizeError, match="importance matrix"):
                quantize_file(files[model], files[model].with_suffix(".x"), mix, imatrix=imatrix)
            continue
        res = quantize_file(files[model], None, mix, imatrix=imatrix, dry_run=True)
        got = res.types()
        assert list(got) == names, f"{key}: tensor order differs from llama-quantize's"
        diff = [(n, t, got[n]) for n, t in zip(names, run["types"], strict=True) if got[n] != t]
        assert not diff, f"{model} {key}: {len(diff)} tensors differ, first {diff[:3]}"
        checked += 1
    assert checked >= 50  # every mix, without and with an imatrix (less the refusals without one)


# ---------------------------------------------------------------------------------------------
# the bytes equal llama-quantize's (a sample of the runs; benchmarks/bench_quantize.py runs them all)

BYTE_RUNS = [
    ("tied8", "Q4_K_M"),
    ("tied8", "IQ3_XS+imatrix"),  # IQ3_XXS / IQ3_S / IQ2_S rows
    ("tied8", "IQ2_XXS+imatrix"),  # make_qp_quants' uint8 L (a parity-flipped xval < 0 kept as 255)
    ("dense16", "IQ1_M+imatrix"),  # IQ1_M, IQ2_XXS (attn_v, ...) and Q2_K rows
    ("tied8", "TQ1_0"),
    ("tied8", "BF16"),
    ("dense16", "Q4_0+imatrix"),
    ("dense16", "Q6_K"),
    ("moe8", "MXFP4_MOE"),
]


@pytest.mark.parametrize("model,key", BYTE_RUNS)
def test_bytes_match_llama_quantize(files, tmp_path, model, key):
    exp = _expect(model)
    run = exp["runs"][key]
    mix, _, im = key.partition("+")
    out = tmp_path / "out.gguf"
    quantize_file(files[model], out, mix, imatrix=files[model + "-imatrix"] if im else None, nthreads=2)
    got = _table(out)
    assert list(got) == exp["names"]
    diff = [n for n, t, h in zip(exp["names"], run["types"], run["sha256"], strict=True) if got[n] != (t, h)]
    assert not diff, f"{model} {key}: {len(diff)} tensors differ from llama-quantize's bytes: {diff[:4]}"


# ---------------------------------------------------------------------------------------------
# the file: metadata as llama-quantize writes it, loadable and usable


def test_output_metadata_and_model_runs(files, tmp_path):
    out = tmp_path / "q8.gguf"
    quantize_file(files["tied8"], out, "Q8_0", override_kv=["general.name=str:renamed", "llama.x=int:-7"])
    with GGUFReader(out) as r:
        keys = list(r.fields)
        assert r.get("general.file_type") == 7 and r.get("general.quantization_version") == 2
        assert r.get("general.name") == "renamed" and r.get("llama.x") == 7
        # set keys move to the end, in llama-quantize's order
        assert keys[-4:] == ["general.quantization_version", "general.file_type", "general.name", "llama.x"]
    from llamapy.model import Model

    m = Model.load(out)
    assert m.hparams.n_layer == MODELS["tied8"][0]


def test_tensor_type_overrides_and_flags(files):
    res = quantize_file(
        files["dense16"],
        None,
        "Q4_K_M",
        dry_run=True,
        tensor_types=[("attn_q", "q8_0"), (r"blk\.1\.ffn_up", "iq4_nl")],
        output_tensor_type="f16",
        token_embedding_type="q5_0",
    )
    t = res.types()
    assert t["blk.3.attn_q.weight"] == "Q8_0" and t["blk.1.ffn_up.weight"] == "IQ4_NL"
    assert t["blk.2.ffn_up.weight"] == "Q4_K"
    assert t["output.weight"] == "F16" and t["token_embd.weight"] == "Q5_0"
    pure = quantize_file(files["dense16"], None, "Q4_K_M", dry_run=True, pure=True).types()
    assert pure["blk.0.attn_v.weight"] == "Q4_K" and pure["output.weight"] == "Q4_K"
    assert pure["blk.0.ffn_down.weight"] == "Q5_0"  # rows of 320: the Q4_K fallback
    left = quantize_file(files["dense16"], None, "Q4_0", dry_run=True, leave_output_tensor=True).types()
    assert left["output.weight"] == "F32"
    copy = quantize_file(files["dense16"], None, "COPY", dry_run=True).types()
    assert set(copy.values()) == {"F32"}


def test_aliases_and_numbers():
    assert parse_ftype("q4_k").name == "Q4_K_M" and parse_ftype("15").name == "Q4_K_M"
    assert parse_ftype("0").name == "F32" and parse_ftype("copy").name == "COPY"
    with pytest.raises(QuantizeError, match="unknown quantization type"):
        parse_ftype("Q9_K")


# ---------------------------------------------------------------------------------------------
# bad input: `error: ...`, exit 1, no output file


def _cli(capsys, *args: str | Path) -> tuple[int, str]:
    rc = cli_main(["quantize", *map(str, args)])
    return rc, capsys.readouterr().err


def test_cli_errors_leave_no_file(files, tmp_path, capsys):
    out = tmp_path / "out.gguf"
    for args, msg in [
        ((files["tied8"], out, "Q9_K"), "unknown quantization type"),
        ((files["tied8"], out, "IQ2_XS"), "requires an importance matrix"),
        ((files["tied8"], out, "IQ1_S"), "requires an importance matrix"),
        (("--tensor-type", "attn_q=q9", files["tied8"], out, "Q4_0"), "unknown tensor type"),
        (("--imatrix", tmp_path / "none.dat", files["tied8"], out, "Q4_0"), "cannot read the imatrix"),
        ((tmp_path / "missing.gguf", out, "Q4_0"), "missing.gguf"),
        ((files["tied8-imatrix"].with_suffix(".txt"), out, "Q4_0"), ""),
    ]:
        rc, err = _cli(capsys, *args)
        assert rc == 1 and err.strip().splitlines()[-1].startswith("error:") and msg in err, (args, err)
        assert not out.exists() and not list(tmp_path.glob("*.tmp.*"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 40)
    rc, err = _cli(capsys, bad, out, "Q4_0")
    assert rc == 1 and "error:" in err and not out.exists()
    # an imatrix of the wrong size fails in the middle of writing: the partial file is removed
    from llamapy.quantize import Imatrix, ImatrixEntry, save_imatrix

    wrong = tmp_path / "wrong.gguf"
    save_imatrix(Imatrix({"blk.3.attn_q.weight": ImatrixEntry(np.ones(128, np.float32), np.ones(1))}), wrong)
    rc, err = _cli(capsys, "-q", "--imatrix", wrong, files["tied8"], out, "Q4_0")
    assert rc == 1 and "imatrix size 128 is different from tensor size 256" in err
    assert not out.exists() and not list(tmp_path.glob("*.tmp.*"))
    # an existing output needs --force; input == output never
    out.write_bytes(b"keep")
    rc, err = _cli(capsys, files["tied8"], out, "Q8_0")
    assert rc == 1 and "--force" in err and out.read_bytes() == b"keep"
    rc, err = _cli(capsys, files["tied8"], files["tied8"], "Q8_0", "--force")
    assert rc == 1 and "the same" in err
    rc, err = _cli(capsys, "--force", "-q", files["tied8"], out, "Q8_0")
    assert rc == 0 and out.stat().st_size > 4


def test_cli_requantize_needs_flag_and_progress(files, tmp_path, capsys):
    q = tmp_path / "q8.gguf"
    rc, err = _cli(capsys, files["moe8"], q, "Q8_0", "2")
    assert rc == 0 and "[   1/" in err and "converting to q8_0" in err
    rc, err = _cli(capsys, q, tmp_path / "q4.gguf", "Q4_0")
    assert (
        rc == 1 and "requantizing from type Q8_0 is disabled" in err and not (tmp_path / "q4.gguf").exists()
    )
    rc, err = _cli(capsys, "--allow-requantize", "-q", q, tmp_path / "q4.gguf", "Q4_0")
    assert rc == 0
    with GGUFReader(tmp_path / "q4.gguf") as r:
        assert r.tensor_index["blk.0.attn_q.weight"].ggml_type == GGMLType.Q4_0


def test_dry_run_writes_nothing_and_keep_split(files, tmp_path, capsys):
    rc, err = _cli(capsys, "--dry-run", files["dense16"], "IQ2_XXS")
    assert rc == 0 and "will require an imatrix" in err and "quant size" in err
    from llamapy.gguf.split import open_model
    from llamapy.gguf.writer import GGUFWriter

    # a 2-way split input keeps its shards with --keep-split
    with GGUFReader(files["tied8"]) as r:
        halves = [r.tensors[: len(r.tensors) // 2], r.tensors[len(r.tensors) // 2 :]]
        for i, part in enumerate(halves):
            w = GGUFWriter(tmp_path / f"m-{i + 1:05d}-of-00002.gguf")
            if i == 0:
                for k, f in r.fields.items():
                    w.add_key_value_raw(k, f.type, r.raw_value(k))
            w.add_key_value("split.no", i, _u16())
            w.add_key_value("split.count", 2, _u16())
            w.add_key_value("split.tensors.count", len(r.tensors), _i32())
            for t in part:
                w.add_tensor(t.name, t.data, ggml_type=t.ggml_type, raw_shape=t.shape)
            w.write()
    rc, err = _cli(
        capsys, "-q", "--keep-split", tmp_path / "m-00001-of-00002.gguf", tmp_path / "o.gguf", "Q8_0"
    )
    assert rc == 0, err
    with open_model(tmp_path / "o-00001-of-00002.gguf") as m:
        assert len(m.readers) == 2 and len(m.tensors) == sum(map(len, halves))


def _u16():
    from llamapy.gguf.constants import GGUFValueType

    return GGUFValueType.UINT16


def _i32():
    from llamapy.gguf.constants import GGUFValueType

    return GGUFValueType.INT32


def test_cli_subprocess_exit_status(files, tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "llamapy", "quantize", str(files["tied8"]), str(tmp_path / "o.gguf"), "nope"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "LLAMAPY_FULL_EXIT": "1"},
        timeout=120,
    )
    assert p.returncode == 1 and p.stderr.strip().splitlines()[-1].startswith(
        "error: unknown quantization type"
    )
