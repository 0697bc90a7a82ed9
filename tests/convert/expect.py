"""What llama.cpp's ``convert_hf_to_gguf.py`` wrote for each tiny checkpoint, stored small in
``tests/data/convert/<case>-<outtype>.json``: the file's sha256, every metadata key with its type and
value (long arrays as a length and a hash), every tensor's name, ggml shape, type and a hash of its bytes.

Regenerate (needs llama.cpp's sdist with its gguf-py, torch, and the sentencepiece package on
PYTHONPATH for the SentencePiece cases)::

    PYTHONPATH=/path/to/sentencepiece python -m tests.convert.expect ~/.cache/llamapy/llamacpp/0.3.36 [RUN_ID...]
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from tests.util import DATA

EXPECT_DIR = DATA / "convert"

# (case, --outtype, extra converter flags): what is compared with llama.cpp
RUNS: list[tuple[str, str, tuple[str, ...]]] = [
    ("llama", "f16", ()),
    ("llama", "q8_0", ()),
    ("llama", "f16", ("--vocab-only",)),
    ("llama-spm", "auto", ()),
    ("qwen2", "f16", ()),
    ("qwen3", "f16", ()),
    ("qwen3moe", "bf16", ()),
    ("gemma", "f16", ()),
    ("gemma2", "f16", ()),
    ("gemma3", "f16", ()),
    ("phi3", "f32", ()),
    ("smollm3", "f16", ()),
    ("olmo2", "f16", ()),
    ("granite", "f16", ()),
    ("granitemoe", "f16", ()),
    ("granitehybrid", "f16", ()),
    ("qwen35", "f32", ()),
    ("qwen3next", "f32", ()),
    ("qwen35moe", "f32", ()),
    ("deepseek2", "f16", ()),
    ("glm4moe", "bf16", ()),
    ("gpt-oss", "f16", ()),
    ("gemma3n", "f32", ()),
    ("bert", "f16", ()),
    ("modernbert", "f16", ()),
    ("qwen2moe", "f16", ()),
    ("starcoder2", "f16", ()),
    ("command-r", "f16", ()),
    ("gpt2", "f16", ()),
    ("lfm2", "f16", ()),
    ("glm4", "bf16", ()),
    ("mistral3", "f16", ()),
]


# cases whose model_type transformers 5 lists in MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS: its AutoTokenizer,
# which llama.cpp's converter calls, drops the tokenizer.json pre-tokenizer for the family's own (Qwen3.5's
# regex), so on the tiny GPT-2 vocabulary the check-text hash is none llama.cpp knows. The expectation is
# written with the hub's declared tokenizer class honoured (the model_type taken off that list), as on the
# real checkpoints, whose tokenizer.json already has that pre-tokenizer; llamapy reads tokenizer.json as is.
HUB_TOKENIZER_CLASS = {"qwen35moe": "qwen3_5_moe_text"}
_HUB_TOKENIZER_SHIM = (
    "import runpy, sys; import transformers.models.auto.tokenization_auto as t; "
    "getattr(t, 'MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS', set()).discard(sys.argv.pop(1)); sys.argv.pop(0); "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


# PEFT LoRA adapters (hf_dirs.make_lora_dir) of a case: (case, --outtype), by convert_lora_to_gguf.py
LORA_RUNS: list[tuple[str, str]] = [("llama-spm", "f32"), ("llama", "q8_0")]


# mmproj of the vision-language checkpoints (mm_dirs.MM_CASES): (case, --outtype), by convert_hf_to_gguf.py --mmproj
MM_RUNS: list[tuple[str, str]] = [
    ("gemma3", "f16"),
    ("gemma3", "q8_0"),
    ("idefics3", "f16"),
    ("qwen2.5vl", "f16"),
    ("qwen2vl", "f16"),
    ("qwen3vl", "f16"),
    ("glm4v", "f16"),
    ("llama4", "f16"),
    ("qwen2audio", "f16"),
    ("voxtral", "f32"),
    ("mistral3", "bf16"),
    ("lfm2vl", "f16"),
    ("internvl", "f16"),
    ("minicpmv4_6", "q8_0"),
    ("ultravox", "f16"),
    ("kimik25", "f16"),
]


def run_id(case: str, outtype: str, flags: tuple[str, ...]) -> str:
    return "-".join([case, outtype, *(f.strip("-") for f in flags)])


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _value(v: Any) -> Any:
    if isinstance(v, (str, bool, int, float)):
        return v
    items = list(v)
    items = [x.item() if isinstance(x, np.generic) else x for x in items]
    if len(items) <= 16:
        return items
    return {"len": len(items), "sha256": _sha(json.dumps(items, ensure_ascii=False).encode())}


def describe(path: Path) -> dict[str, Any]:
    """The comparable description of a GGUF file."""
    from llamapy.gguf.reader import GGUFReader

    with GGUFReader(path) as r:
        md = {
            k: [f.type.name, f.sub_type.name if f.sub_type is not None else None, _value(f.value)]
            for k, f in r.fields.items()
        }
        tensors = [
            [t.name, list(t.ne), t.ggml_type.name, _sha(t.array().tobytes())]
            + (
                [np.asarray(t.array(), dtype=np.float32).ravel().tolist()]
                if t.name.endswith(ULP_TENSORS)
                else []
            )
            for t in r
        ]
    return {"file_sha256": _sha(path.read_bytes()), "metadata": md, "tensors": tensors}


# tensors computed with torch's float32 exp by llama.cpp (A = -exp(A_log) of Mamba2 / Gated DeltaNet): torch
# calls MKL's vsExp, which is not correctly rounded; llamapy rounds the exact value, so an element may be
# 1 ulp apart. Their values are stored and compared within 1 ulp; everything else byte for byte.
ULP_TENSORS = (".ssm_a",)


def _within_ulp(got: list[Any], want: list[Any]) -> bool:
    if got[:3] != want[:3] or len(got) < 5 or len(want) < 5:
        return False
    g, w = np.asarray(got[4], np.float32), np.asarray(want[4], np.float32)
    return g.shape == w.shape and bool(np.all(np.abs(g - w) <= np.spacing(np.abs(w))))


def differences(got: dict[str, Any], want: dict[str, Any]) -> list[str]:
    """What differs, key by key and tensor by tensor (empty when the files are equal)."""
    out: list[str] = []
    gm, wm = got["metadata"], want["metadata"]
    if list(gm) != list(wm):
        out.append(f"metadata keys: ours only {[k for k in gm if k not in wm]}, llama.cpp's only "
                   f"{[k for k in wm if k not in gm]}, order equal: {[k for k in gm if k in wm] == [k for k in wm if k in gm]}")  # fmt: skip
    out += [f"{k}: ours {gm[k]!r:.200}, llama.cpp's {wm[k]!r:.200}" for k in gm if k in wm and gm[k] != wm[k]]
    gt, wt = {t[0]: t for t in got["tensors"]}, {t[0]: t for t in want["tensors"]}
    if list(gt) != list(wt):
        out.append(f"tensors: ours {list(gt)}, llama.cpp's {list(wt)}")
    ulp = [
        n for n in gt if n in wt and gt[n] != wt[n] and n.endswith(ULP_TENSORS) and _within_ulp(gt[n], wt[n])
    ]
    out += [
        f"tensor {n}: ours {gt[n][1:]}, llama.cpp's {wt[n][1:]}"
        for n in gt
        if n in wt and gt[n] != wt[n] and n not in ulp
    ]
    if not out and not ulp and got["file_sha256"] != want["file_sha256"]:
        out.append("same keys and tensors, but the file bytes differ (padding or layout)")
    return out


def main(sdist: str, only: list[str]) -> None:
    from tests.convert.hf_dirs import CASES, make_hf_dir, make_lora_dir
    from tests.convert.mm_dirs import MM_CASES, make_mm_dir

    EXPECT_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for case, outtype, flags in RUNS:
            if only and run_id(case, outtype, flags) not in only:
                continue
            d = make_hf_dir(CASES[case], root)
            out = root / f"{run_id(case, outtype, flags)}.gguf"
            shim = (
                ["-c", _HUB_TOKENIZER_SHIM, HUB_TOKENIZER_CLASS[case]] if case in HUB_TOKENIZER_CLASS else []
            )
            cmd = [
                sys.executable,
                *shim,
                "convert_hf_to_gguf.py",
                str(d),
                "--outfile",
                str(out),
                "--outtype",
                outtype,
                *flags,
            ]
            subprocess.run(cmd, cwd=sdist, check=True, capture_output=True)
            desc = describe(out)
            (EXPECT_DIR / f"{run_id(case, outtype, flags)}.json").write_text(
                json.dumps(desc, indent=1) + "\n"
            )
            print(run_id(case, outtype, flags), desc["file_sha256"])
        for case, outtype in MM_RUNS:
            rid = f"mmproj-{case}-{outtype}"
            if only and rid not in only:
                continue
            md = make_mm_dir(MM_CASES[case], root)
            out = root / f"{rid}.gguf"
            cmd = [sys.executable, "convert_hf_to_gguf.py", str(md.path), "--mmproj", "--outfile", str(out),
                   "--outtype", outtype]  # fmt: skip
            subprocess.run(cmd, cwd=sdist, check=True, capture_output=True)
            desc = describe(out)
            (EXPECT_DIR / f"{rid}.json").write_text(json.dumps(desc, indent=1) + "\n")
            print(rid, desc["file_sha256"])
        if not only or "nomic-bert-f16" in only:  # (no transformers class: its own directory maker)
            from tests.convert.hf_dirs import make_nomic_bert_dir

            out = root / "nomic-bert-f16.gguf"
            cmd = [sys.executable, "convert_hf_to_gguf.py", str(make_nomic_bert_dir(root)), "--outfile", str(out),
                   "--outtype", "f16"]  # fmt: skip
            subprocess.run(cmd, cwd=sdist, check=True, capture_output=True)
            desc = describe(out)
            (EXPECT_DIR / "nomic-bert-f16.json").write_text(json.dumps(desc, indent=1) + "\n")
            print("nomic-bert-f16", desc["file_sha256"])
        from tests.convert.mm_dirs_vl import VL_RUNS, make_vl_dir

        for case, outtype in VL_RUNS:  # remote-code vision-language models (mm_dirs_vl)
            rid = f"mmproj-{case}-{outtype}"
            if only and rid not in only:
                continue
            out = root / f"{rid}.gguf"
            cmd = [sys.executable, "convert_hf_to_gguf.py", str(make_vl_dir(case, root).path), "--mmproj",
                   "--outfile", str(out), "--outtype", outtype]  # fmt: skip
            subprocess.run(cmd, cwd=sdist, check=True, capture_output=True)
            desc = describe(out)
            (EXPECT_DIR / f"{rid}.json").write_text(json.dumps(desc, indent=1) + "\n")
            print(rid, desc["file_sha256"])
        from tests.convert.bin_dirs import BIN_RUNS, make_bin_run_dir

        for run in BIN_RUNS:  # PyTorch .bin checkpoints
            rid, outtype = run[0], run[2]
            if only and rid not in only:
                continue
            out = root / f"{rid}.gguf"
            cmd = [sys.executable, "convert_hf_to_gguf.py", str(make_bin_run_dir(run, root)), "--outfile", str(out),
                   "--outtype", outtype]  # fmt: skip
            subprocess.run(cmd, cwd=sdist, check=True, capture_output=True)
            desc = describe(out)
            (EXPECT_DIR / f"{rid}.json").write_text(json.dumps(desc, indent=1) + "\n")
            print(rid, desc["file_sha256"])
        for case, outtype in LORA_RUNS:
            rid = f"lora-{case}-{outtype}"
            if only and rid not in only:
                continue
            d = make_hf_dir(CASES[case], root)
            ld = make_lora_dir(d, root, f"lora-{case}")
            out = root / f"{rid}.gguf"
            cmd = [sys.executable, "convert_lora_to_gguf.py", str(ld), "--base", str(d), "--outfile", str(out),
                   "--outtype", outtype]  # fmt: skip
            subprocess.run(cmd, cwd=sdist, check=True, capture_output=True)
            desc = describe(out)
            (EXPECT_DIR / f"{rid}.json").write_text(json.dumps(desc, indent=1) + "\n")
            print(rid, desc["file_sha256"])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
