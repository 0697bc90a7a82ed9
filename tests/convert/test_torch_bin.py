"""``llamapy convert`` on PyTorch ``.bin`` checkpoints (llamapy/convert/torch_bin.py): the same file as
llama.cpp's ``convert_hf_to_gguf.py`` writes from them (which reads them with torch), the same tensors as
the safetensors save of the same weights, and hostile or damaged files refused with one error line."""

from __future__ import annotations

import io
import json
import pickle
import shutil
import zipfile
from pathlib import Path

import pytest

from llamapy.cli import main
from llamapy.convert import convert
from tests.convert.bin_dirs import BIN_RUNS, make_bin_run_dir
from tests.convert.expect import EXPECT_DIR, describe, differences
from tests.convert.hf_dirs import CASES, make_hf_dir


@pytest.fixture(scope="session")
def bin_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hfbin")


@pytest.mark.parametrize("run", BIN_RUNS, ids=[r[0] for r in BIN_RUNS])
def test_same_file_as_llama_cpp(bin_root: Path, tmp_path: Path, run: tuple) -> None:
    want = json.loads((EXPECT_DIR / f"{run[0]}.json").read_text())
    out = tmp_path / "out.gguf"
    convert(make_bin_run_dir(run, bin_root), out, run[2])
    got = describe(out)
    diff = differences(got, want)
    assert not diff, "\n".join(diff)
    assert got["file_sha256"] == want["file_sha256"]


@pytest.mark.parametrize("run", [r for r in BIN_RUNS if r[4] == ""], ids=lambda r: r[0])
def test_same_tensors_as_safetensors(bin_root: Path, tmp_path: Path, run: tuple) -> None:
    """Same metadata and the same bytes for every tensor as the safetensors checkpoint; only the order
    differs (llama.cpp lists a .bin's tensors in the state dict's order, a safetensors file's by name)."""
    st_dir = make_hf_dir(CASES[run[1]], bin_root)
    a, b = tmp_path / "bin.gguf", tmp_path / "st.gguf"
    convert(make_bin_run_dir(run, bin_root), a, run[2], model_name="m")
    convert(st_dir, b, run[2], model_name="m")
    da, db = describe(a), describe(b)
    assert da["metadata"] == db["metadata"]
    assert sorted(da["tensors"]) == sorted(db["tensors"])
    assert [t[0] for t in da["tensors"]] != [t[0] for t in db["tensors"]]


def _fails(args: list[str], out_dir: Path, capsys: pytest.CaptureFixture[str]) -> str:
    before = sorted(out_dir.iterdir())
    assert main(["convert", *args, "-q"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert sorted(out_dir.iterdir()) == before, "a file was left behind"
    return err


class _Evil:
    def __init__(self, cmd: str) -> None:
        self.cmd = cmd

    def __reduce__(self):  # noqa: ANN204
        import os

        return (os.system, (self.cmd,))


def _zip_pickle(path: Path, obj: object, extra: dict[str, bytes] | None = None) -> None:
    buf = io.BytesIO()
    pickle.dump(obj, buf, protocol=2)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", buf.getvalue())
        z.writestr("archive/byteorder", b"little")
        for k, v in (extra or {}).items():
            z.writestr(f"archive/{k}", v)


def test_bad_bin_files(bin_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = make_bin_run_dir(BIN_RUNS[0], bin_root)
    out = tmp_path / "out"
    out.mkdir()
    o = str(out / "m.gguf")

    def copy(name: str) -> Path:
        return Path(shutil.copytree(src, tmp_path / name))

    marker = tmp_path / "pwned"
    d = copy("evil")
    _zip_pickle(d / "pytorch_model.bin", {"model.embed_tokens.weight": _Evil(f"touch {marker}")})
    err = _fails([str(d), "-o", o], out, capsys)
    assert "refusing to unpickle" in err and "system" in err, err
    assert not marker.exists()

    d = copy("evil-eval")  # a global named anywhere (builtins.eval), even never called
    _zip_pickle(d / "pytorch_model.bin", {"w": (eval, ("1",))})
    assert "refusing to unpickle" in _fails([str(d), "-o", o], out, capsys)

    # BUILD on the shared storage-type stand-in (it would retype every later load in the process)
    build = b"\x80\x02ctorch\nFloatStorage\n}X\x05\x00\x00\x00dtypeX\x03\x00\x00\x00I64sb."
    d = copy("evil-build")
    with zipfile.ZipFile(d / "pytorch_model.bin", "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", build)
    assert "not a readable state dict" in _fails([str(d), "-o", o], out, capsys)
    from llamapy.convert import torch_bin

    assert torch_bin._GLOBALS[("torch", "FloatStorage")].dtype == "F32"

    d = copy("not-tensors")
    _zip_pickle(d / "pytorch_model.bin", {"model.embed_tokens.weight": [1, 2, 3]})
    assert "not a tensor" in _fails([str(d), "-o", o], out, capsys)

    d = copy("bad-storage")  # a persistent id naming a storage the archive does not hold
    data = (src / "pytorch_model.bin").read_bytes()
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        pkl = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    with zipfile.ZipFile(d / "pytorch_model.bin", "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
    assert "not in the archive" in _fails([str(d), "-o", o], out, capsys)

    d = copy("trunc")
    (d / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    assert "truncated" in _fails([str(d), "-o", o], out, capsys)

    d = copy("trunc-tail")
    (d / "pytorch_model.bin").write_bytes(data[:-10])
    assert "truncated" in _fails([str(d), "-o", o], out, capsys)

    d = copy("legacy")
    (d / "pytorch_model.bin").write_bytes(pickle.dumps(0x1950A86A20F9469CFC6C) + b"\0" * 64)
    assert "legacy" in _fails([str(d), "-o", o], out, capsys)


def test_missing_bin_shard(bin_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = make_bin_run_dir(BIN_RUNS[1], bin_root)
    out = tmp_path / "out"
    out.mkdir()
    d = Path(shutil.copytree(src, tmp_path / "shard"))
    (d / "pytorch_model-00002-of-00002.bin").unlink()
    err = _fails([str(d), "-o", str(out / "m.gguf")], out, capsys)
    assert "missing model shard" in err and "pytorch_model.bin.index.json" in err


def test_lora_adapter_bin_same_file_as_llama_cpp(bin_root: Path, tmp_path: Path) -> None:
    """A PEFT adapter saved as ``adapter_model.bin`` (its tensors in the safetensors file's order, which
    convert_lora_to_gguf.py keeps) converts to the file llama.cpp wrote from the safetensors adapter."""
    import torch
    from safetensors.torch import load_file

    from tests.convert.hf_dirs import make_lora_dir

    want = json.loads((EXPECT_DIR / "lora-llama-q8_0.json").read_text())
    base = make_hf_dir(CASES["llama"], bin_root)
    ld = Path(shutil.copytree(make_lora_dir(base, bin_root, "lora-llama"), tmp_path / "lora-llama"))
    torch.save(load_file(ld / "adapter_model.safetensors"), ld / "adapter_model.bin")
    (ld / "adapter_model.safetensors").unlink()
    out = tmp_path / "lora.gguf"
    assert main(["convert", str(ld), "--base", str(base), "-o", str(out), "--outtype", "q8_0", "-q"]) == 0
    got = describe(out)
    diff = differences(got, want)
    assert not diff, "\n".join(diff)
    assert got["file_sha256"] == want["file_sha256"]
