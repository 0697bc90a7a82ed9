"""Flags shared by ``run``, ``chat`` (and other subcommands): model, context and sampling, with
llama.cpp's names (``-m -c -b -ub -t -ctk -ctv --temp --top-k ...``).

Values are checked while parsing, so a bad value is a usage error (exit status 2) before anything is
loaded. Heavy modules are imported only inside the helpers that load a model.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from typing import Any

from . import gcpause

#: ``model.hparams.PoolingType``'s names, spelled here so that building the parsers loads no model code
POOLING_NAMES = ("none", "mean", "cls", "last", "rank")
#: ``run`` repacks the weights (``--repack``) only when its prompt and ``-n`` add up to this many tokens: below
#: it, the one copy of each weight costs more than its faster kernels save
REPACK_MIN_TOKENS = 128
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


# ---------------------------------------------------------------------------------------------------
# value types (argparse turns their ArgumentTypeError into a usage error)


def _number(
    kind: Callable[[str], Any], lo: float | None = None, hi: float | None = None, what: str = "value"
):
    def parse(s: str) -> Any:
        try:
            v = kind(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not a valid {what}") from None
        if v != v or (lo is not None and v < lo) or (hi is not None and v > hi):  # (v != v: NaN)
            rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise argparse.ArgumentTypeError(f"{s!r} is out of range ({what} must be {rng})")
        return v

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def _logit_bias(s: str) -> tuple[int, float]:
    """llama.cpp's ``-l TOKEN_ID(+/-)BIAS``, e.g. ``15043+1`` or ``15043-inf``."""
    for i in range(1, len(s)):
        if s[i] in "+-":
            try:
                return int(s[:i]), float(s[i:])
            except ValueError:
                break
    raise argparse.ArgumentTypeError(f"{s!r} is not TOKEN_ID(+/-)BIAS, e.g. 15043+1 or 15043-inf")


def _device(s: str) -> int:
    """llama.cpp's ``-dev``: ``none`` (-1: the CPU only) or ``CUDA<i>`` (the GPU index i)."""
    v = s.strip().lower()
    if v == "none":
        return -1
    if v.startswith("cuda") and v[4:].isdigit():
        return int(v[4:])
    raise argparse.ArgumentTypeError(f"invalid device: {s} (none or CUDA<i>)")


def add_escape_args(p: argparse._ActionsContainer, what: str = "-p") -> None:
    """llama.cpp's ``-e/--escape`` (the default) and ``--no-escape``: \\n, \\t, \\xNN... in ``what``."""
    p.add_argument("-e", "--escape", dest="escape", action="store_true", default=True,
                   help=f"process escapes (\\n, \\t, \\xNN...) in {what} (the default, as llama.cpp)")  # fmt: skip
    p.add_argument("--no-escape", dest="escape", action="store_false", help=f"take {what} literally")


def escaped(args: argparse.Namespace, text: str) -> str:
    """``text`` with llama.cpp's escapes processed, unless ``--no-escape``."""
    if not getattr(args, "escape", False) or "\\" not in text:
        return text
    from .tokenize import process_escapes

    return process_escapes(text.encode("utf-8", "surrogateescape")).decode("utf-8", "replace")


def _on_off(s: str) -> bool | None:
    v = s.lower()
    if v in ("on", "1", "true", "yes"):
        return True
    if v in ("off", "0", "false", "no"):
        return False
    if v == "auto":
        return None
    raise argparse.ArgumentTypeError(f"{s!r} is not one of on, off, auto")


uint = _number(int, 0, what="count")
int_ = _number(int, what="integer")
float_ = _number(float, what="number")
prob = _number(float, 0.0, 1.0, what="probability")


# ---------------------------------------------------------------------------------------------------
# flag groups


