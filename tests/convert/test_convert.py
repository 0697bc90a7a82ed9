"""``llamapy convert`` on tiny random-weight checkpoints (``hf_dirs``):

- the file equals what llama.cpp's ``convert_hf_to_gguf.py`` writes from the same directory (its sha256,
  else the key/tensor differences), from the expectations in ``tests/data/convert`` (``expect.py``);
- llamapy runs the converted file with transformers' logits;
- ``--outtype q4_k_m`` equals convert then ``llamapy quantize``; ``--split-max-size``, ``--dry-run``,
  ``--model-name``, ``--metadata``;
- bad input: ``error: ...``, exit 1, nothing left in the output directory.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from llamapy.cli import main
from llamapy.convert import ConvertError, convert
from tests.convert.expect import EXPECT_DIR, LORA_RUNS, RUNS, ULP_TENSORS, describe, differences, run_id
from tests.convert.hf_dirs import CASES, make_hf_dir, make_hub_vl_dir, make_lora_dir

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-3  # max |ours - hf| / max |hf| on F32 files, as tests/model/test_hf_oracle
TOKENS = [464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13, 198, 40, 1101]


@pytest.fixture(scope="session")
def hf_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hf")


@pytest.fixture(scope="session")
def hf_dir(hf_root: Path):
    def get(name: str) -> Path:
        return make_hf_dir(CASES[name], hf_root)

    return get


@pytest.mark.parametrize(("case", "outtype", "flags"), RUNS, ids=[run_id(*r) for r in RUNS])
def test_same_file_as_llama_cpp(
    hf_dir, tmp_path: Path, case: str, outtype: str, flags: tuple[str, ...]
) -> None:
    want = json.loads((EXPECT_DIR / f"{run_id(case, outtype, flags)}.json").read_text())
    out = tmp_path / "out.gguf"
    convert(hf_dir(case), out, outtype, vocab_only="--vocab-only" in flags)
    got = describe(out)
    diff = differences(got, want)
    assert not diff, "\n".join(diff)
    if not any(t[0].endswith(ULP_TENSORS) for t in want["tensors"]):
        assert got["file_sha256"] == want["file_sha256"]


@pytest.mark.parametrize(
    ("case", "arch", "model_type"),
    [
        ("qwen35", "Qwen3_5ForConditionalGeneration", "qwen3_5"),
        ("qwen35moe", "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe"),
    ],
)
def test_qwen35_hub_layout(
    hf_dir, hf_root: Path, tmp_path: Path, case: str, arch: str, model_type: str
) -> None:
    """The Hub's vision-language layout (``model.language_model.``, ``model.visual.``, ``text_config``,
    experts one by one) converts to the text checkpoint's file: what convert_hf_to_gguf.py writes from
    both (checked when this test was written; only ``general.name``, the directory's, differs)."""
    want = json.loads((EXPECT_DIR / f"{case}-f32.json").read_text())
    out = tmp_path / "out.gguf"
    convert(make_hub_vl_dir(hf_dir(case), hf_root, arch, model_type), out, "f32", model_name=case.title())
    got = describe(out)
    diff = differences(got, want)
    assert not diff, "\n".join(diff)
    assert got["file_sha256"] == want["file_sha256"]


@pytest.mark.parametrize(("case", "outtype"), LORA_RUNS, ids=[f"{c}-{t}" for c, t in LORA_RUNS])
def test_lora_same_file_as_llama_cpp(hf_dir, hf_root: Path, tmp_path: Path, case: str, outtype: str) -> None:
    want = json.loads((EXPECT_DIR / f"lora-{case}-{outtype}.json").read_text())
    d = hf_dir(case)
    ld = make_lora_dir(d, hf_root, f"lora-{case}")
    out = tmp_path / "lora.gguf"
    assert main(["convert", str(ld), "--base", str(d), "-o", str(out), "--outtype", outtype, "-q"]) == 0
    got = describe(out)
    diff = differences(got, want)
    assert not diff, "\n".join(diff)
    assert got["file_sha256"] == want["file_sha256"]


def test_lora_applied_matches_merged_weights(hf_dir, hf_root: Path, tmp_path: Path) -> None:
    """The converted adapter on the converted base (llamapy) = transformers with W + alpha/r B A."""
    from safetensors.numpy import load_file

    from llamapy.batch import Batch
    from llamapy.context import Context, ContextParams
    from llamapy.model import Model
    from llamapy.model.lora import LoraAdapter

    d = hf_dir("llama-spm")
    ld = make_lora_dir(d, hf_root, "lora-llama-spm")
    base, lora = tmp_path / "base.gguf", tmp_path / "lora.gguf"
    convert(d, base, "f32")
    convert(ld, lora, "f32", base_model=d)
    model = Model.load(base)
    ctx = Context(model, ContextParams(n_ctx=64, type_k="f32", type_v="f32"))
    ctx.set_adapters_lora([(LoraAdapter.load(lora, model), 1.0)])
    ctx.decode(Batch.from_tokens(TOKENS, logits_all=True))
    got = np.asarray(ctx.get_logits(), dtype=np.float32).reshape(len(TOKENS), -1)

    cfg = json.loads((ld / "adapter_config.json").read_text())
    scale = cfg["lora_alpha"] / cfg["r"]
    ab = load_file(str(ld / "adapter_model.safetensors"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        d, dtype=torch.float32, attn_implementation="eager"
    )
    sd = hf.state_dict()
    with torch.no_grad():
        for k, a in ab.items():
            if ".lora_A." in k:
                mod = k.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
                b = ab[k.replace(".lora_A.", ".lora_B.")]
                sd[f"{mod}.weight"] += torch.from_numpy(scale * (b @ a))
        ref = hf(input_ids=torch.tensor([TOKENS]), use_cache=False).logits[0].numpy()
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    assert err < TOL, f"max |diff| / max |logit| = {err:.2e}"


def _hf_logits(d: Path) -> np.ndarray:
    kw = {}
    if (
        json.loads((d / "config.json").read_text()).get("quantization_config", {}).get("quant_method")
        == "mxfp4"
    ):
        kw["quantization_config"] = transformers.Mxfp4Config(dequantize=True)  # (MXFP4 kernels need a GPU)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        d, dtype=torch.float32, attn_implementation="eager", **kw
    )
    model.eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor([TOKENS]), use_cache=False).logits[0].float().numpy()


