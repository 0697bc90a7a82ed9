"""A PEFT LoRA adapter (``adapter_config.json`` + ``adapter_model.safetensors``) as a GGUF LoRA, as
llama.cpp's ``convert_lora_to_gguf.py`` writes it: every ``lora_A``/``lora_B`` pair of a base weight
becomes ``<GGUF name>.lora_a`` / ``.lora_b`` (the base family's mapping applied: llama's q/k permutation
permutes B's rows), ``general.type = adapter``, ``adapter.type = lora``, ``adapter.lora.alpha``.

The base model's ``config.json`` is needed (``base``: its directory; its weights are not read).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ..ggml.types import GGMLType
from .convert import (
    OUTTYPES,
    ConvertResult,
    _encode,
    _load_hparams,
    _make_context,
    _Mapper,
    _sub_type,
    hf_families,
)
from .errors import ConvertError
from .safetensors import SafetensorsFile


def _base_name(name: str) -> str:
    """convert_lora_to_gguf.py's get_base_tensor_name."""
    for a, b in (
        ("base_model.model.", ""),
        (".lora_A.weight", ".weight"),
        (".lora_B.weight", ".weight"),
        (".lora_embedding_A", ".weight"),
        (".lora_embedding_B", ".weight"),
    ):
        name = name.replace(a, b)
    return name


def _open_adapter(ld: Path) -> Any:
    """``adapter_model.safetensors``, else ``adapter_model.bin`` (read as convert_lora_to_gguf.py's
    ``torch.load``, without torch: ``torch_bin``)."""
    st_path = ld / "adapter_model.safetensors"
    if st_path.is_file():
        return SafetensorsFile(st_path)
    if (ld / "adapter_model.bin").is_file():
        from .torch_bin import TorchBinFile

        return TorchBinFile(ld / "adapter_model.bin")
    raise ConvertError(f"{ld}: no adapter_model.safetensors (or adapter_model.bin)")