def add_cache_type_args(g: Any) -> None:
    """``-ctk``/``-ctv``: the KV cache's key and value types (``ContextParams.type_k``/``type_v``)."""
    g.add_argument("-ctk", "--cache-type-k", choices=CACHE_TYPES, default="f16", metavar="TYPE")
    g.add_argument("-ctv", "--cache-type-v", choices=CACHE_TYPES, default="f16", metavar="TYPE")


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and context")
    g.add_argument(
        "-m",
        "--model",
        metavar="FNAME",
        help="GGUF file or known model name (default: smollm2-135m-instruct)",
    )
    g.add_argument(
        "-c",
        "--ctx-size",
        type=uint,
        default=4096,
        metavar="N",
        help="context size (0 = the model's training context, lowered to fit in memory as llama.cpp's --fit)",
    )
    g.add_argument("-b", "--batch-size", type=_number(int, 1, what="batch size"), default=2048, metavar="N")
    g.add_argument("-ub", "--ubatch-size", type=_number(int, 1, what="batch size"), default=512, metavar="N")
    g.add_argument("-t", "--threads", type=int_, default=-1, metavar="N", help="threads (-1 = all cores)")
    add_cache_type_args(g)
    g.add_argument("-fa", "--flash-attn", type=_on_off, default=None, metavar="on|off|auto")
    g.add_argument(
        "-ngl", "--n-gpu-layers", "--gpu-layers", type=int_, default=0, metavar="N",
        help="the last N layers on the CUDA backend (-1 = all; needs llamapy[cuda], else the CPU with a warning)",
    )  # fmt: skip
    g.add_argument("-mg", "--main-gpu", type=int_, default=0, metavar="I", help="the GPU to use")
    g.add_argument(
        "-dev", "--device", type=_device, default=None, metavar="none|CUDA<i>",
        help="none: every layer on the CPU (whatever -ngl says); CUDA<i>: the GPU of -mg i",
    )  # fmt: skip
    g.add_argument("-kvo", "--kv-offload", dest="offload_kqv", action="store_true", default=True,
                   help="the KV cache of offloaded layers on the GPU (the default)")  # fmt: skip
    g.add_argument(
        "-nkvo", "--no-kv-offload", dest="offload_kqv", action="store_false", help="the KV cache on the CPU"
    )
    g.add_argument(
        "--no-mmap", dest="use_mmap", action="store_false", help="read the file instead of mapping it"
    )
    g.add_argument("--mlock", action="store_true", help="keep the model in RAM")
    g.add_argument(
        "--repack", dest="repack", action="store_const", const=True, default=None,
        help="copy the weights into the kernels' 8-row layouts on first use: faster prompts and decode, one "
        "copy of each weight (default: on, except in a run whose prompt and -n together are under "
        f"{REPACK_MIN_TOKENS} tokens)",
    )  # fmt: skip
    g.add_argument(
        "-nr",
        "--no-repack",
        dest="repack",
        action="store_const",
        const=False,
        help="the file's rows as they are",
    )
    g.add_argument("--lora", action="append", default=[], metavar="FILE", help="LoRA adapter (repeatable)")
    g.add_argument(
        "--lora-scaled", nargs=2, action="append", default=[], metavar=("FILE", "SCALE"),
        help="LoRA adapter with a scale (repeatable)",
    )  # fmt: skip
    g.add_argument("--context-shift", action="store_true", help="when the context is full, drop old tokens")
    g.add_argument("--no-context-shift", dest="context_shift", action="store_false", help="(the default)")
    g.add_argument(
        "--keep", type=int_, default=0, metavar="N", help="tokens of the prompt kept on a shift (-1 = all)"
    )
    g.add_argument("-v", "--verbose", "--log-verbose", action="store_true", help="more logs on stderr")
    add_rope_args(p)
    add_hf_args(p)


class _LastScale(argparse.Action):
    """``--rope-scale`` and ``--rope-freq-scale`` both set llama.cpp's ``rope_freq_scale``: the value is kept
    as given (checked by :func:`rope_kwargs`) and the later flag of the two wins."""

    def __call__(
        self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None
    ) -> None:
        setattr(namespace, self.dest, values)
        namespace.rope_scale_last = self.dest