def _our_logits(path: Path) -> np.ndarray:
    from llamapy.batch import Batch
    from llamapy.context import Context, ContextParams
    from llamapy.model import Model

    ctx = Context(Model.load(path), ContextParams(n_ctx=64, type_k="f32", type_v="f32"))
    ctx.decode(Batch.from_tokens(TOKENS, logits_all=True))
    return np.asarray(ctx.get_logits(), dtype=np.float32).reshape(len(TOKENS), -1)


@pytest.mark.parametrize(
    "case",
    [
        "llama",
        "llama-spm",
        "qwen3moe",
        "qwen2moe",
        "gemma2",
        "gemma3",
        "phi3",
        "smollm3",
        "olmo2",
        "granite",
        "granitemoe",
        "granitehybrid",
        "qwen35",
        "qwen3next",
        "qwen35moe",
        "deepseek2",
        "glm4moe",
        "gpt-oss",
        "gemma3n",
        "starcoder2",
        "command-r",
        "gpt2",
        "lfm2",
        "glm4",
        "mistral3",
    ],
)
def test_logits_match_transformers(hf_dir, tmp_path: Path, case: str) -> None:
    d = hf_dir(case)
    out = tmp_path / "f32.gguf"
    convert(d, out, "f32")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = _hf_logits(d)
    finally:
        torch.set_num_threads(n)
    got = _our_logits(out)
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    assert err < TOL, f"{case}: max |diff| / max |logit| = {err:.2e}"


@pytest.mark.parametrize("case", ["bert", "modernbert"])
def test_encoder_outputs_match_transformers(hf_dir, tmp_path: Path, case: str) -> None:
    """The converted encoder's per-token embeddings (pooling none) = transformers' last hidden state."""
    from llamapy.batch import Batch
    from llamapy.context import Context, ContextParams
    from llamapy.model import Model

    d = hf_dir(case)
    out = tmp_path / "f32.gguf"
    convert(d, out, "f32")
    tokens = [101, *TOKENS[:10], 102] if case == "bert" else TOKENS
    model = transformers.AutoModel.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([tokens])).last_hidden_state[0].numpy()
    ctx = Context(Model.load(out), ContextParams(n_ctx=64, embeddings=True, pooling_type="none"))
    ctx.decode(Batch.from_tokens(tokens, logits_all=True))
    got = np.asarray(ctx.get_embeddings(), dtype=np.float32).reshape(len(tokens), -1)
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    assert err < TOL, f"{case}: max |diff| / max |hidden| = {err:.2e}"


