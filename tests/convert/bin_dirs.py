"""PyTorch ``.bin`` copies of the converter's tiny checkpoints (test-only: torch is the oracle here).

``make_bin_dir(src, root, name, ...)`` copies the checkpoint ``src`` (made by ``hf_dirs.make_hf_dir``) with
its safetensors replaced by what transformers 4's ``save_pretrained(safe_serialization=False)`` wrote
(transformers 5 no longer writes ``.bin``): ``torch.save`` of the state dict, in the model's
``state_dict()`` order, as ``pytorch_model.bin`` or as shards ``pytorch_model-0000i-of-0000n.bin`` with
``pytorch_model.bin.index.json``. ``dtype`` re-types the floats (F16, BF16); ``strided`` stores every
attention projection as a view into one fused ``[q; k; v]`` storage and every MLP matrix transposed
(non-contiguous strides), so a reader must honour storage offsets and strides.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path


def _state_order(d: Path) -> list[str]:
    """The names of the model's state_dict() in its own (module) order."""
    import torch
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(d)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    return list(model.state_dict())


def _strided(sd: dict) -> dict:
    import torch

    out = dict(sd)
    for k in sd:
        if k.endswith("self_attn.q_proj.weight"):
            base = k.removesuffix("q_proj.weight")
            parts = [sd[f"{base}{x}_proj.weight"] for x in "qkv"]
            fused = torch.cat(parts).contiguous()
            a = 0
            for x, p in zip("qkv", parts, strict=True):
                out[f"{base}{x}_proj.weight"] = fused[a : a + p.shape[0]]  # offset views of one storage
                a += p.shape[0]
        elif ".mlp." in k:
            out[k] = sd[k].t().contiguous().t()  # same values, column-major strides
    return out


def make_bin_dir(
    src: Path, root: Path, name: str, shards: int = 1, dtype: str = "", strided: bool = False
) -> Path:
    """``root/name``: ``src`` with its weights as PyTorch ``.bin`` (written once)."""
    import torch
    from safetensors.torch import load_file

    d = root / name
    if (d / "config.json").exists():
        return d
    tmp = root / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("*.safetensors", "model.safetensors.index.json"))
    st: dict = {}
    for p in sorted(src.glob("*.safetensors")):
        st.update(load_file(p))
    sd = {k: st[k] for k in _state_order(src) if k in st}
    sd |= {k: v for k, v in st.items() if k not in sd}
    if dtype:
        dt = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32}[dtype]
        sd = {k: v.to(dt) if v.is_floating_point() else v for k, v in sd.items()}
    if strided:
        sd = _strided(sd)
    names = list(sd)
    if shards == 1:
        torch.save(sd, tmp / "pytorch_model.bin")
    else:
        per = math.ceil(len(names) / shards)
        weight_map: dict[str, str] = {}
        for i in range(shards):
            fn = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
            part = names[i * per : (i + 1) * per]
            torch.save({k: sd[k] for k in part}, tmp / fn)
            weight_map.update(dict.fromkeys(part, fn))
        total = sum(v.numel() * v.element_size() for v in sd.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (tmp / "pytorch_model.bin.index.json").write_text(json.dumps(index, indent=2))
    tmp.rename(d)
    return d


# (run id, hf_dirs case, --outtype, shards, dtype, strided): compared with convert_hf_to_gguf.py's file
BIN_RUNS: list[tuple[str, str, str, int, str, bool]] = [
    ("bin-llama-f16", "llama", "f16", 1, "", False),
    ("bin-llama-f32-sharded-f16-strided", "llama", "f32", 2, "F16", True),
    ("bin-llama-spm-auto-sharded-strided", "llama-spm", "auto", 3, "", True),
]


def make_bin_run_dir(run: tuple[str, str, str, int, str, bool], root: Path) -> Path:
    from tests.convert.hf_dirs import CASES, make_hf_dir

    rid, case, _outtype, shards, dtype, strided = run
    return make_bin_dir(make_hf_dir(CASES[case], root), root, rid, shards, dtype, strided)