def add_rope_args(p: argparse.ArgumentParser) -> None:
    """llama.cpp's context-extension flags (RoPE scaling, ``common/arg.cpp``) and ``--override-kv``. Their
    values are checked when the command runs (:func:`rope_kwargs`): a bad one is ``error: ...``, exit 1."""
    g = p.add_argument_group("context extension (RoPE scaling) and metadata overrides, as llama.cpp")
    g.add_argument("--rope-scaling", metavar="{none,linear,yarn}", default=None,
                   help="RoPE frequency scaling method (default: the model's; linear when it names none)")  # fmt: skip
    g.add_argument("--rope-scale", action=_LastScale, default=None, metavar="N",
                   help="RoPE context scaling factor: expands the context N times (--rope-freq-scale 1/N)")  # fmt: skip
    g.add_argument(
        "--rope-freq-base", default=None, metavar="N", help="RoPE base frequency (default: the model's)"
    )
    g.add_argument("--rope-freq-scale", action=_LastScale, default=None, metavar="N",
                   help="RoPE frequency scaling factor: expands the context 1/N times (default: the model's)")  # fmt: skip
    g.add_argument("--yarn-orig-ctx", default=None, metavar="N",
                   help="YaRN: the model's original context (default: the model's, else its training context)")  # fmt: skip
    g.add_argument("--yarn-ext-factor", default=None, metavar="N",
                   help="YaRN: extrapolation mix factor (default: 1 with yarn, else 0; 0.0 = full interpolation)")  # fmt: skip
    g.add_argument("--yarn-attn-factor", default=None, metavar="N",
                   help="YaRN: attention magnitude (default: the model's; YaRN's own while extrapolating)")  # fmt: skip
    g.add_argument("--yarn-beta-slow", default=None, metavar="N",
                   help="YaRN: high correction dim or alpha (default: the model's, 1)")  # fmt: skip
    g.add_argument("--yarn-beta-fast", default=None, metavar="N",
                   help="YaRN: low correction dim or beta (default: the model's, 32)")  # fmt: skip
    g.add_argument("--override-kv", action="append", default=[], metavar="KEY=TYPE:VALUE,...",
                   help="override model metadata (TYPE int, float, bool, str; comma-separated, repeatable), e.g. "
                   "tokenizer.ggml.add_bos_token=bool:false")  # fmt: skip


def _flag_number(flag: str, v: Any, integer: bool = False) -> Any:
    from ..context import ContextParamError

    try:
        x = int(str(v).strip()) if integer else float(str(v).strip())
    except ValueError:
        raise ContextParamError(f"{flag} {v!r}: not {'an integer' if integer else 'a number'}") from None
    if not integer and not math.isfinite(x):
        raise ContextParamError(f"{flag} {v!r}: not a finite number")
    return x


