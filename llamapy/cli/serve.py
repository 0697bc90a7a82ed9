"""``llamapy serve``: the OpenAI-compatible HTTP server (FastAPI + uvicorn) with parallel slots."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from ..errors import LlamapyError
from .compat import NoEffectAction
from .reasoning import add_reasoning_args, chat_defaults


def register(sub: argparse._SubParsersAction) -> None:
    from .common import POOLING_NAMES

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
    from .common import add_cache_type_args

    add_cache_type_args(p)  # -ctk/-ctv: the KV cache's types
    p.add_argument("-ub", "--ubatch-size", type=_positive, default=512, help="physical batch size")
    p.add_argument("-t", "--threads", type=int, default=None, help="compute threads (default: all cores)")
    p.add_argument(
        "--pipeline", type=_positive, default=0, metavar="N",
        help="split the model's layers over N Ray actors (pipeline parallel; needs llamapy[ray])",
    )  # fmt: skip
    p.add_argument(
        "--pipeline-strategy", default="PACK", choices=["PACK", "STRICT_PACK", "SPREAD", "STRICT_SPREAD"],
        help="placement of the stages: PACK (one node if it fits) or STRICT_SPREAD (one stage per node)",
    )  # fmt: skip
    p.add_argument("--pipeline-stage-cpus", type=float, default=1.0, help="CPUs reserved per stage")
    p.add_argument("--api-key", action="append", default=[], help="require this API key (repeatable)")
    p.add_argument("--api-key-file", help="file with one API key per line")
    p.add_argument(
        "--api-prefix", type=_api_prefix, default="", metavar="PREFIX",
        help="serve every route under this path (/PREFIX/v1/..., the chat page at /PREFIX/)",
    )  # fmt: skip
    p.add_argument(
        "--cors-origin", action="append", default=[], help="allow browser requests from ORIGIN (or *)"
    )
    p.add_argument(
        "--chat-template", help="built-in template (chatml, llama3, gemma, phi3, mistral) or Jinja source"
    )
    p.add_argument("--chat-template-file", help="Jinja chat template to use instead of the model's")
    add_reasoning_args(p)
    p.add_argument("--embedding", "--embeddings", dest="embeddings", action="store_true",
                   help="serve /v1/embeddings and /embedding (no completions)")  # fmt: skip
    p.add_argument("--pooling", choices=POOLING_NAMES,
                   help="embedding pooling (default: the model's)")  # fmt: skip
    p.add_argument("--reranking", "--rerank", action="store_true",
                   help="serve /rerank and /v1/rerank (embeddings with --pooling rank)")  # fmt: skip
    p.add_argument("--metrics", action="store_true", help="expose Prometheus metrics at /metrics")
    p.add_argument(
        "-mm", "--mmproj", metavar="FILE", help="multimodal projector GGUF: image input in chat requests"
    )
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
    from .common import add_spec_args

    add_spec_args(p, n_max=False)  # --spec-type ngram-simple|ngram-map-k|mtp, --spec-ngram-* sizes
    p.add_argument("--mmproj-cache-mb", type=float, default=None, metavar="MB",
                   help="image/audio embeddings kept across requests and slots (default 256; 0: off)")  # fmt: skip
    p.add_argument("--lora", action="append", default=[], metavar="FILE", help="LoRA adapter (repeatable)")
    p.add_argument(
        "--lora-scaled", nargs=2, action="append", default=[], metavar=("FILE", "SCALE"),
        help="LoRA adapter with a scale (repeatable)",
    )  # fmt: skip
    p.add_argument(
        "--lora-init-without-apply", action="store_true",
        help="load the adapters with scale 0 (set them later with POST /lora-adapters)",
    )  # fmt: skip
    p.add_argument(
        "--slots", dest="no_slots", action="store_false", default=False, help="expose /slots (the default)"
    )
    p.add_argument("--no-slots", action="store_true", help="do not expose /slots")
    p.add_argument(
        "--webui",
        dest="no_webui",
        action="store_false",
        default=False,
        help="serve the chat page at / (the default)",
    )
    p.add_argument("--no-webui", "--no-ui", action="store_true", help="do not serve the chat page at /")
    p.add_argument("--webui-dir", "--path", metavar="DIR",
                   help="serve the chat page from DIR (its index.html) instead")  # fmt: skip
    p.add_argument(
        "--ssl-key-file", metavar="FNAME", help="PEM private key: serve HTTPS (with --ssl-cert-file)"
    )
    p.add_argument(
        "--ssl-cert-file", metavar="FNAME", help="PEM certificate: serve HTTPS (with --ssl-key-file)"
    )
    p.add_argument(
        "--mcp-config",
        metavar="FILE",
        help='MCP servers (the "mcpServers" JSON of Claude Desktop) whose tools chat requests with '
        '"mcp": true may use, run by the server (needs llamapy[mcp])',
    )
    p.add_argument(
        "--mcp-max-steps",
        type=_positive,
        default=8,
        metavar="N",
        help="model steps of one MCP agent answer (default 8)",
    )
    p.add_argument(
        "--mcp-confirm",
        action="store_true",
        help="each MCP tool call waits for the client's POST /mcp/confirm (streamed requests only)",
    )
    p.add_argument("--slots-verbose", action="store_true", help="include prompt and cached text in /slots")
    p.add_argument(
        "--slot-save-path",
        default=None,
        help="folder for POST /slots/{id}?action=save|restore|erase (default: slot actions disabled)",
    )
    p.add_argument("--max-body-size", type=_positive, default=8 << 20, help="largest request body in bytes")
    p.add_argument(
        "-n",
        "--n-predict",
        "--predict",
        type=int,
        default=-1,
        help="default max tokens per answer (-1: no limit)",
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
    from .common import add_escape_args, add_sampling_args

    add_sampling_args(p, constrained=False)  # the defaults of requests (--temp, --top-k, -s, --samplers...)
    add_escape_args(p, "--dry-sequence-breaker")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    r = p.add_argument_group("router mode (many models in one server; a request's model picks one)")
    r.add_argument("--models-dir", metavar="DIR",
                   help="serve every GGUF model under DIR (split models and mmproj files paired by name)")  # fmt: skip
    r.add_argument("--models-preset", metavar="FILE",
                   help='TOML: a table per model ([name], its model = path or user/repo[:quant]) of serve '
                        'options (ctx-size, parallel, chat-template, model-draft, lora...); ["*"]: every model')  # fmt: skip
    r.add_argument("--models-max", type=_non_negative, default=4, metavar="N",
                   help="most models loaded at once; the least recently used idle one is unloaded (0: no limit)")  # fmt: skip
    r.add_argument("--keep-alive", default="-1", metavar="DURATION",
                   help="unload a model idle this long (30s, 5m, 1h; 0: after each answer; -1: never, the default)")  # fmt: skip
    r.add_argument("--no-models-autoload", action="store_true",
                   help="do not load a model on its first request (POST /models/load does)")  # fmt: skip
    from .common import add_hf_args, add_rope_args

    add_rope_args(p)  # --rope-scaling, --rope-scale, --yarn-*, --override-kv
    add_hf_args(p)  # -hf user/repo[:quant], -hff, --hf-token, --offline, --no-mmproj
    from .compat import add_compat_args

    add_compat_args(p, "serve_cpu", "cpu", "device", "log", "http")
    p.set_defaults(func=run, serve_parser=p)


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
    if args.mcp_config:  # a bad MCP config (or no SDK) is an error: line now, not a failed startup
        from ..server.mcp_host import check_sdk, load_config

        check_sdk()
        load_config(args.mcp_config)
    router_mode = bool(args.models_dir or args.models_preset)
    if router_mode and (args.model or args.hf_repo):
        print(
            "error: give either a model (-m/-hf) or --models-dir/--models-preset (router mode)",
            file=sys.stderr,
        )
        return 1
    model_path = None if router_mode else resolve_model_args(args)  # a bad -m/-hf fails fast
    if getattr(args, "pipeline", 0):  # layers over Ray actors: text generation on one model only
        from ..ray import RayNotInstalledError, require_ray

        bad = "router mode" if router_mode else ""
        if args.embeddings or args.reranking:
            bad = "--embedding/--reranking"
        if args.override_kv:  # (each stage loads the file itself)
            bad = "--override-kv"
        if bad:
            print(f"error: --pipeline does not work with {bad}", file=sys.stderr)
            return 1
        try:
            require_ray()
        except RayNotInstalledError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1

    import uvicorn

    if bool(args.ssl_key_file) != bool(args.ssl_cert_file):
        print("error: HTTPS needs both --ssl-key-file and --ssl-cert-file", file=sys.stderr)
        return 1
    if args.slot_save_path and not Path(args.slot_save_path).is_dir():
        print(f"llamapy serve: --slot-save-path {args.slot_save_path}: not a folder", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        app = make_app(args, api_keys, model_path)
    except ValueError as e:  # a bad preset or --keep-alive
        print(f"error: {e}", file=sys.stderr)
        return 1
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
        ssl_keyfile=args.ssl_key_file,
        ssl_certfile=args.ssl_cert_file,
    )
    server = uvicorn.Server(config)
    _announce(server, args.host)
    server.run()
    return 0


def _api_prefix(s: str) -> str:
    from ..server.prefix import normalize_prefix

    try:
        return normalize_prefix(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def make_app(args: argparse.Namespace, api_keys: list[str], model_path: Any = None) -> Any:
    """The app of ``args``: one model (``model_path``), or router mode (``--models-dir``/``--models-preset``)."""
    from ..server.app import create_app

    if args.models_dir or args.models_preset:
        settings, router = build_router(args, api_keys)
        return create_app(settings, router=router)
    return create_app(server_settings(args, str(model_path), api_keys), backend_factory(args, model_path))


def chat_template(args: argparse.Namespace) -> str | None:
    """--chat-template-file or --chat-template, checked (a bad template is a startup error, not a 500 on
    every chat request)."""
    template = Path(args.chat_template_file).read_text(encoding="utf-8") if args.chat_template_file else None
    template = template if template is not None else args.chat_template
    if template is not None:  # a bad template is a startup error, not a 500 on every chat request
        from ..vocab.chat_template import BUILTIN_TEMPLATES, ChatTemplate, builtin_template

        is_builtin = template.strip().lower() in BUILTIN_TEMPLATES
        ChatTemplate(builtin_template(template) if is_builtin else template)
    return template


def server_settings(args: argparse.Namespace, model_path: str, api_keys: list[str]) -> Any:
    """The :class:`ServerSettings` of ``args`` for the model at ``model_path``."""
    from ..server.app import ServerSettings
    from ..server.params import Defaults
    from .common import sampling_params

    defaults = Defaults(
        sampling=sampling_params(args), n_predict=args.n_predict, n_keep=args.keep, **chat_defaults(args)
    )
    return ServerSettings(
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
        mcp_config=args.mcp_config,
        mcp_max_steps=args.mcp_max_steps,
        mcp_confirm=args.mcp_confirm,
        api_prefix=args.api_prefix,
        cache_type_k=args.cache_type_k,
        cache_type_v=args.cache_type_v,
    )


def _pipeline(args: argparse.Namespace) -> dict[str, Any]:
    """``ContextBackend``'s ``pipeline`` argument for ``--pipeline N`` (none without it)."""
    n = getattr(args, "pipeline", 0)
    if not n:
        return {}
    opts = {"stages": n, "strategy": args.pipeline_strategy, "stage_cpus": args.pipeline_stage_cpus}
    return {"pipeline": opts}


