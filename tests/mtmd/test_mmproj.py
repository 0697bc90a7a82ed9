"""Strict mmproj loading: every bad file is refused with a message naming the file and what is wrong."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llamapy.ggml.types import GGMLType
from llamapy.model.model import Model
from llamapy.mtmd import ClipModel, MtmdContext, MtmdError
from tests.model import hf_tiny
from tests.mtmd import convert


def _write(
    vlm: convert.TinyVLM, tmp: Path, md_edit: dict | None = None, drop: str = "", **tensors: np.ndarray
) -> Path:
    md = convert.mmproj_metadata(vlm.cfg, GGMLType.F32)
    for k, v in (md_edit or {}).items():
        if v is None:
            md.pop(k)
        else:
            md[k] = v
    ts = convert.mmproj_tensors(vlm.state)
    ts.pop(drop, None)
    ts.update({k.replace("__", "."): v for k, v in tensors.items()})
    return convert.write_mmproj(tmp / "bad-mmproj.gguf", md, ts, GGMLType.F32)


def test_missing_and_bad_keys(gemma3_vlm: convert.TinyVLM, tmp_path: Path) -> None:
    with pytest.raises(MtmdError, match="'clip.vision.patch_size' is missing"):
        ClipModel(_write(gemma3_vlm, tmp_path, {"clip.vision.patch_size": None}))
    with pytest.raises(MtmdError, match="'clip.vision.image_mean' is missing"):
        ClipModel(_write(gemma3_vlm, tmp_path, {"clip.vision.image_mean": None}))
    with pytest.raises(MtmdError, match="projector type 'nope' is not supported"):
        ClipModel(_write(gemma3_vlm, tmp_path, {"clip.projector_type": "nope"}))
    with pytest.raises(MtmdError, match="no vision encoder"):
        ClipModel(_write(gemma3_vlm, tmp_path, {"clip.has_vision_encoder": False}))
    with pytest.raises(MtmdError, match="expected an integer"):
        ClipModel(_write(gemma3_vlm, tmp_path, {"clip.vision.block_count": "two"}))
    with pytest.raises(MtmdError, match="cannot be pooled"):
        ClipModel(_write(gemma3_vlm, tmp_path, {"clip.vision.projector.scale_factor": 3}))


def test_bad_tensors(gemma3_vlm: convert.TinyVLM, tmp_path: Path) -> None:
    with pytest.raises(MtmdError, match="'v.blk.1.ffn_up.weight' is missing"):
        ClipModel(_write(gemma3_vlm, tmp_path, drop="v.blk.1.ffn_up.weight"))
    with pytest.raises(MtmdError, match="'v.position_embd.weight' has wrong shape"):
        ClipModel(_write(gemma3_vlm, tmp_path, v__position_embd__weight=np.zeros((63, 32), np.float32)))
    with pytest.raises(MtmdError, match="not used"):
        ClipModel(_write(gemma3_vlm, tmp_path, v__extra__weight=np.zeros((4, 4), np.float32)))


def test_not_an_mmproj(gemma3_vlm: convert.TinyVLM, tmp_path: Path) -> None:
    with pytest.raises(MtmdError, match="not an mmproj file"):
        ClipModel(gemma3_vlm.text_gguf())
    with pytest.raises(MtmdError, match="not found"):
        MtmdContext(tmp_path / "nothing.gguf", Model.load(gemma3_vlm.text_gguf()))
    (tmp_path / "junk.gguf").write_bytes(b"GGUF" + b"\0" * 7)
    with pytest.raises(MtmdError, match="cannot load mmproj"):
        ClipModel(tmp_path / "junk.gguf")


def test_mmproj_for_another_model(gemma3_vlm: convert.TinyVLM, tmp_path: Path) -> None:
    text = Model.load(gemma3_vlm.text_gguf())
    wide = _write(
        gemma3_vlm, tmp_path, {"clip.vision.projection_dim": 48},
        mm__input_projection__weight=np.zeros((32, 48), np.float32),
    )  # fmt: skip
    with pytest.raises(MtmdError, match="embeddings of 48 values but the text model.*takes 64"):
        MtmdContext(wide, text)
    # the right width but no <start_of_image> in the vocabulary (SmolVLM's text model)
    smol = Model.load(convert.make_idefics3(tmp_path).text_gguf())
    with pytest.raises(MtmdError, match="needs the token '<start_of_image>'"):
        MtmdContext(gemma3_vlm.mmproj_gguf(), smol)
    tiny = hf_tiny.make_tiny(hf_tiny.FAMILIES["gemma3"], tmp_path)  # no vocabulary at all
    with pytest.raises(MtmdError, match="no vocabulary"):
        MtmdContext(gemma3_vlm.mmproj_gguf(), Model.load(tiny.write(GGMLType.F32)))