def rope_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The RoPE flags given as :class:`llamapy.api.Llama` / :class:`llamapy.context.ContextParams`
    arguments (``--rope-scale N`` is ``rope_freq_scale = 1/N``); a bad value is a
    :class:`~llamapy.context.ContextParamError` naming the flag."""
    from ..context import ContextParamError

    kw: dict[str, Any] = {}
    st = getattr(args, "rope_scaling", None)
    if st is not None:
        name = str(st).strip().lower()
        if name not in ("none", "linear", "yarn"):
            raise ContextParamError(f"--rope-scaling {st!r}: expected none, linear or yarn")
        kw["rope_scaling_type"] = name
    order = ["rope_scale", "rope_freq_scale"]  # the later of the two given wins
    if getattr(args, "rope_scale_last", None) == "rope_scale":
        order.reverse()
    for dest in order:
        v = getattr(args, dest, None)
        if v is None:
            continue
        flag = "--" + dest.replace("_", "-")
        x = _flag_number(flag, v)
        if dest == "rope_scale":
            if x <= 0:
                raise ContextParamError(f"{flag} {v!r}: the factor must be above 0")
            kw["rope_freq_scale"] = 1.0 / x
        else:
            if x < 0:
                raise ContextParamError(f"{flag} {v!r}: must be above 0 (0: the model's)")
            kw["rope_freq_scale"] = x
    v = getattr(args, "rope_freq_base", None)
    if v is not None:
        x = _flag_number("--rope-freq-base", v)
        if x < 0:
            raise ContextParamError(f"--rope-freq-base {v!r}: must be above 0 (0: the model's)")
        kw["rope_freq_base"] = x
    v = getattr(args, "yarn_orig_ctx", None)
    if v is not None:
        n = _flag_number("--yarn-orig-ctx", v, integer=True)
        if n < 0:
            raise ContextParamError(f"--yarn-orig-ctx {v!r}: must be 0 (the model's) or more")
        kw["yarn_orig_ctx"] = n
    for dest in ("yarn_ext_factor", "yarn_attn_factor", "yarn_beta_slow", "yarn_beta_fast"):
        v = getattr(args, dest, None)
        if v is not None:  # (negative: the model's, as llama.cpp's defaults of -1)
            kw[dest] = _flag_number("--" + dest.replace("_", "-"), v)
    return kw


def kv_overrides_arg(args: argparse.Namespace) -> list[Any]:
    """``--override-kv`` values as :class:`llamapy.gguf.overrides.KVOverride` items (a malformed one is a
    :class:`~llamapy.gguf.overrides.KVOverrideError` naming the flag)."""
    from ..gguf.overrides import KVOverrideError, parse_kv_overrides

    out: list[Any] = []
    for v in getattr(args, "override_kv", None) or []:
        try:
            out += parse_kv_overrides(v)
        except KVOverrideError as e:
            raise KVOverrideError(f"--override-kv: {e}") from None
    return out


def add_hf_args(p: argparse.ArgumentParser) -> None:
    """llama.cpp's Hugging Face flags: ``-hf user/repo[:quant]``, ``-hff FILE``, ``--hf-token``, ``--offline``,
    ``--no-mmproj`` (downloads through huggingface_hub into its cache)."""
    h = p.add_argument_group("Hugging Face Hub")
    h.add_argument(
        "-hf", "-hfr", "--hf-repo", metavar="USER/REPO[:QUANT]", default=None,
        help="model from a Hugging Face repo; the quant picks the file (default Q4_K_M, then Q8_0, then the first)",
    )  # fmt: skip
    h.add_argument("-hff", "--hf-file", metavar="FILE", default=None, help="this file of the -hf repo")
    h.add_argument(
        "-hft", "--hf-token", metavar="TOKEN", default=None, help="Hugging Face token (default: $HF_TOKEN)"
    )
    h.add_argument(
        "--offline", action="store_true", help="use the cache only, never the network (as HF_HUB_OFFLINE=1)"
    )
    h.add_argument(
        "--no-mmproj", action="store_true", help="do not fetch or use the -hf repo's multimodal projector"
    )


def resolve_model_args(args: argparse.Namespace) -> Any:
    """The model file of ``-m`` or ``-hf``/``-hff`` (a Path; downloaded once). With ``-hf``, the repo's
    ``mmproj`` file comes along and becomes ``args.mmproj`` where the subcommand takes one."""
    from .. import hub
    from ..errors import LlamapyError

    token = getattr(args, "hf_token", None)
    offline = bool(getattr(args, "offline", False))
    repo = getattr(args, "hf_repo", None)
    if repo:
        if args.model:
            raise LlamapyError("give the model with -m or with -hf, not both")
        takes_mmproj = hasattr(args, "mmproj") and not getattr(args, "no_mmproj", False)
        m = hub.hf.download(
            repo, hf_file=args.hf_file, token=token, offline=offline, mmproj=takes_mmproj and not args.mmproj
        )
        if m.mmproj is not None:
            args.mmproj = str(m.mmproj)
            log(f"llamapy: {m.name}: multimodal projector {m.mmproj_file} (images on; --no-mmproj to skip)")
        return m.path
    if getattr(args, "hf_file", None):
        raise LlamapyError("-hff FILE needs -hf USER/REPO")
    return hub.resolve_model(args.model, offline=offline, token=token)


def hf_model_or(args: argparse.Namespace, resolve: Callable[[str], Any]) -> Any:
    """For subcommands without a default model: the ``-hf`` model when given, else ``resolve(args.model)``;
    neither is an error."""
    from ..errors import LlamapyError

    if getattr(args, "hf_repo", None) or getattr(args, "hf_file", None):
        return resolve_model_args(args)
    if not args.model:
        raise LlamapyError("give a model with -m FILE or -hf USER/REPO[:QUANT]")
    return resolve(args.model)


def add_mtmd_args(p: argparse.ArgumentParser, images: bool = True) -> None:
    """``--mmproj`` (and ``--image``): image input through a multimodal projector file."""
    g = p.add_argument_group("images (multimodal)")
    g.add_argument(
        "-mm", "--mmproj", metavar="FNAME", help="multimodal projector GGUF (vision encoder) for images"
    )
    if images:
        g.add_argument(
            "--image", action="append", default=[], metavar="FNAME",
            help="image file (repeatable); placed at each <__media__> in the prompt, else before it",
        )  # fmt: skip
        g.add_argument(
            "--audio", action="append", dest="image", metavar="FNAME",
            help="audio file, WAV/FLAC/OGG/MP3 (repeatable; an mmproj with an audio encoder), placed as --image",
        )  # fmt: skip
    g.add_argument("--mmproj-cache-mb", type=_number(float, 0, 2**30, what="size"), default=None, metavar="MB",
                   help="image/audio embeddings kept to skip encoding them again (default 256; 0: off)")  # fmt: skip


def add_sampling_args(p: argparse.ArgumentParser, constrained: bool = True) -> None:
    """llama.cpp's sampling flags; ``constrained``: also the grammar and JSON-schema flags."""
    g = p.add_argument_group("sampling (llama.cpp's flags and defaults)")
    g.add_argument("-s", "--seed", type=int_, default=-1, metavar="SEED", help="RNG seed (-1 = random)")
    g.add_argument("--samplers", default=None, metavar="LIST", help="sampler order, ';'-separated names")
    g.add_argument(
        "--sampling-seq", "--sampler-seq", default=None, metavar="SEQ", help="sampler order as letters"
    )
    g.add_argument("--ignore-eos", action="store_true", help="do not stop at end-of-generation tokens")
    g.add_argument("--temp", "--temperature", type=float_, default=0.8, metavar="T")
    g.add_argument("--top-k", type=int_, default=40, metavar="N")
    g.add_argument("--top-p", type=float_, default=0.95, metavar="P")
    g.add_argument("--min-p", type=float_, default=0.05, metavar="P")
    g.add_argument("--top-nsigma", "--top-n-sigma", type=float_, default=-1.0, metavar="N")
    g.add_argument("--xtc-probability", type=prob, default=0.0, metavar="P")
    g.add_argument("--xtc-threshold", type=float_, default=0.1, metavar="T")
    g.add_argument("--typical", "--typical-p", type=float_, default=1.0, metavar="P")
    g.add_argument("--repeat-last-n", type=_number(int, -1, what="count"), default=64, metavar="N")
    g.add_argument("--repeat-penalty", type=float_, default=1.0, metavar="X")
    g.add_argument("--presence-penalty", type=float_, default=0.0, metavar="X")
    g.add_argument("--frequency-penalty", type=float_, default=0.0, metavar="X")
    g.add_argument("--dry-multiplier", type=float_, default=0.0, metavar="X")
    g.add_argument("--dry-base", type=float_, default=1.75, metavar="X")
    g.add_argument("--dry-allowed-length", type=int_, default=2, metavar="N")
    g.add_argument("--dry-penalty-last-n", type=_number(int, -1, what="count"), default=-1, metavar="N")
    g.add_argument("--dry-sequence-breaker", action="append", default=None, metavar="STR")
    g.add_argument("--dynatemp-range", type=float_, default=0.0, metavar="X")
    g.add_argument("--dynatemp-exp", type=float_, default=1.0, metavar="X")
    g.add_argument("--mirostat", type=_number(int, 0, 2, what="mirostat mode"), default=0, metavar="N")
    g.add_argument("--mirostat-lr", type=float_, default=0.1, metavar="ETA")
    g.add_argument("--mirostat-ent", type=float_, default=5.0, metavar="TAU")
    g.add_argument(
        "-l", "--logit-bias", type=_logit_bias, action="append", default=[], metavar="TOKEN(+/-)BIAS"
    )
    if not constrained:
        return
    c = p.add_argument_group("constrained output (one of)").add_mutually_exclusive_group()
    c.add_argument("--grammar", default=None, metavar="GRAMMAR",
                   help="a GBNF grammar (or llguidance Lark after %%llguidance) the output must follow")  # fmt: skip
    c.add_argument("--grammar-file", default=None, metavar="FNAME", help="read the grammar from a file")
    c.add_argument("-j", "--json-schema", default=None, metavar="SCHEMA",
                   help="a JSON schema the output must follow, e.g. '{}' for any JSON object")  # fmt: skip
    c.add_argument(
        "-jf", "--json-schema-file", default=None, metavar="FILE", help="read the JSON schema from a file"
    )


