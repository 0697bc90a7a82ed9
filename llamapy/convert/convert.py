"""Hugging Face checkpoint -> GGUF, as llama.cpp's ``convert_hf_to_gguf.py`` does it.

The steps follow its ``ModelBase.write``: index the safetensors (memory-mapped), map every tensor
(the family's hook, llama's q/k permutation, the Gemma norm offset, experts stacked, gguf-py's
``TensorNameMap`` for the names), choose each tensor's type as its ``prepare_tensors`` does, then the
metadata (gguf-py's ``Metadata``: ``general.*`` from the directory, ``--metadata`` and
``generation_config.json``), the hyper-parameters (``TextModel.set_gguf_parameters`` and the family's
``params``), the vocabulary. The file is written by llamapy's own ``GGUFWriter``, streaming one tensor at
a time, to a temporary file in the output's directory that is renamed at the end (nothing is left
behind on an error).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import field
from pathlib import Path
from typing import Any

import numpy as np

from .._dataclass import dataclass
from ..ggml.types import GGMLType
from ..model.hf import HFConvert
from .errors import ConvertError
from .safetensors import SafeTensor, SafetensorsFile, open_checkpoint
from .vocab import set_vocab

# --outtype -> (LlamaFileType, the type of the tensors that are "quantized")
OUTTYPES: dict[str, tuple[int, GGMLType]] = {
    "f32": (0, GGMLType.F32),
    "f16": (1, GGMLType.F16),
    "bf16": (32, GGMLType.BF16),
    "q8_0": (7, GGMLType.Q8_0),
}

_SKIP_SUFFIXES = (".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")
# tensors llama.cpp keeps in F32 whatever the file type (prepare_tensors' list, by GGUF name)
_F32_NAMES = (
    "ffn_gate_inp.weight",
    "ffn_gate_inp_shexp.weight",
    "position_embd.weight",
    "token_types.weight",
    "ssm_conv1d.weight",
    "shortconv.conv.weight",
    "altup_correct_coef.weight",
    "altup_predict_coef.weight",
)


# ---------------------------------------------------------------------------------------------
# the families


def hf_families() -> dict[str, HFConvert]:
    """config.json ``architectures`` entry -> the declaration of the family converting it."""
    from ..model.arch import _FAMILY_MODULES

    out: dict[str, HFConvert] = {}
    for mod in sorted(set(_FAMILY_MODULES.values())):
        m = importlib.import_module(f"llamapy.model.arch.{mod}")
        decls = getattr(m, "HF_CONVERT", ())
        for decl in decls if isinstance(decls, (tuple, list)) else (decls,):
            for a in decl.hf_archs:
                out[a] = decl
    return out


@dataclass
class Context:
    """What a family's hooks see: the merged hparams (text_config on top), like llama.cpp's."""

    dir: Path
    hparams: dict[str, Any]
    decl: HFConvert
    file_type: int
    rope_parameters: dict[str, Any] = field(default_factory=dict)
    block_count: int = 0
    state: dict[str, Any] = field(default_factory=dict)  # a hook's scratch (e.g. experts being stacked)
    checkpoint: dict[str, SafeTensor] = field(default_factory=dict)  # every tensor, for extra_tensors

    kv: Any = None  # the key/value collector, while the vocabulary is written
    # keys a tensor hook adds while the tensors are prepared ((GGUFWriter method, value)), written first
    kv_early: list[tuple[str, Any]] = field(default_factory=list)

    def set_vocab(self, kind: str, special: dict[str, str] | None = None) -> None:
        """The vocabulary of ``kind`` ("spm", "gpt2", "spm|gpt2": the first present); ``special``: special
        token types set to added tokens by content (where the files set none)."""
        set_vocab(
            self.kv,
            self.dir,
            kind,
            self.hparams.get("vocab_size"),
            special,
            self.hparams.get("type_vocab_size", 1),
        )

    def special_tokens(self, kv: Any, ids: dict[str, int]) -> None:
        """Extra special token ids (gguf-py's SpecialVocab._set_special_token, then add_to_gguf)."""
        from .special_vocab import SpecialVocab

        sv = SpecialVocab(self.dir, load_merges=False, special_token_types=list(ids))
        for typ, tid in ids.items():
            sv._set_special_token(typ, tid)
        sv.chat_template = None
        sv.add_to_gguf(kv, quiet=True)

    def tokenizer_config(self) -> dict[str, Any]:
        p = self.dir / "tokenizer_config.json"
        if not p.is_file():
            return {}
        try:
            return json.loads(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConvertError(f"{p}: cannot read it as JSON ({e})") from None

    def n_vocab_real(self) -> int:
        """The tokenizer's size (Gemma 3 drops embedding rows past it)."""
        from .vocab import sentencepiece_vocab

        if (self.dir / "tokenizer.model").is_file():
            return len(sentencepiece_vocab(self.dir, self.hparams.get("vocab_size"))[0])
        tj = json.loads((self.dir / "tokenizer.json").read_text(encoding="utf-8"))
        return len(tj["model"]["vocab"]) + len(tj["added_tokens"])

    def find_hparam(self, keys: list[str], optional: bool = False) -> Any:
        for k in keys:
            if k in self.hparams:
                return self.hparams[k]
        if optional:
            return None
        raise ConvertError(f"config.json: none of {keys} is set")


def _load_hparams(d: Path) -> dict[str, Any]:
    cfg = d / "config.json"
    if not cfg.is_file():
        raise ConvertError(f"{d}: no config.json (not a Hugging Face checkpoint directory)")
    try:
        hp = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConvertError(f"{cfg}: cannot read it as JSON ({e})") from None
    if not isinstance(hp, dict):
        raise ConvertError(f"{cfg}: not a JSON object")
    return hp


def _checkpoint(hf_dir: str | os.PathLike) -> tuple[Path, dict[str, Any], str]:
    """The checkpoint directory, its ``config.json`` and the first of its ``architectures``."""
    d = Path(hf_dir)
    if not d.is_dir():
        raise ConvertError(f"{d}: not a directory")
    hp = _load_hparams(d)
    archs = hp.get("architectures") or []
    if not isinstance(archs, list) or not archs:
        raise ConvertError(f"{d / 'config.json'}: no 'architectures' entry")
    return d, hp, str(archs[0])


def _make_context(
    d: Path, hp: dict[str, Any], decl: HFConvert, file_type: int, names: list[str] | None = None
) -> Context:
    if "text_config" in hp and isinstance(hp["text_config"], dict):
        hp = {**hp, **hp["text_config"]}
    hp = {k: v for k, v in hp.items() if k not in decl.drop_hparams}
    if decl.adjust_hparams is not None:
        hp = decl.adjust_hparams(hp)
    ctx = Context(d, hp, decl, file_type)
    ctx.block_count = ctx.find_hparam(["n_layers", "num_hidden_layers", "n_layer", "num_layers"])
    if decl.extra_blocks is not None:
        ctx.block_count += decl.extra_blocks(ctx, names or [])
    rp = dict(hp.get("rope_parameters", hp.get("rope_scaling")) or {})
    f = ctx.find_hparam
    rope_theta = f(
        ["global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta", "rotary_emb_base"], True
    )
    local_theta = f(
        [
            "local_rope_theta",
            "rope_local_theta",
            "rope_theta_local",
            "swa_rope_theta",
            "rope_local_base_freq",
        ],
        True,
    )
    partial = f(["partial_rotary_factor", "rope_pct", "rope_percent"], True)
    orig = f(["original_max_position_embeddings"], True)
    if "full_attention" not in rp and "sliding_attention" not in rp:
        if local_theta is not None:
            rp["sliding_attention"] = {"rope_theta": local_theta}
        if "rope_theta" not in rp and rope_theta is not None:
            rp["rope_theta"] = rope_theta
        if "rope_type" not in rp and (rt := rp.get("type")) is not None:
            rp["rope_type"] = rt
        if "partial_rotary_factor" not in rp and partial is not None:
            rp["partial_rotary_factor"] = partial
        if "original_max_position_embeddings" not in rp and orig is not None:
            rp["original_max_position_embeddings"] = orig
    ctx.rope_parameters = rp
    return ctx


# ---------------------------------------------------------------------------------------------
# hyper-parameters (TextModel.set_gguf_parameters)


def generic_params(ctx: Context, kv: Any) -> None:
    import gguf

    f = ctx.find_hparam
    kv.add_block_count(ctx.block_count)
    if (n_ctx := f(["max_position_embeddings", "n_ctx", "n_positions", "max_length", "max_sequence_length",
                    "model_max_length"], True)) is not None:  # fmt: skip
        kv.add_context_length(n_ctx)
    if (n_embd := f(["hidden_size", "n_embd", "dim"], True)) is not None:
        kv.add_embedding_length(n_embd)
    if (n_ff := f(["prefix_dense_intermediate_size", "dense_intermediate_size", "intermediate_size", "n_inner",
                   "hidden_dim"], True)) is not None:  # fmt: skip
        kv.add_feed_forward_length(n_ff)
    if (n_head := f(["num_attention_heads", "n_head", "n_heads"], True)) is not None:
        kv.add_head_count(n_head)
    if (n_head_kv := f(["num_key_value_heads", "n_kv_heads"], True)) is not None:
        kv.add_head_count_kv(n_head_kv)
    if ctx.hparams.get("is_causal") is False:
        kv.add_causal_attention(False)
    rp = ctx.rope_parameters.get("full_attention", ctx.rope_parameters)
    if (rope_type := rp.get("rope_type")) is not None:
        factor = rp.get("factor")
        if rope_type == "linear" and factor is not None:
            kv.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            kv.add_rope_scaling_factor(factor)
        elif rope_type == "yarn" and factor is not None:
            kv.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            kv.add_rope_scaling_factor(factor)
            kv.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
            if (v := rp.get("extrapolation_factor")) is not None:
                kv.add_rope_scaling_yarn_ext_factor(v)
            if (v := rp.get("attention_factor", rp.get("attn_factor"))) is not None:
                kv.add_rope_scaling_yarn_attn_factor(v)
            if (v := rp.get("beta_fast")) is not None:
                kv.add_rope_scaling_yarn_beta_fast(v)
            if (v := rp.get("beta_slow")) is not None:
                kv.add_rope_scaling_yarn_beta_slow(v)
        elif rope_type in ("su", "longrope"):
            kv.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE)
    if "mrope_section" in ctx.rope_parameters:
        sec = list(ctx.rope_parameters["mrope_section"])
        sec += [0] * (4 - len(sec))
        kv.add_rope_dimension_sections(sec[:4])
    if (theta := rp.get("rope_theta")) is not None:
        kv.add_rope_freq_base(theta)
    if (local := ctx.rope_parameters.get("sliding_attention", {}).get("rope_theta")) is not None:
        kv.add_rope_freq_base_swa(local)
    if (eps := f(["rms_norm_eps", "norm_eps"], True)) is not None:
        kv.add_layer_norm_rms_eps(eps)
    if (eps := f(["layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"], True)) is not None:
        kv.add_layer_norm_eps(eps)
    if (n := f(["num_local_experts", "num_experts", "n_routed_experts"], True)) is not None:
        kv.add_expert_count(n)
    if (n := f(["num_experts_per_tok", "num_experts_per_token", "top_k_experts"], True)) is not None:
        kv.add_expert_used_count(n)
    if (n := ctx.hparams.get("n_group")) is not None:
        kv.add_expert_group_count(n)
    if (n := ctx.hparams.get("topk_group")) is not None:
        kv.add_expert_group_used_count(n)
    score = f(["score_function", "scoring_func", "score_func", "moe_router_activation", "moe_router_activation_func",
               "expert_selection_fn"], True)  # fmt: skip
    if score is not None:
        funcs = {"sigmoid": gguf.ExpertGatingFuncType.SIGMOID, "softmax": gguf.ExpertGatingFuncType.SOFTMAX}
        if score not in funcs:
            raise ConvertError(f"config.json: unsupported expert gating function {score!r}")
        kv.add_expert_gating_func(funcs[score])
    if (head_dim := ctx.hparams.get("head_dim")) is not None:
        kv.add_key_length(head_dim)
        kv.add_value_length(head_dim)
    kv.add_file_type(ctx.file_type)


# ---------------------------------------------------------------------------------------------
# tensors


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: HF's rotate-half q/k rows -> ggml's interleaved rope."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _block_id(name: str) -> int | None:
    return next((int(p) for p in name.split(".") if p.isdecimal()), None)


class _Mapper:
    """HF name + array -> GGUF (name, array) pairs for one family (modify_tensors)."""

    def __init__(self, ctx: Context) -> None:
        import gguf

        self.ctx = ctx
        arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == ctx.decl.arch)
        self.names = gguf.get_tensor_name_map(arch_id, ctx.block_count)
        self.experts: dict[int, dict[str, np.ndarray]] = {}

    def gguf_name(self, name: str) -> str:
        new = self.names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise ConvertError(f"cannot map tensor {name!r} to a GGUF name ({self.ctx.decl.arch})")
        return new

    def __call__(self, name: str, data: np.ndarray) -> Iterator[tuple[str, np.ndarray]]:
        ctx, decl = self.ctx, self.ctx.decl
        bid = _block_id(name)
        if decl.norm_shift and name.endswith("norm.weight"):
            data = data + np.float32(decl.norm_shift)
        pairs = decl.tensor(ctx, name, data, bid) if decl.tensor is not None else [(name, data)]
        for name, data in pairs:
            yield from self._common(name, data, bid)

    def _common(self, name: str, data: np.ndarray, bid: int | None) -> Iterator[tuple[str, np.ndarray]]:
        ctx = self.ctx
        if name.startswith(("blk.", "token_embd", "output", "rope_")):  # already GGUF-named by the hook
            yield name, data
            return
        if ctx.decl.permute_qk:
            n_head = ctx.find_hparam(["n_heads", "num_attention_heads"])
            n_kv = ctx.find_hparam(["n_kv_heads", "num_key_value_heads"])
            if name.endswith(("q_proj.weight", "q_proj.bias")):
                data = _permute(data, n_head)
            if name.endswith(("k_proj.weight", "k_proj.bias")):
                data = _permute(data, n_kv)
        if name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.gate_up_proj.weight")):
            n_ff = data.shape[-2] // 2
            base = name.removesuffix(".weight").removesuffix(".gate_up_proj")
            yield self.gguf_name(f"{base}.gate_proj.weight"), data[..., :n_ff, :]
            yield self.gguf_name(f"{base}.up_proj.weight"), data[..., n_ff:, :]
            return
        if name.endswith("mlp.experts.down_proj"):
            yield self.gguf_name(name + ".weight"), data
            return
        if ".experts." in name and bid is not None and name.endswith(".weight") and data.ndim == 2:
            n_exp = ctx.find_hparam(["num_local_experts", "num_experts", "n_routed_experts"])
            layer = self.experts.setdefault(bid, {})
            layer[name] = data
            if len(layer) < n_exp * 3:
                return
            prefix = name[: name.index(".experts.")]
            for w in ("down_proj", "gate_proj", "up_proj"):
                stacked = np.stack([layer.pop(f"{prefix}.experts.{x}.{w}.weight") for x in range(n_exp)])
                yield self.gguf_name(f"{prefix}.experts.{w}.weight"), stacked
            return
        yield self.gguf_name(name), data


