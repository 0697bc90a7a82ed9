"""``llamapy convert --mmproj`` for Kimi-VL and MiniCPM-V 2.x (``llamapy/convert/mmproj_vl.py``) on tiny
checkpoints in the Hub's remote-code layout (``mm_dirs_vl``): the file llama.cpp's converter writes where it
converts the model (``tests/data/convert/mmproj-*.json``), and llamapy's mtmd on the converted F32 file gives
the oracle's image embeddings (the oracles of ``tests/mtmd``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llamapy.cli import main
from llamapy.convert import convert
from tests.convert.expect import EXPECT_DIR, describe, differences
from tests.convert.mm_dirs_vl import VL_RUNS, VlDir, make_vl_dir

torch = pytest.importorskip("torch")

TOL = 1e-3  # max |ours - oracle| / max |oracle|, as tests/mtmd
RNG = np.random.default_rng(12)
_DIRS: dict[str, VlDir] = {}


@pytest.fixture(scope="session")
def vl_dir(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("mmvl")

    def get(name: str) -> VlDir:
        if name not in _DIRS:
            _DIRS[name] = make_vl_dir(name, root)
        return _DIRS[name]

    return get


@pytest.mark.parametrize(("case", "outtype"), VL_RUNS, ids=[f"{c}-{t}" for c, t in VL_RUNS])
def test_same_file_as_llama_cpp(vl_dir, tmp_path: Path, case: str, outtype: str) -> None:
    want = json.loads((EXPECT_DIR / f"mmproj-{case}-{outtype}.json").read_text())
    out = tmp_path / "mmproj.gguf"
    assert (
        main(["convert", str(vl_dir(case).path), "--mmproj", "-o", str(out), "--outtype", outtype, "-q"]) == 0
    )
    got = describe(out)
    diff = differences(got, want)
    assert not diff, "\n".join(diff)
    assert got["file_sha256"] == want["file_sha256"]


# (case, image height, width): sizes the tower takes whole
EMBD_RUNS = [("kimivl", 24, 24), ("kimivl", 40, 16)]


@pytest.mark.parametrize(("case", "h", "w"), EMBD_RUNS, ids=[f"{c}-{h}x{w}" for c, h, w in EMBD_RUNS])
def test_image_embeddings_match_the_oracle(vl_dir, tmp_path: Path, case: str, h: int, w: int) -> None:
    from llamapy.mtmd import ClipModel

    d = vl_dir(case)
    out = tmp_path / "mmproj-f32.gguf"
    convert(d.path, out, "f32", mmproj=True)
    px = RNG.uniform(-1, 1, (3, h, w)).astype(np.float32)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = d.features(px)
    finally:
        torch.set_num_threads(n)
    got = np.asarray(ClipModel(out).encode(px), dtype=np.float32)
    assert got.shape == ref.shape
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    assert err < TOL, f"{case}: max |diff| / max |oracle| = {err:.2e}"
