"""llama.cpp's environment variables (``LLAMA_ARG_MODEL``, ``LLAMA_ARG_CTX_SIZE``, ``LLAMA_ARG_PORT``...), as in
its docker images: a variable stands for its flag, and a flag given on the command line wins over it.

As llama.cpp's tools built on its common arguments (llama-cli, llama-completion, llama-server,
llama-embedding, llama-perplexity, llama-imatrix) read the variables of the flags they accept, so do
``llamapy run``, ``chat``, ``serve``, ``embed``, ``perplexity`` and ``imatrix``: each reads the variables whose
flag it accepts (``LLAMA_ARG_CTX_SIZE`` everywhere, ``LLAMA_ARG_PORT`` in ``serve`` only). ``bench`` and
``quantize`` read none (llama-bench and llama-quantize parse their own flags). ``benchmarks/cli_vs_llamacpp.py``
lists llama-server's. As llama.cpp's: a switch is on for ``1``/``true``/``on``/``enabled`` and off (its
``--no-`` form, where it has one) for ``0``/``false``/``off``/``disabled``.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence

# variable -> (llamapy serve's spellings of the flag, takes a value, the negated spelling or None)
SERVE_ENV: dict[str, tuple[tuple[str, ...], bool, str | None]] = {
    "LLAMA_ARG_MODEL": (("-m", "--model"), True, None),
    "LLAMA_ARG_HF_REPO": (("-hf", "-hfr", "--hf-repo"), True, None),
    "LLAMA_ARG_HF_FILE": (("-hff", "--hf-file"), True, None),
    "LLAMA_ARG_OFFLINE": (("--offline",), False, None),
    "LLAMA_ARG_ALIAS": (("-a", "--alias"), True, None),
    "LLAMA_ARG_HOST": (("--host",), True, None),
    "LLAMA_ARG_PORT": (("--port",), True, None),
    "LLAMA_ARG_THREADS": (("-t", "--threads"), True, None),
    "LLAMA_ARG_CTX_SIZE": (("-c", "--ctx-size"), True, None),
    "LLAMA_ARG_N_PARALLEL": (("-np", "--parallel"), True, None),
    "LLAMA_ARG_N_PREDICT": (("-n", "--n-predict", "--predict"), True, None),
    "LLAMA_ARG_BATCH": (("-b", "--batch-size"), True, None),
    "LLAMA_ARG_UBATCH": (("-ub", "--ubatch-size"), True, None),
    "LLAMA_ARG_CACHE_TYPE_K": (("-ctk", "--cache-type-k"), True, None),
    "LLAMA_ARG_CACHE_TYPE_V": (("-ctv", "--cache-type-v"), True, None),
    "LLAMA_ARG_CONTEXT_SHIFT": (("--context-shift",), False, None),
    "LLAMA_ARG_CACHE_REUSE": (("--cache-reuse",), True, None),
    "LLAMA_ARG_TEMPERATURE": (("--temp", "--temperature"), True, None),
    "LLAMA_ARG_TOP_K": (("--top-k",), True, None),
    "LLAMA_ARG_TOP_P": (("--top-p",), True, None),
    "LLAMA_ARG_MIN_P": (("--min-p",), True, None),
    "LLAMA_ARG_REPEAT_PENALTY": (("--repeat-penalty",), True, None),
    "LLAMA_ARG_PRESENCE_PENALTY": (("--presence-penalty",), True, None),
    "LLAMA_ARG_FREQUENCY_PENALTY": (("--frequency-penalty",), True, None),
    "LLAMA_ARG_POOLING": (("--pooling",), True, None),
    "LLAMA_ARG_EMBEDDINGS": (("--embedding", "--embeddings"), False, None),
    "LLAMA_ARG_RERANKING": (("--reranking", "--rerank"), False, None),
    "LLAMA_ARG_MMPROJ": (("-mm", "--mmproj"), True, None),
    "LLAMA_API_KEY": (("--api-key",), True, None),
    "LLAMA_ARG_API_KEY_FILE": (("--api-key-file",), True, None),
    "LLAMA_ARG_API_PREFIX": (("--api-prefix",), True, None),
    "LLAMA_ARG_SSL_KEY_FILE": (("--ssl-key-file",), True, None),
    "LLAMA_ARG_SSL_CERT_FILE": (("--ssl-cert-file",), True, None),
    "LLAMA_ARG_STATIC_PATH": (("--path", "--webui-dir"), True, None),
    "LLAMA_ARG_UI": (("--webui",), False, "--no-webui"),
    "LLAMA_ARG_ENDPOINT_METRICS": (("--metrics",), False, None),
    "LLAMA_ARG_ENDPOINT_SLOTS": (("--slots",), False, "--no-slots"),
    "LLAMA_ARG_CHAT_TEMPLATE": (("--chat-template",), True, None),
    "LLAMA_ARG_CHAT_TEMPLATE_FILE": (("--chat-template-file",), True, None),
    "LLAMA_ARG_CHAT_TEMPLATE_KWARGS": (("--chat-template-kwargs",), True, None),
    "LLAMA_ARG_REASONING": (("-rea", "--reasoning"), True, None),
    "LLAMA_ARG_THINK": (("--reasoning-format",), True, None),
    "LLAMA_ARG_THINK_BUDGET": (("--reasoning-budget",), True, None),
    "LLAMA_ARG_REASONING_EFFORT": (("--reasoning-effort",), True, None),
    "LLAMA_ARG_MODELS_DIR": (("--models-dir",), True, None),
    "LLAMA_ARG_MODELS_PRESET": (("--models-preset",), True, None),
    "LLAMA_ARG_MODELS_MAX": (("--models-max",), True, None),
    "LLAMA_ARG_ROPE_SCALING_TYPE": (("--rope-scaling",), True, None),
    "LLAMA_ARG_ROPE_SCALE": (("--rope-scale",), True, None),
    "LLAMA_ARG_ROPE_FREQ_BASE": (("--rope-freq-base",), True, None),
    "LLAMA_ARG_ROPE_FREQ_SCALE": (("--rope-freq-scale",), True, None),
    "LLAMA_ARG_YARN_ORIG_CTX": (("--yarn-orig-ctx",), True, None),
    "LLAMA_ARG_YARN_EXT_FACTOR": (("--yarn-ext-factor",), True, None),
    "LLAMA_ARG_YARN_ATTN_FACTOR": (("--yarn-attn-factor",), True, None),
    "LLAMA_ARG_YARN_BETA_SLOW": (("--yarn-beta-slow",), True, None),
    "LLAMA_ARG_YARN_BETA_FAST": (("--yarn-beta-fast",), True, None),
    "LLAMA_ARG_SPEC_TYPE": (("--spec-type",), True, None),
    "LLAMA_ARG_SPEC_DRAFT_MODEL": (("-md", "--model-draft"), True, None),
    "LLAMA_ARG_SPEC_DRAFT_N_MAX": (("--spec-draft-n-max", "--draft-max", "--draft", "--draft-n"), True, None),
    "LLAMA_ARG_DRAFT_MAX": (("--draft-max", "--spec-draft-n-max", "--draft", "--draft-n"), True, None),
    "LLAMA_ARG_SPEC_DRAFT_N_MIN": (("--spec-draft-n-min", "--draft-min"), True, None),
    "LLAMA_ARG_DRAFT_MIN": (("--draft-min", "--spec-draft-n-min"), True, None),
    "LLAMA_ARG_SPEC_DRAFT_P_MIN": (("--draft-p-min", "--spec-draft-p-min"), True, None),
    # accepted without effect (llamapy.cli.compat): read so that a llama.cpp container's settings start
    "LLAMA_ARG_N_GPU_LAYERS": (("-ngl", "--gpu-layers", "--n-gpu-layers"), True, None),
    "LLAMA_ARG_FLASH_ATTN": (("-fa", "--flash-attn"), True, None),
    "LLAMA_ARG_CONT_BATCHING": (("-cb", "--cont-batching"), False, "--no-cont-batching"),
    "LLAMA_ARG_JINJA": (("--jinja",), False, "--no-jinja"),  # (off: an error, templates are Jinja here)
    "LLAMA_ARG_NUMA": (("--numa",), True, None),
    "LLAMA_ARG_THREADS_HTTP": (("--threads-http",), True, None),
    "LLAMA_ARG_TIMEOUT": (("-to", "--timeout"), True, None),
}

ON = frozenset({"1", "true", "on", "enabled", "yes"})
OFF = frozenset({"0", "false", "off", "disabled", "no"})

#: the subcommands that read the variables of the flags they accept
ENV_COMMANDS = frozenset({"run", "chat", "serve", "embed", "perplexity", "imatrix"})
Table = dict[str, tuple[tuple[str, ...], bool, str | None]]


def option_strings(command: str) -> set[str]:
    """Every flag spelling that ``llamapy COMMAND`` accepts (builds its parser: imports its module)."""
    from . import build_parser, options_of

    return set(options_of(build_parser(command), command))


def variables(command: str, accepted: Collection[str] | None = None) -> Table:
    """The variables ``llamapy COMMAND`` reads, each with the spellings of its flag that the command
    accepts (``accepted``: its flags, default :func:`option_strings`)."""
    if command not in ENV_COMMANDS:
        return {}
    ok = option_strings(command) if accepted is None else accepted
    out: Table = {}
    for var, (names, value, neg) in SERVE_ENV.items():
        mine = tuple(n for n in names if n in ok)
        if mine:
            out[var] = (mine, value, neg if neg in ok else None)
    return out


def env_flags(command: str) -> set[str]:
    """The variables that ``llamapy COMMAND`` reads."""
    return set(variables(command))


def _given(argv: Sequence[str], names: Sequence[str]) -> bool:
    return any(a in names or a.split("=", 1)[0] in names for a in argv)


def with_env(
    argv: Sequence[str], environ: Mapping[str, str] | None = None, accepted: Collection[str] | None = None
) -> list[str]:
    """``argv`` (``[subcommand, ...]``) with the flags of the subcommand's environment variables put before
    its own arguments, for each variable whose flag (any spelling, or its ``--no-`` form) is not on the
    command line. A switch's variable that is neither on nor off is left out. ``accepted``: the
    subcommand's flags where the caller has its parser (default: :func:`option_strings`)."""
    argv = list(argv)
    if not argv or argv[0] not in ENV_COMMANDS:
        return argv
    env = os.environ if environ is None else environ
    if not any(k.startswith("LLAMA_") for k in env):
        return argv
    table = variables(argv[0], accepted)
    extra: list[str] = []
    for var, (names, value, neg) in table.items():
        v = env.get(var)
        if v is None or _given(argv[1:] + extra, names + ((neg,) if neg else ())):
            continue
        if value:
            extra += [f"{names[-1]}={v}"]  # (= keeps a value that starts with '-')
        elif v.strip().lower() in ON:
            extra.append(names[-1])
        elif v.strip().lower() in OFF and neg:
            extra.append(neg)
    return argv[:1] + extra + argv[1:]