def backend_factory(args: argparse.Namespace, model_path: Any, mmproj: str | None = None) -> Any:
    """A function building the backend ``args`` ask for (on the loading thread); ``model_path`` a path or a
    function giving it at load time (router mode resolves Hub refs then)."""
    from ..server.backend import ContextBackend
    from .common import kv_overrides_arg, rope_kwargs

    template = chat_template(args)
    rope, overrides = rope_kwargs(args), kv_overrides_arg(args)  # bad values: a startup error
    mmproj = mmproj or args.mmproj
    if getattr(args, "spec_type", None) and not callable(model_path):  # fail at start-up, not at load
        from ..generation.spec_server import check_spec_model

        check_spec_model(args.spec_type, model_path)
    if args.reranking:  # as llama-server: --reranking is --embedding --pooling rank
        args.embeddings, args.pooling = True, "rank"

    def factory() -> ContextBackend:
        from ..server.embeddings import EmbeddingBackend  # keeps per-token embeddings (pooling none)

        backend = (EmbeddingBackend if args.embeddings else ContextBackend)(
            model_path() if callable(model_path) else model_path,
            n_ctx=args.ctx_size,
            n_seq_max=args.parallel,
            n_batch=args.batch_size,
            n_ubatch=args.ubatch_size,
            n_threads=args.threads,
            type_k=args.cache_type_k,
            type_v=args.cache_type_v,
            embeddings=args.embeddings,
            chat_template=template,
            pooling=args.pooling,
            loras=_loras(args),
            draft=_draft(args),
            rope=rope,
            kv_overrides=overrides or None,
            **_pipeline(args),
        )
        if mmproj:  # the vision encoder + projector next to the text model (llama-server --mmproj)
            from ..mtmd import MtmdContext

            cache_mb = getattr(args, "mmproj_cache_mb", None)
            cache = {} if cache_mb is None else {"cache_mb": cache_mb}
            backend.mtmd = MtmdContext(mmproj, backend.model, n_threads=args.threads, **cache)  # type: ignore[attr-defined]
        return backend

    return factory


