"""``llamapy serve``: the OpenAI-compatible HTTP server (FastAPI + uvicorn) with parallel slots."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from ..errors import LlamapyError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server",
        description="Serve a GGUF model over HTTP: /v1/chat/completions, /v1/completions, /completion, ...",
    )
    p.add_argument("-m", "--model", help="GGUF file or known model name (default: SmolLM2-135M-Instruct)")
    p.add_argument("-a", "--alias", help="model name reported by /v1/models (default: the file name)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument(
        "--port", type=int, default=8080, help="port to listen on (default 8080; 0 = any free port)"
    )
    p.add_argument("-np", "--parallel", type=_positive, default=1, help="number of slots (parallel requests)")
    p.add_argument(
        "-c", "--ctx-size", type=_non_negative, default=4096, help="total context, split over slots"
    )
    p.add_argument("-b", "--batch-size", type=_positive, default=512, help="max tokens per decode step")
    p.add_argument("-ub", "--ubatch-size", type=_positive, default=512, help="physical batch size")
    p.add_argument("-t", "--threads", type=int, default=None, help="compute threads (default: all cores)")
    p.add_argument("--api-key", action="append", default=[], help="require this API key (repeatable)")
    p.add_argument("--api-key-file", help="file with one API key per line")
    p.add_argument(
        "--cors-origin", action="append", default=[], help="allow browser requests from ORIGIN (or *)"
    )
    p.add_argument(
        "--chat-template", help="built-in template (chatml, llama3, gemma, phi3, mistral) or Jinja source"
    )
    p.add_argument("--chat-template-file", help="Jinja chat template to use instead of the model's")
    p.add_argument("--embedding", "--embeddings", dest="embeddings", action="store_true",
                   help="serve /v1/embeddings and /embedding (no completions)")  # fmt: skip
    p.add_argument("--pooling", choices=["none", "mean", "cls", "last", "rank"],
                   help="embedding pooling (default: the model's)")  # fmt: skip
    p.add_argument("--reranking", "--rerank", action="store_true",
                   help="serve /rerank and /v1/rerank (embeddings with --pooling rank)")  # fmt: skip
    p.add_argument("--metrics", action="store_true", help="expose Prometheus metrics at /metrics")
    p.add_argument("--mmproj", metavar="FILE", help="multimodal projector GGUF: image input in chat requests")
    p.add_argument(
        "--allow-image-urls",
        action="store_true",
        help="fetch http(s) image URLs in requests (public addresses only; default: data: URLs only)",
    )
    p.add_argument("--cache-reuse", type=int, default=0, metavar="N",
                   help="re-use cached chunks of at least N tokens by shifting their KV cells (default 0: off)")  # fmt: skip
    p.add_argument("-md", "--model-draft", metavar="FILE", help="draft model for speculative decoding")
    p.add_argument("--draft-max", "--spec-draft-n-max", "--draft", "--draft-n", type=_positive, default=16, metavar="N",
                   help="most tokens drafted per step (default 16)")  # fmt: skip
    p.add_argument(
        "--draft-min",
        "--spec-draft-n-min",
        type=int,
        default=0,
        metavar="N",
        help="fewest guesses used (default 0)",
    )
    p.add_argument("--draft-p-min", "--spec-draft-p-min", type=float, default=0.75, metavar="P",
                   help="least draft probability to keep drafting (default 0.75)")  # fmt: skip
    p.add_argument("-cd", "--ctx-size-draft", type=int, default=0, metavar="N",
                   help="the draft's context per slot (default: the slot's)")  # fmt: skip
    p.add_argument("--lora", action="append", default=[], metavar="FILE", help="LoRA adapter (repeatable)")
    p.add_argument(
        "--lora-scaled", nargs=2, action="append", default=[], metavar=("FILE", "SCALE"),
        help="LoRA adapter with a scale (repeatable)",
    )  # fmt: skip
    p.add_argument(
        "--lora-init-without-apply", action="store_true",
        help="load the adapters with scale 0 (set them later with POST /lora-adapters)",
    )  # fmt: skip
    p.add_argument("--no-slots", action="store_true", help="do not expose /slots")
    p.add_argument("--no-webui", action="store_true", help="do not serve the chat page at /")
    p.add_argument("--webui-dir", metavar="DIR", help="serve the chat page from DIR (its index.html) instead")
    p.add_argument("--slots-verbose", action="store_true", help="include prompt and cached text in /slots")
    p.add_argument(
        "--slot-save-path",
        default=None,
        help="folder for POST /slots/{id}?action=save|restore|erase (default: slot actions disabled)",
    )
    p.add_argument("--max-body-size", type=_positive, default=8 << 20, help="largest request body in bytes")
    p.add_argument(
        "-n", "--n-predict", type=int, default=-1, help="default max tokens per answer (-1: no limit)"
    )
    p.add_argument(
        "--no-warmup",
        action="store_true",
        help="skip running the kernels once before /health says ok (the first request then loads them)",
    )
    p.add_argument(
        "--context-shift",
        action="store_true",
        help="when a slot's context is full, drop old tokens and continue (and truncate a too long prompt)",
    )
    p.add_argument(
        "--keep",
        type=_keep,
        default=0,
        metavar="N",
        help="tokens of the prompt a context shift keeps (-1 = all; a request's n_keep overrides it)",
    )
    p.add_argument("--temp", type=float, default=0.8, help="default temperature")
    p.add_argument("--top-k", type=int, default=40, help="default top-k")
    p.add_argument("--top-p", type=float, default=0.95, help="default top-p")
    p.add_argument("--min-p", type=float, default=0.05, help="default min-p")
    p.add_argument("--repeat-penalty", type=float, default=1.0, help="default repeat penalty")
    p.add_argument("--seed", type=int, default=-1, help="default seed (-1: random)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    from .common import add_hf_args

    add_hf_args(p)  # -hf user/repo[:quant], -hff, --hf-token, --offline, --no-mmproj
    p.set_defaults(func=run)


def _positive(s: str) -> int:
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def _keep(s: str) -> int:
    v = int(s)
    if v < -1:
        raise argparse.ArgumentTypeError(f"must be -1 (the whole prompt) or 0 or more, got {v}")
    return v


def _non_negative(s: str) -> int:
    v = int(s)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {v}")
    return v


class ApiKeyError(LlamapyError):
    """An --api-key or --api-key-file that would leave the server without the authentication asked for."""


def _api_keys(args: argparse.Namespace) -> list[str]:
    """The keys of ``--api-key`` and ``--api-key-file`` (one a line; blank lines and ``#`` comments
    skipped). Asking for keys and giving none (an empty value, a file of comments) fails closed: an
    :class:`ApiKeyError`, never a server without authentication."""
    keys = []
    for k in args.api_key:
        if not k.strip():
            raise ApiKeyError("--api-key is empty: give the key itself (or leave the option out)")
        keys.append(k.strip())
    if args.api_key_file:
        text = Path(args.api_key_file).read_text(encoding="utf-8")
        lines = [line.strip() for line in text.splitlines()]
        found = [line for line in lines if line and not line.startswith("#")]
        if not found:
            raise ApiKeyError(
                f"--api-key-file {args.api_key_file} holds no key (only blank lines or # comments); "
                "refusing to start without authentication"
            )
        keys += found
    return keys


def run(args: argparse.Namespace) -> int:
    from .common import resolve_model_args

    api_keys = _api_keys(args)  # before anything else: keys asked for and not given fail at once
    model_path = resolve_model_args(args)  # before the heavy imports: a bad -m/-hf fails fast

    import uvicorn

    from ..sampling import LLAMA_DEFAULT_SEED, SamplingParams
    from ..server.app import ServerSettings, create_app
    from ..server.backend import ContextBackend
    from ..server.params import Defaults

    if args.slot_save_path and not Path(args.slot_save_path).is_dir():
        print(f"llamapy serve: --slot-save-path {args.slot_save_path}: not a folder", file=sys.stderr)
        return 2
    template = Path(args.chat_template_file).read_text(encoding="utf-8") if args.chat_template_file else None
    template = template if template is not None else args.chat_template
    if template is not None:  # a bad template is a startup error, not a 500 on every chat request
        from ..vocab.chat_template import BUILTIN_TEMPLATES, ChatTemplate, builtin_template

        is_builtin = template.strip().lower() in BUILTIN_TEMPLATES
        ChatTemplate(builtin_template(template) if is_builtin else template)
    defaults = Defaults(
        sampling=SamplingParams(
            temp=args.temp,
            top_k=args.top_k,
            top_p=args.top_p,
            min_p=args.min_p,
            penalty_repeat=args.repeat_penalty,
            seed=LLAMA_DEFAULT_SEED if args.seed < 0 else args.seed,
        ),
        n_predict=args.n_predict,
        n_keep=args.keep,
    )
    settings = ServerSettings(
        model_path=str(model_path),
        alias=args.alias,
        api_keys=api_keys,
        cors_origins=args.cors_origin,
        metrics=args.metrics,
        slots=not args.no_slots,
        slots_verbose=args.slots_verbose,
        slot_save_path=args.slot_save_path,
        max_body_bytes=args.max_body_size,
        n_batch=args.batch_size,
        context_shift=args.context_shift,
        cache_reuse=args.cache_reuse,
        warmup=not args.no_warmup,
        defaults=defaults,
        allow_image_urls=args.allow_image_urls,
    )

    if args.reranking:  # as llama-server: --reranking is --embedding --pooling rank
        args.embeddings, args.pooling = True, "rank"

    def factory() -> ContextBackend:
        from ..server.embeddings import EmbeddingBackend  # keeps per-token embeddings (pooling none)

        backend = (EmbeddingBackend if args.embeddings else ContextBackend)(
            model_path,
            n_ctx=args.ctx_size,
            n_seq_max=args.parallel,
            n_batch=args.batch_size,
            n_ubatch=args.ubatch_size,
            n_threads=args.threads,
            embeddings=args.embeddings,
            chat_template=template,
            pooling=args.pooling,
            loras=_loras(args),
            draft=_draft(args),
        )
        if args.mmproj:  # the vision encoder + projector next to the text model (llama-server --mmproj)
            from ..mtmd import MtmdContext

            backend.mtmd = MtmdContext(args.mmproj, backend.model, n_threads=args.threads)  # type: ignore[attr-defined]
        return backend

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app = create_app(settings, factory)
    if not args.no_webui:  # the chat page at / (ahead of ollama's "Ollama is running")
        from ..server.webui import mount_webui

        mount_webui(app, args.webui_dir)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    _announce(server, args.host)
    server.run()
    return 0


def _announce(server: object, host: str) -> None:
    """Print 'listening on http://HOST:PORT' once the socket is bound (the real port when --port 0)."""
    orig = server.startup  # type: ignore[attr-defined]

    async def startup(sockets: list | None = None) -> None:
        await orig(sockets=sockets)
        for s in getattr(server, "servers", []):
            for sock in s.sockets:
                port = sock.getsockname()[1]
                print(f"llamapy: listening on http://{host}:{port}", file=sys.stderr, flush=True)
                return

    server.startup = startup  # type: ignore[attr-defined]


def _loras(args: argparse.Namespace) -> list[tuple[str, float]]:
    """--lora FILE (scale 1) and --lora-scaled FILE SCALE, in order; all at 0 with --lora-init-without-apply."""
    out = [(f, 1.0) for f in args.lora]
    for f, scale in args.lora_scaled:
        try:
            out.append((f, float(scale)))
        except ValueError:
            raise SystemExit(f"--lora-scaled {f} {scale}: the scale must be a number") from None
    return [(f, 0.0) for f, _ in out] if args.lora_init_without_apply else out


def _draft(args: argparse.Namespace) -> dict[str, Any] | None:
    if not args.model_draft:
        return None
    kw: dict[str, Any] = dict(model=args.model_draft, n_draft=args.draft_max, n_min=args.draft_min,
                              p_min=args.draft_p_min, n_threads=args.threads)  # fmt: skip
    if args.ctx_size_draft:
        kw["n_ctx"] = args.ctx_size_draft
    return kw
