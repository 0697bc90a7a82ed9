"""``llamapy convert --mmproj`` on tiny vision-language checkpoints (``mm_dirs``):

- the file equals what llama.cpp's ``convert_hf_to_gguf.py --mmproj`` writes from the same directory
  (its sha256, else the key/tensor differences; ``tests/data/convert/mmproj-*.json``, ``expect.py``);
- llamapy's mtmd loads the converted F32 mmproj and its image embeddings match transformers';
- bad input: ``error: ...``, exit 1, nothing left behind.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from llamapy.cli import main
from llamapy.convert import convert
from tests.convert.expect import EXPECT_DIR, MM_RUNS, describe, differences
from tests.convert.mm_dirs import MM_CASES, MmDir, make_mm_dir

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-3  # max |ours - hf| / max |hf|, as tests/mtmd's projector tests
RNG = np.random.default_rng(11)


@pytest.fixture(scope="session")
def mm_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mm")


_DIRS: dict[str, MmDir] = {}


@pytest.fixture(scope="session")
def mm_dir(mm_root: Path):
    def get(name: str) -> MmDir:
        if name not in _DIRS:
            _DIRS[name] = make_mm_dir(MM_CASES[name], mm_root)
        return _DIRS[name]

    return get


@pytest.mark.parametrize(("case", "outtype"), MM_RUNS, ids=[f"{c}-{t}" for c, t in MM_RUNS])
def test_same_file_as_llama_cpp(mm_dir, tmp_path: Path, case: str, outtype: str) -> None:
    want = json.loads((EXPECT_DIR / f"mmproj-{case}-{outtype}.json").read_text())
    out = tmp_path / "mmproj.gguf"
    assert (
        main(["convert", str(mm_dir(case).path), "--mmproj", "-o", str(out), "--outtype", outtype, "-q"]) == 0
    )
    got = describe(out)
    if case == "mistral3":
        # one tensor more than llama.cpp's: the [IMG_BREAK] embedding its LlavaVisionModel means to copy (and its
        # clip.cpp requires) but no longer sees, its language_model.* filter dropping the embeddings first
        brk = next(t for t in got["tensors"] if t[0] == "v.token_embd.img_break")
        assert brk[1:3] == [[64], "F32"]
        got["tensors"].remove(brk)
        del got["metadata"]["general.size_label"], want["metadata"]["general.size_label"]  # 48K, 47K
        got["file_sha256"] = want["file_sha256"]  # (so the bytes cannot equal)
    if case == "llama4":  # the FFN's pre-norm as ln2, where gguf-py's map collision makes it attn_post_norm
        names = [t[0] for t in got["tensors"]]
        assert "v.blk.0.ln2.weight" in names and not any("attn_post_norm" in n for n in names)
        for t in got["tensors"]:
            t[0] = re.sub(r"^(v\.blk\.\d+)\.ln2\.", r"\1.attn_post_norm.", t[0])
        got["file_sha256"] = want["file_sha256"]  # (names of other lengths: the offsets differ)
    diff = differences(got, want)
    assert not diff, "\n".join(diff)
    assert got["file_sha256"] == want["file_sha256"]


# (case, image height, width): sizes the projector takes whole (no resize in the comparison)
EMBD_RUNS = [("gemma3", 64, 64), ("idefics3", 64, 64), ("qwen2.5vl", 64, 96), ("qwen2vl", 32, 64), ("qwen3vl", 48, 64), ("glm4v", 32, 48), ("llama4", 32, 32),
             ("mistral3", 48, 64), ("lfm2vl", 64, 64), ("llava15", 32, 32), ("internvl", 32, 32),
             ("minicpmv4_6", 48, 64), ("kimik25", 40, 16)]  # fmt: skip


@pytest.mark.parametrize(("case", "h", "w"), EMBD_RUNS, ids=[r[0] for r in EMBD_RUNS])
def test_image_embeddings_match_transformers(mm_dir, tmp_path: Path, case: str, h: int, w: int) -> None:
    from llamapy.mtmd import ClipModel

    md = mm_dir(case)
    out = tmp_path / "mmproj-f32.gguf"
    convert(md.path, out, "f32", mmproj=True)
    px = RNG.uniform(-1, 1, (3, h, w)).astype(np.float32)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = md.features(px)
    finally:
        torch.set_num_threads(n)
    got = np.asarray(ClipModel(out).encode(px), dtype=np.float32)
    assert got.shape == ref.shape
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    assert err < TOL, f"{case}: max |diff| / max |hf| = {err:.2e}"


@pytest.mark.parametrize(("case", "n_mel"), [("qwen2audio", 80), ("voxtral", 128), ("ultravox", 80)])
def test_audio_embeddings_match_transformers(mm_dir, tmp_path: Path, case: str, n_mel: int) -> None:
    from llamapy.mtmd.audio_encoder import AudioModel

    md = mm_dir(case)
    out = tmp_path / "mmproj-f32.gguf"
    convert(md.path, out, "f32", mmproj=True)
    mel = RNG.uniform(-1, 1, (n_mel, 3000)).astype(np.float32)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = md.features(mel)
    finally:
        torch.set_num_threads(n)
    am = AudioModel(out)
    assert (
        am.hparams.projector_type
        == {"qwen2audio": "qwen2a", "voxtral": "voxtral", "ultravox": "ultravox"}[case]
    )
    got = np.asarray(am.encode(mel), dtype=np.float32)
    assert got.shape == ref.shape
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    assert err < TOL, f"{case}: max |diff| / max |hf| = {err:.2e}"


def test_llava15_written_as_the_legacy_mlp_projector(mm_dir, tmp_path: Path) -> None:
    """LLaVA 1.5 (a CLIP tower): a deliberate difference, llama.cpp's convert_hf_to_gguf.py refuses it (its
    LlavaVisionModel is Pixtral's: "Unsupported model type: clip_vision_model"); llama.cpp's own path is
    llava_surgery + convert_image_encoder_to_gguf.py, projector type ``mlp``, which is what this writes."""
    from llamapy.gguf.reader import GGUFReader

    out = tmp_path / "mmproj.gguf"
    assert (
        main(["convert", str(mm_dir("llava15").path), "--mmproj", "-o", str(out), "--outtype", "f16", "-q"])
        == 0
    )
    with GGUFReader(out) as r:
        md = {k: f.value for k, f in r.fields.items()}
        tensors = {t.name: (list(t.ne), t.ggml_type.name) for t in r}
    assert md["clip.projector_type"] == "mlp" and md["clip.vision.block_count"] == 3
    assert "clip.use_gelu" not in md and "clip.vision.feature_layer" not in md  # quick GELU, layer -2
    assert tensors["v.class_embd"] == ([32], "F32") and tensors["v.patch_embd.weight"] == (
        [8, 8, 3, 32],
        "F16",
    )
    assert tensors["mm.0.weight"] == ([32, 64], "F16") and tensors["mm.2.weight"] == ([64, 64], "F16")
    assert {"v.pre_ln.weight", "v.blk.2.ffn_down.weight", "mm.2.bias"} <= set(tensors)
    assert not any(n.startswith("v.post_ln") for n in tensors)  # (above the feature layer)
    assert len(tensors) == 5 + 3 * 16 + 4  # class, patch, position, pre-norm; 3 blocks; the projector


def test_internvl_by_either_architecture_name(mm_dir, tmp_path: Path) -> None:
    """transformers' InternVLForConditionalGeneration (no vision_config.architectures, which llama.cpp's converter
    needs) converts to the same file as the Hub's InternVisionModel config."""
    src = mm_dir("internvl").path
    d = shutil.copytree(src, tmp_path / "hf")
    cfg = json.loads((d / "config.json").read_text())
    del cfg["vision_config"]["architectures"]
    (d / "config.json").write_text(json.dumps(cfg))
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    convert(src, a, "f16", mmproj=True, model_name="x")
    convert(d, b, "f16", mmproj=True, model_name="x")
    assert a.read_bytes() == b.read_bytes()