def add_generation_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("generation")
    g.add_argument("-n", "--n-predict", "--predict", type=_number(int, -1, what="count"), default=-1, metavar="N",
                   help="tokens to generate (-1 = until the end of generation)")  # fmt: skip
    g.add_argument("-r", "--reverse-prompt", action="append", default=[], metavar="TEXT", help="stop at TEXT")
    g.add_argument("-sp", "--special", action="store_true", help="print special tokens")
    add_spec_args(p)


def add_spec_args(p: argparse.ArgumentParser, n_max: bool = True) -> None:
    """llama.cpp's self-speculative decoding flags (``--spec-type``; greedy output is unchanged);
    ``n_max``: also ``--spec-draft-n-max`` (serve has its own, shared with ``-md``)."""
    from ..generation.speculative import SPEC_TYPES

    g = p.add_argument_group("speculative decoding (the output is the same, faster when drafts hold)")
    g.add_argument("--spec-type", choices=SPEC_TYPES, default=None,
                   help="draft from n-grams of the text so far, or from the model's own MTP layer")  # fmt: skip
    if n_max:
        g.add_argument("--spec-draft-n-max", "--draft-max", "--draft", "--draft-n", dest="spec_n_max", type=_number(int, 1, what="count"),
                       default=None, metavar="N", help="most tokens drafted per step (mtp: 3)")  # fmt: skip
    for kind in ("simple", "map-k"):
        g.add_argument(f"--spec-ngram-{kind}-size-n", dest="spec_size_n", type=_number(int, 1, what="count"),
                       default=None, metavar="N", help=f"ngram-{kind}: key length (default 12)")  # fmt: skip
        g.add_argument(f"--spec-ngram-{kind}-size-m", dest="spec_size_m", type=_number(int, 1, what="count"),
                       default=None, metavar="M", help=f"ngram-{kind}: draft length (default 48)")  # fmt: skip
        g.add_argument(f"--spec-ngram-{kind}-min-hits", dest="spec_min_hits", type=_number(int, 1, what="count"),
                       default=1, metavar="H", help=f"ngram-{kind}: least hits of a key to draft")  # fmt: skip