# -- router mode -------------------------------------------------------------------------------------

_ROUTER_ONLY = {"host", "port", "api_key", "api_key_file", "cors_origin", "models_dir", "models_preset",
                "models_max", "keep_alive", "no_models_autoload", "model", "hf_repo", "hf_file", "hf_token", "offline", "alias", "log_level",
                "max_body_size", "metrics", "no_slots", "slots_verbose", "slot_save_path", "no_webui",
                "webui_dir", "ssl_key_file", "ssl_cert_file"}  # fmt: skip


def _preset_args(args: argparse.Namespace, values: dict[str, Any], where: str) -> argparse.Namespace:
    """``args`` with a preset's options (``ctx-size = 2048``...); an option given on the command line
    wins, as llama-server's."""
    import copy

    parser: argparse.ArgumentParser = args.serve_parser
    actions = {o.lstrip("-"): a for a in parser._actions for o in a.option_strings}
    ns = copy.copy(args)
    for key, value in values.items():
        a = actions.get(key) or actions.get(key.replace("_", "-"))
        if isinstance(a, NoEffectAction):
            continue  # a llama.cpp flag without effect here (compat)
        if a is None or a.dest in _ROUTER_ONLY:
            why = "is set for the whole server" if a is not None else "is not an option of llamapy serve"
            raise ValueError(f"--models-preset {where}: {key!r} {why}")
        if getattr(args, a.dest) != parser.get_default(a.dest):
            continue  # given on the command line
        if isinstance(a, argparse._StoreTrueAction):
            if not isinstance(value, bool):
                raise ValueError(f"--models-preset {where}: {key} must be true or false")
        elif isinstance(a, argparse._AppendAction):
            value = [_preset_value(a, v, where, key) for v in (value if isinstance(value, list) else [value])]
        else:
            value = _preset_value(a, value, where, key)
        setattr(ns, a.dest, value)
    return ns


