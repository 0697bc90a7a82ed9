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
EMBD_RUNS = [("kimivl", 40, 16), ("minicpmv", 48, 64)]


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


def _read(path: Path) -> tuple[dict, dict]:
    from llamapy.gguf.reader import GGUFReader

    with GGUFReader(path) as r:
        md = {k: f.value for k, f in r.fields.items()}
        types = {k: f.type.name for k, f in r.fields.items()}
        ts = {t.name: np.array(t.array()).reshape(tuple(reversed([int(x) for x in t.ne]))) for t in r}
    return {"md": md, "types": types}, ts


def _edit(src: Path, dst: Path, **kw) -> Path:
    import shutil

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, **kw}))
    return dst


def test_minicpmv_as_the_legacy_converter(vl_dir, tmp_path: Path) -> None:
    """The tensors and keys of minicpmv-surgery + minicpmv-convert-image-encoder-to-gguf (as tests/mtmd's
    TinyMiniCPMV writes them, FFN names unswapped); the version from config.json; proj / scale_emb."""
    d = vl_dir("minicpmv")
    out = tmp_path / "a.gguf"
    convert(d.path, out, "f32", mmproj=True)
    info, got = _read(out)
    want = d.oracle.mm_tensors()
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        if (
            k == "resampler.pos_embed_k"
        ):  # (float32 as the legacy script computes it; the oracle's is float64)
            np.testing.assert_allclose(got[k], w, atol=1e-5)
        else:
            assert np.array_equal(got[k], w), k
    md = info["md"]
    assert md["clip.projector_type"] == "resampler" and md["clip.has_minicpmv_projector"] is True
    assert md["clip.minicpmv_version"] == 3 and info["types"]["clip.minicpmv_version"] == "INT32"
    assert md["clip.minicpmv_query_num"] == 16 and md["clip.vision.image_size"] == 48
    assert list(md["clip.vision.image_mean"]) == [0.5] * 3 and md["clip.use_gelu"] is True

    for ver, arch, want_v in ((2.5, "MiniCPMV", 2), ("4.5", "MiniCPMO", 100045)):
        e = _edit(d.path, tmp_path / f"v{want_v}", version=ver, architectures=[arch], scale_emb=4)
        convert(e, tmp_path / f"v{want_v}.gguf", "f32", mmproj=True)
        info2, got2 = _read(tmp_path / f"v{want_v}.gguf")
        assert info2["md"]["clip.minicpmv_version"] == want_v
        np.testing.assert_array_equal(
            got2["resampler.proj.weight"], want["resampler.proj.weight"] / np.float32(4)
        )


def test_minicpmv_errors(vl_dir, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = vl_dir("minicpmv").path
    out = tmp_path / "out"
    out.mkdir()
    for name, kw, words in (("ver", {"version": 3.0}, "version 3.0"), ("nover", {"version": None}, "None"),
                            ("drop", {"drop_vision_last_layer": True}, "drop_vision_last_layer")):  # fmt: skip
        e = _edit(d, tmp_path / name, **kw)
        assert main(["convert", str(e), "--mmproj", "-o", str(out / "m.gguf"), "-q"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and words in err, err
        assert list(out.iterdir()) == []