# ---------------------------------------------------------------------------------------------------
# from flags to objects


def sampling_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling flags as llama.cpp's ``common_params_sampling`` field names."""
    kw: dict[str, Any] = dict(
        seed=args.seed,
        temp=args.temp,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        top_n_sigma=args.top_nsigma,
        xtc_probability=args.xtc_probability,
        xtc_threshold=args.xtc_threshold,
        typ_p=args.typical,
        penalty_last_n=args.repeat_last_n,
        penalty_repeat=args.repeat_penalty,
        penalty_freq=args.frequency_penalty,
        penalty_present=args.presence_penalty,
        dry_multiplier=args.dry_multiplier,
        dry_base=args.dry_base,
        dry_allowed_length=args.dry_allowed_length,
        dry_penalty_last_n=args.dry_penalty_last_n,
        dynatemp_range=args.dynatemp_range,
        dynatemp_exponent=args.dynatemp_exp,
        mirostat=args.mirostat,
        mirostat_tau=args.mirostat_ent,
        mirostat_eta=args.mirostat_lr,
        ignore_eos=args.ignore_eos,
        logit_bias=dict(args.logit_bias),
    )
    if args.dry_sequence_breaker is not None:
        kw["dry_sequence_breakers"] = (
            []
            if args.dry_sequence_breaker == ["none"]
            else [escaped(args, b) for b in args.dry_sequence_breaker]
        )
    if args.samplers is not None:
        kw["samplers"] = [s for s in args.samplers.replace(",", ";").split(";") if s]
    elif args.sampling_seq is not None:
        kw["samplers"] = args.sampling_seq
    return kw


def sampling_params(args: argparse.Namespace) -> Any:
    """The :class:`llamapy.sampling.SamplingParams` of the sampling flags (a negative seed: a random one)."""
    from ..sampling import LLAMA_DEFAULT_SEED, SamplingParams, sampler_chars

    kw = sampling_kwargs(args)
    if isinstance(kw.get("samplers"), str):  # --sampling-seq letters
        kw["samplers"] = sampler_chars(kw["samplers"])
    if kw["seed"] < 0:
        kw["seed"] = LLAMA_DEFAULT_SEED  # a random seed
    return SamplingParams(**kw)