def convert_lora(
    lora_dir: str | os.PathLike,
    base_dir: str | os.PathLike | None,
    out: str | os.PathLike | None = None,
    outtype: str = "f32",
    *,
    force: bool = False,
    dry_run: bool = False,
) -> ConvertResult:
    """Convert the PEFT adapter in ``lora_dir`` (base model config in ``base_dir``, default: the adapter's
    ``base_model_name_or_path`` when it is a local directory). Raises :class:`ConvertError`."""
    import gguf

    logging.getLogger("gguf").setLevel(logging.ERROR)
    ld = Path(lora_dir)
    cfg_path = ld / "adapter_config.json"
    if not cfg_path.is_file():
        raise ConvertError(f"{ld}: no adapter_config.json (not a PEFT adapter directory)")
    try:
        lparams = json.loads(cfg_path.read_text(encoding="utf-8"))
        alpha = float(lparams["lora_alpha"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConvertError(f"{cfg_path}: cannot read lora_alpha ({e})") from None
    if base_dir is None:
        guess = lparams.get("base_model_name_or_path")
        if not guess or not Path(guess).is_dir():
            raise ConvertError("the base model's config is needed: give its directory with --base")
        base_dir = guess
    bd = Path(base_dir)
    hp = _load_hparams(bd)
    arch = (hp.get("architectures") or [None])[0]
    decl = hf_families().get(str(arch))
    if decl is None:
        raise ConvertError(f"architecture {arch!r} (the base model's config.json) cannot be converted")
    t = outtype.lower()
    if t != "auto" and t not in OUTTYPES:
        raise ConvertError(f"unknown output type {outtype!r} for a LoRA (one of {', '.join(OUTTYPES)})")
    sf = _open_adapter(ld)
    if t == "auto":  # convert_lora_to_gguf.py's guess: the first matrix's 16-bit type, else F16
        first = next((x for x in sf.tensors.values() if len(x.shape) >= 2), None)
        t = "bf16" if first is not None and first.dtype == "BF16" else "f16"
    file_type, qtype = OUTTYPES[t]
    try:
        ctx = _make_context(bd, hp, decl, file_type)
        pairs: dict[str, dict[str, Any]] = {}
        for name, st in sf.tensors.items():
            base = _base_name(name)
            is_a = ".lora_A.weight" in name or ".lora_embedding_A" in name
            is_b = ".lora_B.weight" in name or ".lora_embedding_B" in name
            if not (is_a or is_b):
                if ".base_layer.weight" in name:
                    continue
                raise ConvertError(f"unexpected tensor {name!r} in the adapter: not a lora_A or lora_B")
            pairs.setdefault(base, {})["A" if is_a else "B"] = st
        plan: list[tuple[str, np.ndarray, GGMLType]] = []
        mapper = _Mapper(ctx)
        for base, ab in pairs.items():
            if "A" not in ab or "B" not in ab:
                raise ConvertError(
                    f"{base!r} has lora_{'B' if 'A' in ab else 'A'} but not lora_{'A' if 'A' in ab else 'B'}"
                )
            a, b = ab["A"].numpy().astype(np.float32), ab["B"].numpy().astype(np.float32)
            # the base mapping on B (rows: the output features), the name from the base name
            out_pairs = list(mapper(base, b))
            if len(out_pairs) != 1:
                raise ConvertError(f"cannot convert the adapter of {base!r} ({decl.arch})")
            gname, b2 = out_pairs[0]
            if "token_embd.weight" in gname:
                a = a.T
            for suffix, arr in ((".lora_a", a), (".lora_b", b2)):
                tt = qtype if arr.ndim == 2 else GGMLType.F32
                if tt == GGMLType.Q8_0 and arr.shape[-1] % 32:
                    tt = GGMLType.F16
                plan.append((gname + suffix, np.ascontiguousarray(arr), tt))
        total = 0
        for name, arr, _tt in plan:
            if name.endswith(".lora_b"):
                a_arr = next(x for n, x, _ in plan if n == name[:-1] + "a")
                total += int(np.prod((*arr.shape[:-1], a_arr.shape[-1])))
        kv = gguf.GGUFWriter(path=None, arch=decl.arch)
        meta = gguf.Metadata.load(None, ld, None, -total)
        if meta.name is None:
            meta.name = bd.resolve().name
        # (no size label: the parameter count of an adapter is negative, "likely not exact", in gguf-py)
        kv.add_type(gguf.GGUFType.ADAPTER)
        kv.add_string(gguf.Keys.Adapter.TYPE, "lora")
        meta.set_gguf_meta_model(kv)
        kv.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
        kv.add_quantization_version(gguf.GGML_QUANT_VERSION)
        md = {k: v.value for k, v in kv.kv_data[0].items()}
        if out is None or Path(out).is_dir():
            fname = gguf.naming_convention(
                meta.name,
                meta.basename,
                meta.finetune,
                meta.version,
                meta.size_label,
                t.upper(),
                model_type="LoRA",
            )
            out_path = (ld if out is None else Path(out)) / f"{fname}.gguf"
        else:
            out_path = Path(out)
        result = ConvertResult([out_path], decl.arch, [(n, a.shape, tt) for n, a, tt in plan], md, total)
        if dry_run:
            return result
        if out_path.exists() and not force:
            raise ConvertError(f"{out_path} exists (use --force to overwrite it)")
        _write_small(kv, plan, out_path)
        return result
    finally:
        sf.close()


def _write_small(kv: Any, plan: list[tuple[str, np.ndarray, GGMLType]], path: Path) -> None:
    from ..gguf import GGUFValueType
    from ..gguf.writer import GGUFWriter

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        w = GGUFWriter(tmp)
        for key, val in kv.kv_data[0].items():
            w.add_key_value(key, val.value, GGUFValueType(int(val.type)), _sub_type(val))
        for name, arr, tt in plan:
            w.add_tensor_info(name, arr.shape, tt)
        for name, arr, tt in plan:
            w.write_tensor_data(_encode(arr, tt), name)
        w.write()
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