_INTERNVIT = {"attention.projection_layer": "attn.proj", "layernorm_before": "norm1", "layernorm_after": "norm2",
              "lambda_1": "ls1", "lambda_2": "ls2", "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}  # fmt: skip


def _opengvlab_names(sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The tiny InternVL in the layout of OpenGVLab's own checkpoints (InternVL2.5 / 3: remote code): fused qkv,
    ``vision_model.`` and ``mlp1.N``."""
    out: dict[str, np.ndarray] = {}
    vt, emb = "model.vision_tower.", "vision_model.embeddings."
    fixed = {vt + "embeddings.cls_token": emb + "class_embedding", vt + "embeddings.position_embeddings":
             emb + "position_embedding", **{f"model.multi_modal_projector.{a}.{k}": f"mlp1.{i}.{k}" for a, i in
             (("layer_norm", 0), ("linear_1", 1), ("linear_2", 3)) for k in ("weight", "bias")}}  # fmt: skip
    for name, v in sd.items():
        if name in fixed:
            out[fixed[name]] = v
        elif name.startswith(vt + "embeddings.patch_embeddings.projection."):
            out[emb + "patch_embedding." + name.rsplit(".", 1)[1]] = v
        elif name.startswith(vt + "encoder.layer."):
            il, rest = name[len(vt + "encoder.layer.") :].split(".", 1)
            pre = f"vision_model.encoder.layers.{il}."
            if rest.startswith("attention.q_proj."):
                kind = rest.rsplit(".", 1)[1]
                qkv = [sd[f"{vt}encoder.layer.{il}.attention.{x}_proj.{kind}"] for x in "qkv"]
                out[pre + "attn.qkv." + kind] = np.concatenate(qkv)
            elif not rest.startswith(("attention.k_proj.", "attention.v_proj.")):
                mod, _, kind = rest.rpartition(".") if "." in rest else (rest, "", "")
                out[pre + _INTERNVIT[mod] + ("." + kind if kind else "")] = v
        else:
            out[name] = v
    return out


def test_internvl_from_the_opengvlab_layout(mm_dir, tmp_path: Path) -> None:
    """OpenGVLab's layout (InternVLChatModel, fused qkv, vision_model. / mlp1.) gives the keys and tensors of
    transformers' (which are llama.cpp's file, test_same_file_as_llama_cpp)."""
    from safetensors.numpy import load_file, save_file

    src = mm_dir("internvl").path
    d = shutil.copytree(src, tmp_path / "ogvl")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "architectures": ["InternVLChatModel"]}))
    sd = _opengvlab_names(load_file(str(d / "model.safetensors")))
    assert not any(k.startswith("model.vision_tower") for k in sd)
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    convert(src, a, "f16", mmproj=True, model_name="x")
    convert(d, b, "f16", mmproj=True, model_name="x")
    want, got = describe(a), describe(b)
    assert got["metadata"] == want["metadata"] and sorted(got["tensors"]) == sorted(want["tensors"])


def test_kimik25_from_the_transformers_layout(mm_dir, tmp_path: Path) -> None:
    """transformers' own save of Kimi_K25ForConditionalGeneration (its architecture name and pos_emb_* keys, and
    two names its reverse renames leave apart from the Hub's) converts to the same keys and tensors as the Hub's
    layout."""
    from safetensors.numpy import load_file, save_file

    src = mm_dir("kimik25").path
    d = shutil.copytree(src, tmp_path / "hf")
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["Kimi_K25ForConditionalGeneration"]
    for k in ("init_pos_emb_height", "init_pos_emb_width", "init_pos_emb_time", "projector_hidden_act",
              "projector_ln_eps"):  # fmt: skip
        del cfg["vision_config"][k]
    (d / "config.json").write_text(json.dumps(cfg))
    sd = load_file(str(d / "model.safetensors"))
    ren = {"mm_projector.pre_norm.": "model.mm_projector.pre_norm.", "vision_tower.patch_embed.proj.":
           "vision_tower.encoder.patch_embed.proj."}  # fmt: skip
    sd = {
        next((new + k[len(old) :] for old, new in ren.items() if k.startswith(old)), k): v
        for k, v in sd.items()
    }
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    convert(src, a, "f16", mmproj=True, model_name="x")
    convert(d, b, "f16", mmproj=True, model_name="x")
    want, got = describe(a), describe(b)  # (the tensors in the order of their HF names)
    assert got["metadata"] == want["metadata"] and sorted(got["tensors"]) == sorted(want["tensors"])


def _edit_config(src: Path, dst: Path, edit) -> Path:
    d = shutil.copytree(src, dst)
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_errors_of_the_newer_projectors(mm_dir, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    o = str(out / "mm.gguf")
    for case in ("internvl", "llava15", "ultravox", "kimik25", "minicpmv4_6"):
        mm_dir(case)
    capsys.readouterr()  # (save_pretrained's progress bars)
    cases = [
        ("internvl", lambda c: c.pop("downsample_ratio"), "downsample_ratio"),
        ("internvl", lambda c: c["vision_config"].update(hidden_act="relu"), "'relu'"),
        (
            "llava15",
            lambda c: c.update(vision_feature_select_strategy="full"),
            "vision_feature_select_strategy",
        ),
        ("llava15", lambda c: c.update(vision_feature_layer=-9), "vision_feature_layer"),
        ("ultravox", lambda c: c.pop("stack_factor"), "stack_factor"),
        ("kimik25", lambda c: c["vision_config"].update(num_attention_heads=3), "qkv rows"),
    ]
    for i, (case, edit, want) in enumerate(cases):
        d = _edit_config(mm_dir(case).path, tmp_path / f"{case}-{i}", edit)
        err = _fails([str(d), "-o", o], out, capsys)
        assert want in err, err
    d = shutil.copytree(mm_dir("minicpmv4_6").path, tmp_path / "minicpm")
    (d / "preprocessor_config.json").write_text(json.dumps({"image_mean": [0.5] * 3, "image_std": [0.5] * 3,
                                                            "downsample_mode": "8x"}))  # fmt: skip
    assert "downsample_mode" in _fails([str(d), "-o", o], out, capsys)


def test_default_name_and_dry_run(mm_dir, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = mm_dir("gemma3").path
    assert main(["convert", str(d), "--mmproj", "-o", str(tmp_path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "v.blk.0.attn_q.weight" in out and "mm.input_projection.weight" in out
    assert f"would write {tmp_path}/mmproj-" in out and out.rstrip().endswith("MiB of tensor data")
    assert list(tmp_path.iterdir()) == []


def _fails(args: list[str], out_dir: Path, capsys: pytest.CaptureFixture[str]) -> str:
    before = sorted(out_dir.iterdir())
    assert main(["convert", *args, "--mmproj", "-q"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert sorted(out_dir.iterdir()) == before, "a file was left behind"
    return err


def test_errors(mm_dir, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = mm_dir("qwen2.5vl").path
    capsys.readouterr()  # (save_pretrained's progress bar)
    out = tmp_path / "out"
    out.mkdir()
    o = str(out / "mm.gguf")

    d = shutil.copytree(src, tmp_path / "arch")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "architectures": ["FancyVLForConditionalGeneration"]}))
    assert "'FancyVLForConditionalGeneration'" in _fails([str(d), "-o", o], out, capsys)

    d = shutil.copytree(src, tmp_path / "novision")
    (d / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "vision_config"}))
    assert "vision_config" in _fails([str(d), "-o", o], out, capsys)

    d = shutil.copytree(src, tmp_path / "nopre")
    (d / "preprocessor_config.json").unlink()
    assert "image_mean" in _fails([str(d), "-o", o], out, capsys)

    d = shutil.copytree(src, tmp_path / "depth")
    (d / "config.json").write_text(json.dumps({**cfg, "vision_config": {**cfg["vision_config"], "depth": 1}}))
    assert "config.json says 1 layers" in _fails([str(d), "-o", o], out, capsys)

    d = shutil.copytree(src, tmp_path / "trunc")
    st = d / "model.safetensors"
    st.write_bytes(st.read_bytes()[:-1000])
    assert "truncated" in _fails([str(d), "-o", o], out, capsys)

    assert "q4_k_m" in _fails([str(src), "-o", o, "--outtype", "q4_k_m"], out, capsys)
    (out / "mm.gguf").write_bytes(b"keep")
    assert "--force" in _fails([str(src), "-o", o], out, capsys)
    assert (out / "mm.gguf").read_bytes() == b"keep"