def read_text(path: str, what: str) -> str:
    from ..errors import LlamapyError

    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise LlamapyError(f"{what} {path}: {e.strerror or e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise LlamapyError(f"{what} {path}: not UTF-8 text (byte {e.start})") from None


def grammar_from_args(args: argparse.Namespace) -> Any:
    """The :class:`llamapy.grammar.LlamaGrammar` of ``--grammar``/``--grammar-file``/``-j``/``-jf``
    (None without them); a bad grammar raises :class:`llamapy.grammar.GrammarError` before any model loads."""
    flags = ("grammar", "grammar_file", "json_schema", "json_schema_file")
    if all(getattr(args, k, None) is None for k in flags):
        return None  # before the import: llguidance costs ~35 ms of every start
    from ..grammar import LlamaGrammar

    if args.grammar is not None:
        return LlamaGrammar.from_string(args.grammar)
    if args.grammar_file is not None:
        return LlamaGrammar.from_string(read_text(args.grammar_file, "grammar file"))
    if args.json_schema is not None:
        return LlamaGrammar.from_json_schema(args.json_schema)
    if args.json_schema_file is not None:
        return LlamaGrammar.from_json_schema(read_text(args.json_schema_file, "JSON schema file"))
    return None


def llama_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Model/context flags as :class:`llamapy.api.Llama` constructor arguments."""
    kw = dict(
        n_ctx=args.ctx_size,
        n_batch=args.batch_size,
        n_ubatch=args.ubatch_size,
        n_threads=None if args.threads <= 0 else args.threads,
        n_gpu_layers=0 if getattr(args, "device", None) == -1 else args.n_gpu_layers,
        main_gpu=getattr(args, "main_gpu", 0) if getattr(args, "device", None) in (None, -1) else args.device,
        offload_kqv=getattr(args, "offload_kqv", True),
        repack=getattr(args, "repack", None) is not False,
        use_mmap=args.use_mmap,
        use_mlock=args.mlock,
        type_k=args.cache_type_k,
        type_v=args.cache_type_v,
        flash_attn=args.flash_attn,
        context_shift=args.context_shift,
        seed=args.seed,
        verbose=args.verbose,
    )
    if getattr(args, "mmproj", None):
        kw["mmproj"] = args.mmproj
    kw.update(rope_kwargs(args))  # --rope-scaling, --rope-scale, --yarn-*...
    overrides = kv_overrides_arg(args)
    if overrides:
        kw["kv_overrides"] = overrides
    return kw


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load_llama(args: argparse.Namespace) -> Any:
    """Resolve ``-m`` (path, known name, or the default model) and load it as a ``Llama``."""
    from ..api import Llama

    kw = llama_kwargs(args)  # (a bad flag value fails before anything is fetched or loaded)
    path = resolve_model_args(args)
    t0 = time.perf_counter()
    kw["verbose"] = False  # the one-line summary below instead
    llm = Llama(str(path), **kw)
    m = llm.model
    if llm.ctx is not None and (args.lora or args.lora_scaled):
        from ..model.lora import LoraAdapter

        for f, scale in [(f, 1.0) for f in args.lora] + list(args.lora_scaled):
            try:
                s = float(scale)
            except ValueError:
                raise SystemExit(f"--lora-scaled {f} {scale}: the scale must be a number") from None
            llm.ctx.set_adapter_lora(LoraAdapter.load(f, m), s)
    if getattr(args, "spec_type", None) and llm.ctx is not None:
        from ..generation.speculative import make_spec_draft

        llm.draft_model = make_spec_draft(
            args.spec_type, m, n_draft=args.spec_n_max, size_n=args.spec_size_n, size_m=args.spec_size_m,
            min_hits=args.spec_min_hits, n_ctx=llm.n_ctx(), n_threads=kw["n_threads"],
        )  # fmt: skip
    if getattr(args, "mmproj_cache_mb", None) is not None and llm.mtmd is not None:
        llm.mtmd.embd_cache.resize(int(args.mmproj_cache_mb * 2**20))
    log(
        f"llamapy: loaded {path.name} ({m.desc}, {m.size / 2**20:.0f} MiB) in {time.perf_counter() - t0:.2f} s, "
        f"n_ctx = {llm.n_ctx()}"
    )
    gcpause.resume()
    return llm