def _preset_value(a: argparse.Action, value: Any, where: str, key: str) -> Any:
    if isinstance(value, list | dict) and not a.nargs:
        raise ValueError(f"--models-preset {where}: {key} must be a single value")
    try:
        v = a.type(str(value)) if a.type is not None and not isinstance(value, list) else value
    except (ValueError, argparse.ArgumentTypeError) as e:
        raise ValueError(f"--models-preset {where}: {key} = {value!r}: {e}") from None
    if a.choices is not None and v not in a.choices:
        raise ValueError(f"--models-preset {where}: {key} must be one of {', '.join(map(str, a.choices))}")
    return v


def build_router(args: argparse.Namespace, api_keys: list[str]) -> tuple[Any, Any]:
    """The server settings and the :class:`~llamapy.server.router.Router` of ``--models-dir`` and
    ``--models-preset`` (the preset's options apply to the model of the same name in the folder)."""
    from ..server.router import ModelSpec, Router, load_preset, parse_duration, scan_models_dir
    from ..server.state import ModelEntry

    specs: dict[str, ModelSpec] = {}
    if args.models_dir:
        for spec in scan_models_dir(args.models_dir):
            specs[spec.name] = spec
    common: dict[str, Any] = {}
    if args.models_preset:
        common, preset = load_preset(args.models_preset)
        for spec in preset:
            known = specs.get(spec.name)
            if known is not None and spec.model == spec.name:  # options for a model of the folder
                spec.model, spec.mmproj = known.model, spec.mmproj or known.mmproj
            specs[spec.name] = spec
    startup = [s.name for s in specs.values() if s.args.pop("load-on-startup", False)]
    keep_alive = parse_duration(args.keep_alive, "--keep-alive")
    settings = server_settings(args, "", api_keys)

    def make_entry(spec: ModelSpec) -> ModelEntry:
        ns = _preset_args(_preset_args(args, common, '["*"]'), spec.args, f"[{spec.name}]")
        ms = server_settings(ns, spec.path or spec.model, api_keys)
        ms.alias = spec.name
        entry = ModelEntry(ms, lambda: None, name=spec.name)  # (the factory reads the path at load time)
        entry.factory = backend_factory(ns, lambda: entry.settings.model_path, spec.mmproj)
        entry.extra_files = [f for f in (spec.mmproj or ns.mmproj, ns.model_draft) if f]
        entry.n_ctx = ns.ctx_size // max(1, ns.parallel) * ns.parallel
        return entry

    for spec in specs.values():
        make_entry(spec)  # a bad preset value is a startup error

    def pull(name: str) -> ModelSpec:
        from ..hub import canonical_name, hf, resolve_model

        if canonical_name(name) is None and hf.looks_like_ref(name):
            m = hf.download(name, token=getattr(args, "hf_token", None), quiet=True)
            return ModelSpec(name, name, str(m.mmproj) if m.mmproj else None, source="pull", path=str(m.path))
        return ModelSpec(name, name, source="pull", path=str(resolve_model(name)))

    router = Router(
        list(specs.values()),
        make_entry,
        models_max=args.models_max,
        keep_alive=keep_alive,
        autoload=not args.no_models_autoload,
        pull=pull,
        load_on_startup=startup,
    )
    return settings, router


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
    if getattr(args, "spec_type", None) and not args.model_draft:  # (llamapy.generation.spec_server)
        from ..generation.spec_server import server_spec

        n_draft = args.draft_max if args.draft_max != 16 else None  # (mtp: 3 unless --draft-max N)
        return server_spec(args.spec_type, n_draft=n_draft, size_n=args.spec_size_n, size_m=args.spec_size_m,
                           min_hits=args.spec_min_hits, n_threads=args.threads)  # fmt: skip
    if not args.model_draft:
        return None
    kw: dict[str, Any] = dict(model=args.model_draft, n_draft=args.draft_max, n_min=args.draft_min,
                              p_min=args.draft_p_min, n_threads=args.threads)  # fmt: skip
    if args.ctx_size_draft:
        kw["n_ctx"] = args.ctx_size_draft
    return kw