def test_cli_quantize_type_equals_convert_then_quantize(hf_dir, tmp_path: Path) -> None:
    d = hf_dir("qwen3")
    one = tmp_path / "one.gguf"
    r = subprocess.run(
        [sys.executable, "-m", "llamapy", "convert", str(d), "-o", str(one), "--outtype", "q4_k_m", "-q"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stdout
    f16 = tmp_path / "f16.gguf"
    assert main(["convert", str(d), "-o", str(f16), "-q"]) == 0  # auto: F16 from an F32 checkpoint
    from llamapy.quantize import quantize_file

    two = tmp_path / "two.gguf"
    quantize_file(f16, two, "Q4_K_M")
    assert one.read_bytes() == two.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f16.gguf", "one.gguf", "two.gguf"]


def test_split_max_size(hf_dir, tmp_path: Path) -> None:
    """The splits llama.cpp writes with --split-max-size 4M (its sha256s), readable as one model."""
    from llamapy.gguf.split import open_model

    d = hf_dir("llama")
    assert main(["convert", str(d), "-o", str(tmp_path / "s.gguf"), "--split-max-size", "4M", "-q"]) == 0
    parts = sorted(tmp_path.glob("s-*.gguf"))
    assert [p.name for p in parts] == [
        "s-00001-of-00003.gguf",
        "s-00002-of-00003.gguf",
        "s-00003-of-00003.gguf",
    ]
    want = json.loads((EXPECT_DIR / "llama-f16-split-max-size-4M.json").read_text())["files_sha256"]
    assert [hashlib.sha256(p.read_bytes()).hexdigest() for p in parts] == want
    whole = tmp_path / "whole.gguf"
    convert(d, whole, "f16")
    with open_model(parts[0]) as m, open_model(whole) as w:
        assert m.n_split == 3
        got = {t.name: t.array().tobytes() for t in m}
        assert got == {t.name: t.array().tobytes() for t in w}


def test_dry_run_name_and_metadata(hf_dir, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = hf_dir("qwen2")
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps({"general.author": "someone", "general.version": "v2"}))
    assert (
        main(
            [
                "convert",
                str(d),
                "-o",
                str(tmp_path),
                "--dry-run",
                "--model-name",
                "Tiny Q",
                "--metadata",
                str(meta),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "blk.0.attn_q.weight" in out and f"would write {tmp_path}/Tiny-Q-2.1M-v2-F16.gguf" in out
    assert list(tmp_path.iterdir()) == [meta]
    r = convert(d, tmp_path / "x.gguf", "f16", model_name="Tiny Q", metadata_file=meta)
    assert r.metadata["general.name"] == "Tiny Q" and r.metadata["general.author"] == "someone"


# ---------------------------------------------------------------------------------------------
# bad input


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _fails(args: list[str], out_dir: Path, capsys: pytest.CaptureFixture[str]) -> str:
    before = sorted(out_dir.iterdir())
    assert main(["convert", *args, "-q"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert sorted(out_dir.iterdir()) == before, "a file was left behind"
    return err


def test_errors(hf_dir, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = hf_dir("llama-spm")
    out = tmp_path / "out"
    out.mkdir()
    o = str(out / "m.gguf")

    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no config.json" in _fails([str(empty), "-o", o], out, capsys)

    d = _copy(src, tmp_path / "arch")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "architectures": ["FancyNewForCausalLM"]}))
    assert "'FancyNewForCausalLM'" in _fails([str(d), "-o", o], out, capsys)

    d = _copy(src, tmp_path / "trunc")
    st = d / "model.safetensors"
    st.write_bytes(st.read_bytes()[:-1000])
    assert "truncated" in _fails([str(d), "-o", o], out, capsys)

    d = _copy(hf_dir("llama"), tmp_path / "shard")
    (d / "model-00002-of-00002.safetensors").unlink()
    assert "missing model shard" in _fails([str(d), "-o", o], out, capsys)

    d = _copy(src, tmp_path / "shape")
    (d / "config.json").write_text(json.dumps({**cfg, "hidden_size": 96}))
    assert "shape" in _fails([str(d), "-o", o], out, capsys)

    d = _copy(src, tmp_path / "heads")
    (d / "config.json").write_text(json.dumps({**cfg, "num_attention_heads": "four"}))
    assert "config.json" in _fails([str(d), "-o", o], out, capsys)

    d = _copy(hf_dir("gemma"), tmp_path / "gemma")
    gcfg = json.loads((d / "config.json").read_text())
    del gcfg["head_dim"]
    (d / "config.json").write_text(json.dumps(gcfg))
    assert "head_dim" in _fails([str(d), "-o", o], out, capsys)

    d = _copy(src, tmp_path / "tok")
    (d / "tokenizer.model").write_bytes(b"\xff\xff\xff not a protobuf")
    assert "tokenizer.model" in _fails([str(d), "-o", o], out, capsys)

    d = _copy(src, tmp_path / "notok")
    (d / "tokenizer.model").unlink()
    assert "tokenizer" in _fails([str(d), "-o", o], out, capsys)

    assert "unknown output type 'q5'" in _fails([str(src), "-o", o, "--outtype", "q5"], out, capsys)

    (out / "m.gguf").write_bytes(b"keep")
    assert "--force" in _fails([str(src), "-o", o], out, capsys)
    assert (out / "m.gguf").read_bytes() == b"keep"


def test_unknown_pre_tokenizer_names_the_hash(hf_dir, tmp_path: Path) -> None:
    d = _copy(hf_dir("qwen3"), tmp_path / "pre")
    tj = json.loads((d / "tokenizer.json").read_text())
    tj["pre_tokenizer"] = {"type": "Whitespace"}
    (d / "tokenizer.json").write_text(json.dumps(tj))
    with pytest.raises(
        ConvertError, match=r"unknown BPE pre-tokenizer \(check-text hash [0-9a-f]{64}\).*pre_hashes"
    ):
        convert(d, tmp_path / "x.gguf", "f16")
    assert not (tmp_path / "x.gguf").exists()