def _shape(data: np.ndarray) -> tuple[int, ...]:
    """The tensor's shape in elements: a uint8 array is MXFP4 blocks kept as they are (17 bytes per 32)."""
    if data.dtype == np.uint8:
        return (*data.shape[:-1], data.shape[-1] // 17 * 32)
    return tuple(data.shape)


def _tensor_type(name: str, data: np.ndarray, qtype: GGMLType) -> GGMLType:
    """prepare_tensors' choice: 1-D and norms F32, routers/position embeddings F32, the rest ``qtype``
    (Q8_0 falls back to F16 when a row is not a multiple of 32, as gguf-py's quantizer does); uint8
    arrays are MXFP4 blocks written as they are (gpt-oss's experts)."""
    if data.dtype == np.uint8:
        return GGMLType.MXFP4
    if data.ndim <= 1 or name.endswith("_norm.weight"):
        return GGMLType.F32
    if name.endswith(_F32_NAMES) or name[-7:] not in (".weight", ".lora_a", ".lora_b"):
        return GGMLType.F32
    if qtype == GGMLType.Q8_0 and data.shape[-1] % 32:
        return GGMLType.F16
    return qtype


# ---------------------------------------------------------------------------------------------


@dataclass
class ConvertResult:
    """What was (or, with ``dry_run``, would be) written."""

    paths: list[Path]
    arch: str
    tensors: list[tuple[str, tuple[int, ...], GGMLType]]
    metadata: dict[str, Any]
    n_params: int


def _guess_outtype(tensors: dict[str, SafeTensor]) -> str:
    for t in tensors.values():
        if len(t.shape) < 2:
            continue
        if t.dtype == "BF16":
            return "bf16"
        if t.dtype == "F16":
            return "f16"
        break
    return "f16"


def _param_counts(infos: list[tuple[str, tuple[int, ...]]]) -> tuple[int, int, int, int]:
    """gguf-py's GGUFWriter.get_total_parameter_count."""
    total = shared = expert = expert_sum = n_exp = 0
    for name, shape in infos:
        size = int(np.prod(shape))
        if "_exps." in name and len(shape) >= 3:
            count = shape[-2 if ".bias" in name else -3]
            expert += size // count
            expert_sum += count
            n_exp += 1
        else:
            shared += size
        total += size
    return total, shared, expert, (expert_sum // n_exp) if n_exp else 0


def _parse_outtype(outtype: str) -> tuple[str, Any]:
    """(the float/q8_0 type to convert to, the quantize mix after it or None)."""
    t = str(outtype).strip().lower()
    if t == "auto" or t in OUTTYPES:
        return t, None
    from ..quantize import QuantizeError, parse_ftype

    try:
        return "auto", parse_ftype(t)
    except QuantizeError:
        raise ConvertError(
            f"unknown output type {outtype!r} (auto, {', '.join(OUTTYPES)}, or a quantize type such as q4_k_m)"
        ) from None


def convert(
    hf_dir: str | os.PathLike,
    out: str | os.PathLike | None = None,
    outtype: str = "auto",
    *,
    vocab_only: bool = False,
    dry_run: bool = False,
    force: bool = False,
    model_name: str | None = None,
    metadata_file: str | os.PathLike | None = None,
    split_max_size: int = 0,
    imatrix: str | os.PathLike | None = None,
    base_model: str | os.PathLike | None = None,
    mmproj: bool = False,
    progress: Callable[[str], None] | None = None,
) -> ConvertResult:
    """Convert the checkpoint in ``hf_dir`` to GGUF at ``out`` (a file, or a directory for llama.cpp's
    default name ``<Name>-<Size>-<TYPE>.gguf``; default: in ``hf_dir``). ``outtype``: f32, f16, bf16,
    q8_0, auto (BF16 or F16 as the checkpoint stores its matrices), or a quantize mix (q4_k_m...: converted
    with auto, then quantized by ``llamapy.quantize.quantize_file`` with ``imatrix``). Raises
    :class:`ConvertError` on bad input; nothing is left at ``out`` then. A PEFT LoRA adapter directory
    (``adapter_config.json``) becomes a GGUF LoRA (``base_model``: the base model's directory, for its
    config.json). ``mmproj``: the vision projector's mmproj file instead (``llamapy.convert.mmproj``)."""
    if mmproj:
        from .mmproj import convert_mmproj

        if vocab_only or split_max_size:
            raise ConvertError("--mmproj writes one whole file: not with --vocab-only or --split-max-size")
        t = str(outtype).strip().lower()
        return convert_mmproj(hf_dir, out, t, dry_run, force, model_name, metadata_file, progress)
    if (Path(hf_dir) / "adapter_config.json").is_file():  # a PEFT LoRA adapter
        from .lora import convert_lora

        return convert_lora(hf_dir, base_model, out, outtype, force=force, dry_run=dry_run)
    base, mix = _parse_outtype(outtype)
    if mix is None:
        return _convert(hf_dir, out, base, vocab_only, dry_run, force, model_name, metadata_file, split_max_size,
                        progress, None)  # fmt: skip
    if vocab_only:
        raise ConvertError(
            "--vocab-only writes no tensors: give a float --outtype (f16, bf16, f32, q8_0 or auto)"
        )
    from ..quantize import quantize_file

    first = _convert(hf_dir, out, "auto", False, True, force, model_name, metadata_file, 0, None, mix.name)
    final = first.paths[0]
    if final.exists() and not force:
        raise ConvertError(f"{final} exists (use --force to overwrite it)")
    if dry_run:
        return ConvertResult([final], first.arch, first.tensors, first.metadata, first.n_params)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".unquantized.gguf", dir=final.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        mid = _convert(hf_dir, tmp, "auto", False, False, True, model_name, metadata_file, 0, progress, None)
        q = quantize_file(tmp, final, mix, imatrix=imatrix, force=force, progress=progress)
    finally:
        tmp.unlink(missing_ok=True)
    return ConvertResult([final], mid.arch, [(n, s, GGMLType[q.types()[n].upper()]) for n, s, _t in mid.tensors],
                         mid.metadata, mid.n_params)  # fmt: skip


def _convert(
    hf_dir: str | os.PathLike,
    out: str | os.PathLike | None,
    outtype: str,
    vocab_only: bool,
    dry_run: bool,
    force: bool,
    model_name: str | None,
    metadata_file: str | os.PathLike | None,
    split_max_size: int,
    progress: Callable[[str], None] | None,
    name_type: str | None,
) -> ConvertResult:
    import gguf

    logging.getLogger("gguf").setLevel(logging.ERROR)
    d, hp, arch0 = _checkpoint(hf_dir)
    fams = hf_families()
    decl = fams.get(arch0)
    if decl is None:
        raise ConvertError(
            f"architecture {arch0!r} (config.json 'architectures') cannot be converted: llamapy converts "
            f"{', '.join(sorted(fams))}"
        )
    if out is not None and not Path(out).is_dir() and Path(out).exists() and not force and not dry_run:
        raise ConvertError(f"{out} exists (use --force to overwrite it)")
    tensors: dict[str, SafeTensor] = {}
    files: list[SafetensorsFile] = []
    try:
        if not vocab_only:
            tensors, files = open_checkpoint(d)
        if outtype == "auto":
            outtype = _guess_outtype(tensors)
        file_type, qtype = OUTTYPES[outtype]
        try:
            ctx = _make_context(d, hp, decl, file_type, list(tensors))
            ctx.checkpoint = tensors
            plan = [] if vocab_only else _plan(ctx, tensors, qtype)
        except ConvertError:
            raise
        except (KeyError, ValueError, TypeError, ZeroDivisionError) as e:
            raise ConvertError(
                f"config.json: a hyper-parameter of {decl.arch} is missing or malformed ({e!r})"
            ) from None
        kv = gguf.GGUFWriter(path=None, arch=decl.arch)
        _metadata(ctx, kv, plan, d, model_name, metadata_file, vocab_only)
        md = {k: v.value for k, v in kv.kv_data[0].items()}
        n_params = _param_counts([(n, s) for n, s, _t, _k in plan])[0]
        fname = _default_name(md, name_type or outtype, vocab_only)
        out_path = d / fname if out is None else Path(out) / fname if Path(out).is_dir() else Path(out)
        groups = _split_groups(plan, split_max_size) if split_max_size and plan else [list(range(len(plan)))]
        paths = _split_paths(out_path, len(groups))
        result = ConvertResult(paths, decl.arch, [(n, s, t) for n, s, t, _k in plan], md, n_params)
        if dry_run:
            return result
        for p in paths:
            if p.exists() and not force:
                raise ConvertError(f"{p} exists (use --force to overwrite it)")
        _write(ctx, kv, plan, tensors, list(zip(paths, groups, strict=True)), progress)
        return result
    finally:
        for f in files:
            f.close()


def _default_name(md: dict[str, Any], outtype: str, vocab_only: bool) -> str:
    """llama.cpp's default file name (gguf-py's naming_convention)."""
    import gguf

    name = md.get("general.name")
    base, fine, ver, size = (
        md.get(f"general.{k}") for k in ("basename", "finetune", "version", "size_label")
    )
    if vocab_only:
        return f"{gguf.naming_convention(name, base, fine, ver, None, None, model_type='vocab')}.gguf"
    return f"{gguf.naming_convention(name, base, fine, ver, size, outtype.upper())}.gguf"


# (gguf name, shape, type, key to recompute it: the HF names it came from)
_Plan = list[tuple[str, tuple[int, ...], GGMLType, int]]


def _iter_converted(ctx: Context, tensors: dict[str, SafeTensor]) -> Iterator[tuple[str, np.ndarray]]:
    """Every GGUF tensor in llama.cpp's order, computed from the mapped weights one at a time."""
    mapper = _Mapper(ctx)
    decl = ctx.decl
    if decl.extra_tensors is not None and tensors:  # (none with --vocab-only)
        try:
            yield from decl.extra_tensors(ctx)
        except (KeyError, ValueError, TypeError) as e:
            raise ConvertError(
                f"config.json: cannot derive the extra tensors of {decl.arch} ({e!r})"
            ) from None
    for name, st in tensors.items():
        if name.endswith(_SKIP_SUFFIXES) or name in decl.skip:
            continue
        data = st.numpy()
        if data.dtype.kind == "f" and data.dtype != np.float32:
            data = data.astype(np.float32)
        try:
            yield from mapper(name, data)
        except ConvertError:
            raise
        except (ValueError, IndexError, TypeError, KeyError) as e:  # a shape the config does not explain
            raise ConvertError(
                f"tensor {name!r} {list(data.shape)}: does not match config.json ({e})"
            ) from None
    left = [n for layer in mapper.experts.values() for n in layer]
    if left:
        raise ConvertError(f"incomplete experts: {left[0]!r} and {len(left) - 1} more have no full set")


def _plan(ctx: Context, tensors: dict[str, SafeTensor], qtype: GGMLType) -> _Plan:
    plan: _Plan = []
    seen: set[str] = set()
    ctx.kv_early.clear()
    for i, (name, data) in enumerate(_iter_converted(ctx, tensors)):
        if name in seen:
            raise ConvertError(f"two HF tensors map to {name!r}")
        seen.add(name)
        plan.append((name, _shape(data), _tensor_type(name, data, qtype), i))
    _check_shapes(ctx, plan)
    return plan


def _check_shapes(ctx: Context, plan: _Plan) -> None:
    """The embeddings and attention projections against config.json (a mismatched checkpoint is an error
    here, not a file that fails to load)."""
    f = ctx.find_hparam
    n_embd = f(["hidden_size", "n_embd", "dim"], True)
    n_vocab = f(["vocab_size"], True)
    n_head = f(["num_attention_heads", "n_head", "n_heads"], True)
    head_dim = ctx.hparams.get("head_dim") or (n_embd // n_head if n_embd and n_head else None)
    if "qk_nope_head_dim" in ctx.hparams and "qk_rope_head_dim" in ctx.hparams:  # MLA's q heads
        head_dim = ctx.hparams["qk_nope_head_dim"] + ctx.hparams["qk_rope_head_dim"]
    want: dict[str, tuple[int, ...]] = {}
    if n_embd and n_vocab:
        want["token_embd.weight"] = (n_vocab, n_embd)
        want["output.weight"] = (n_vocab, n_embd)
    for il in range(ctx.block_count):
        if n_embd:
            want[f"blk.{il}.attn_norm.weight"] = (n_embd,)
            if n_head and head_dim:
                want[f"blk.{il}.attn_q.weight"] = (n_head * head_dim, n_embd)
    # Gemma 4's global layers: global_head_dim, or per_layer_config's head_dim
    per_layer = ctx.hparams.get("per_layer_config") or {}
    wide = {c.get("head_dim") for c in per_layer.values() if isinstance(c, dict)}
    wide.add(ctx.hparams.get("global_head_dim"))
    wide = {n_head * h for h in wide if isinstance(h, int) and n_head}
    for name, shape, _t, _k in plan:
        w = want.get(name)
        if w is not None and name == "token_embd.weight" and shape[1:] == w[1:] and shape[0] <= w[0]:
            continue  # Gemma 3 drops the rows past the tokenizer's
        if w is not None and name.endswith("attn_q.weight") and shape == (2 * w[0], *w[1:]):
            continue  # q and its output gate in one projection (Qwen3-Next, Qwen3.5)
        if w is not None and name.endswith("attn_q.weight") and shape[1:] == w[1:] and shape[0] in wide:
            continue  # Gemma 4's global layers: larger heads
        if w is not None and shape != w:
            raise ConvertError(f"tensor {name!r} has shape {list(shape)}, but config.json implies {list(w)}")


def _metadata(
    ctx: Context,
    kv: Any,
    plan: _Plan,
    d: Path,
    model_name: str | None,
    metadata_file: str | os.PathLike | None,
    vocab_only: bool,
) -> None:
    """prepare_metadata: general.*, hyper-parameters, quantization version, vocabulary."""
    import gguf

    total, shared, expert, n_exp = _param_counts([(n, s) for n, s, _t, _k in plan])
    mf = Path(metadata_file) if metadata_file is not None else None
    if mf is not None and not mf.is_file():
        raise ConvertError(f"{mf}: no such metadata file")
    try:
        meta = gguf.Metadata.load(mf, d, model_name, total)
    except Exception as e:  # its model-card heuristics parse README.md (YAML) and file names
        raise ConvertError(
            f"cannot read the model's metadata (README.md model card, --metadata): {e}"
        ) from None
    if meta.name is None:
        meta.name = d.resolve().name
    if meta.size_label is None and total > 0:
        meta.size_label = gguf.size_label(total, shared, expert, n_exp)
    for method, value in ctx.kv_early:
        getattr(kv, method)(value)
    kv.add_type(gguf.GGUFType.MODEL)
    meta.set_gguf_meta_model(kv)
    try:
        if ctx.decl.generic_params:
            generic_params(ctx, kv)
        if ctx.decl.vocab_size_key:
            kv.add_vocab_size(ctx.hparams["vocab_size"])
        if ctx.decl.rope_dim_key:
            rope_dim = (
                ctx.hparams.get("head_dim")
                or ctx.hparams["hidden_size"] // ctx.hparams["num_attention_heads"]
            )
            kv.add_rope_dimension_count(rope_dim)
        if ctx.decl.params is not None:
            ctx.decl.params(ctx, kv)
    except ConvertError:
        raise
    except (KeyError, ValueError, TypeError) as e:
        raise ConvertError(
            f"config.json: a hyper-parameter of {ctx.decl.arch} is missing or malformed ({e!r})"
        ) from None
    kv.add_quantization_version(gguf.GGML_QUANT_VERSION)
    try:
        ctx.kv = kv
        if callable(ctx.decl.vocab):
            ctx.decl.vocab(ctx, kv)
        else:
            ctx.set_vocab(ctx.decl.vocab)
    except ConvertError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConvertError(f"cannot read the tokenizer: {e}") from None


def _split_paths(out: Path, n: int) -> list[Path]:
    """One path, or llama.cpp's ``-00001-of-0000N.gguf`` names for ``n`` splits."""
    if n == 1:
        return [out]
    stem = str(out)[: -len(".gguf")] if str(out).endswith(".gguf") else str(out)
    return [Path(f"{stem}-{i + 1:05d}-of-{n:05d}.gguf") for i in range(n)]


def _nbytes(shape: tuple[int, ...], t: GGMLType) -> int:
    from ..ggml.types import TRAITS

    tr = TRAITS[t]
    return int(np.prod(shape)) // tr.block_size * tr.type_size


def _split_groups(plan: _Plan, max_size: int) -> list[list[int]]:
    """gguf-py's split: a new shard when the next tensor would take the current one past ``max_size``."""
    groups: list[list[int]] = [[]]
    size = 0
    for i, (_n, shape, t, _k) in enumerate(plan):
        nb = _nbytes(shape, t)
        if groups[-1] and size + nb > max_size:
            groups.append([])
            size = 0
        groups[-1].append(i)
        size += nb
    return groups


def _write(
    ctx: Context | None,
    kv: Any,
    plan: _Plan,
    tensors: dict[str, SafeTensor],
    parts: list[tuple[Path, list[int]]],
    progress: Callable[[str], None] | None,
    produce: Callable[[], Iterator[tuple[str, np.ndarray]]] | None = None,
) -> None:
    """Write the splits ``parts`` of ``plan``; the tensors come from ``produce`` (default: the text
    model's mapping of ``tensors``)."""
    from ..gguf import GGUFValueType
    from ..gguf.writer import GGUFWriter

    tmps: list[Path] = []
    writers: list[GGUFWriter] = []
    try:
        for si, (path, group) in enumerate(parts):
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            os.close(fd)
            tmps.append(Path(tmp))
            w = GGUFWriter(tmp)
            # the metadata goes to the first split only (gguf-py's layout); each split names its place
            items = list(kv.kv_data[0].items()) if si == 0 else []
            for key, val in items:
                w.add_key_value(key, val.value, GGUFValueType(int(val.type)), _sub_type(val))
            if len(parts) > 1:
                w.add_key_value("split.no", si, GGUFValueType.UINT16)
                w.add_key_value("split.count", len(parts), GGUFValueType.UINT16)
                w.add_key_value("split.tensors.count", len(plan), GGUFValueType.INT32)
            for i in group:
                name, shape, t, _k = plan[i]
                w.add_tensor_info(name, shape, t)
            writers.append(w)
        owner = {i: si for si, (_p, g) in enumerate(parts) for i in g}
        gen = produce() if produce is not None else _iter_converted(ctx, tensors)
        for i, (name, data) in enumerate(gen):
            pname, shape, t, _k = plan[i]
            if name != pname or _shape(data) != shape:
                raise ConvertError(f"tensor {name!r} changed between passes")
            writers[owner[i]].write_tensor_data(_encode(data, t), name)
            if progress is not None:
                progress(f"[{i + 1}/{len(plan)}] {name:<32} {t.name:<5} {list(reversed(shape))}")
        for w in writers:
            w.write()
        if not plan:  # gguf-py's vocab-only file ends with its metadata: no padding to the data section
            w = writers[0]
            head = 24 + sum(8 + len(k.encode("utf-8")) + len(v) for k, v in w._kv.items())
            os.truncate(tmps[0], head)
        for tmp, (path, _g) in zip(tmps, parts, strict=True):
            os.replace(tmp, path)
        tmps = []
    finally:
        for w in writers:
            w.abort()
        for tmp in tmps:
            tmp.unlink(missing_ok=True)


def _sub_type(val: Any) -> Any:
    """An array's element type as gguf-py packs it (``GGUFValueType.get_type`` of the first element)."""
    from ..gguf import GGUFValueType

    if val.sub_type is not None:
        return GGUFValueType(int(val.sub_type))
    if int(val.type) != int(GGUFValueType.ARRAY) or not len(val.value):
        return None
    first = val.value[0]
    if isinstance(first, (str, bytes, bytearray)):
        return GGUFValueType.STRING
    if isinstance(first, bool):
        return GGUFValueType.BOOL
    if isinstance(first, float):
        return GGUFValueType.FLOAT32
    if isinstance(first, int):
        return GGUFValueType.INT32
    return None


def _encode(data: np.ndarray, t: GGMLType) -> np.ndarray:
    from ..gguf.writer import _to_bf16

    if t == GGMLType.MXFP4:
        return np.ascontiguousarray(data)
    x = np.ascontiguousarray(data, dtype=np.float32)
    if t == GGMLType.F32:
        return x
    if t == GGMLType.F16:
        return x.astype(np.float16)
    if t == GGMLType.BF16:
        return _to_bf16(x)
    from ..ggml.quants import quantize

    return np.ascontiguousarray(quantize(x.reshape(-1, x.shape[-1]), t))
