"""``llamapy run``: complete a prompt, streaming only the generated text to stdout.

Logs, load progress and timings go to stderr (``--verbose`` for more), so ``llamapy run -p ... > out``
captures exactly the generated text.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from . import keep_until_exit
from .common import (
    REPACK_MIN_TOKENS,
    add_escape_args,
    add_generation_args,
    add_model_args,
    add_mtmd_args,
    add_sampling_args,
    escaped,
    log,
)
from .compat import add_compat_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="complete a prompt (streams the generated text to stdout)",
        description="Complete a prompt with a GGUF model; only the generated text goes to stdout.",
        allow_abbrev=False,
    )
    g = p.add_argument_group("prompt")
    src = g.add_mutually_exclusive_group()
    src.add_argument("-p", "--prompt", metavar="PROMPT", help="the prompt")
    src.add_argument("-f", "--file", metavar="FNAME", help="read the prompt from a file ('-' = stdin)")
    add_escape_args(g, "-p, -f and -r")
    g.add_argument("--display-prompt", action="store_true", help="print the prompt before the generated text")
    g.add_argument("--no-display-prompt", dest="display_prompt", action="store_false", help="(the default)")
    g.add_argument("-no-cnv", "--no-conversation", action="store_true", default=argparse.SUPPRESS,
                   help="(the default: llamapy chat is the conversation mode)")  # fmt: skip
    add_generation_args(p)
    add_model_args(p)
    add_sampling_args(p)
    add_mtmd_args(p)
    add_compat_args(p, "cpu", "device", "log", "console", "single")
    p.set_defaults(func=run, _parser=p)


def read_prompt(args: argparse.Namespace) -> str:
    """The prompt of -p, -f or stdin; -p and -f as llama.cpp reads them (escapes processed unless
    --no-escape; one final newline of the file dropped)."""
    if args.prompt is not None:
        return escaped(args, args.prompt)
    if args.file == "-" or (args.file is None and not sys.stdin.isatty()):
        if hasattr(sys.stdin, "reconfigure"):
            sys.stdin.reconfigure(errors="replace")
        return sys.stdin.read()
    if args.file is not None:
        with open(args.file, "rb") as f:
            data = f.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            from ..errors import LlamapyError

            raise LlamapyError(
                f"{args.file}: not UTF-8 text (byte {e.start}: {data[e.start : e.start + 1]!r})"
            ) from None
        return escaped(args, text[:-1] if text.endswith("\n") else text)
    args._parser.error("give a prompt with -p PROMPT or -f FILE (or on stdin)")
    raise AssertionError  # unreachable: error() exits


def build_sampler(llm: Any, args: argparse.Namespace) -> Any:
    from ..sampling import build_chain
    from .common import sampling_params

    params = sampling_params(args)
    chain = build_chain(params, n_vocab=llm.n_vocab(), vocab=llm.vocab, n_ctx=llm.n_ctx())
    if args.verbose:
        log(f"llamapy: sampling params:\n{params.print()}")
        log(f"llamapy: sampler chain: {chain.describe()}")
    return chain


def write_out(text: str) -> None:
    out = sys.stdout
    buf = getattr(out, "buffer", None)
    if buf is not None:
        out.flush()
        buf.write(text.encode("utf-8"))
        buf.flush()
    else:
        out.write(text)
        out.flush()


def keep_tokens(args: argparse.Namespace, prompt: list[int], vocab: Any) -> int:
    """llama.cpp's ``--keep``: -1 = the whole prompt, else N prompt tokens (plus the BOS)."""
    if args.keep < 0 or args.keep > len(prompt):
        return len(prompt)
    has_bos = bool(prompt) and prompt[0] == vocab.bos and vocab.bos >= 0
    return args.keep + int(has_bos)


def image_prompt(llm: Any, text: str, images: list[str]) -> list[int]:
    """Evaluate ``text`` with the images at its media markers (or before it); the prompt's token view."""
    from ..mtmd import MEDIA_MARKER, MtmdError
    from ..mtmd.prompt import prefill

    if llm.mtmd is None:
        raise MtmdError("--image/--audio need a multimodal projector: give --mmproj FILE")
    if MEDIA_MARKER not in text:
        text = MEDIA_MARKER * len(images) + text
    bitmaps = [llm.mtmd.bitmap_from_file(f) for f in images]
    return prefill(llm.mtmd, llm._need_ctx(), llm.mtmd.tokenize(text, bitmaps))


def repack_pays(n_prompt: int, n_predict: int) -> bool:
    """Whether a run of ``n_prompt`` prompt tokens and ``n_predict`` more (-1: until the end) should repack
    the weights (``--repack``): the copy costs about as much as a few dozen tokens of the faster kernels
    save (SmolLM2-135M Q4_1: 40 ms warm, 0.3 s where the memory is new to the process, 1.7 ms a token
    saved; Qwen2.5-1.5B Q4_K_M: 0.3-6 s, most of it the system faulting in 1 GB of fresh memory on a VM),
    so a short run reads the file's rows as they are."""
    return n_predict < 0 or n_prompt + n_predict >= REPACK_MIN_TOKENS


def run(args: argparse.Namespace) -> int:
    from ..generation import GenerationParams, generate
    from .common import grammar_from_args, load_llama

    text = read_prompt(args)
    grammar = grammar_from_args(args)
    llm = load_llama(args)
    keep_until_exit(llm)
    seq = llm._need_ctx()
    # the token loop reads the logits it needs; Llama.scores (n_ctx x n_vocab, paged in a row per token:
    # 1 MiB a token for a 262k vocabulary) is for API callers, not this command
    seq.on_logits = None
    if getattr(args, "image", None):  # llama-mtmd-cli: text and image chunks
        prompt = image_prompt(llm, text, args.image)
    else:
        prompt = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
    seq.n_keep = keep_tokens(args, prompt, llm.vocab)
    if args.repack is None and llm.ctx is not None:
        llm.ctx.repack = repack_pays(len(prompt), args.n_predict)
    if args.verbose:
        log(f"llamapy: prompt has {len(prompt)} tokens: {prompt[:32]}{' ...' if len(prompt) > 32 else ''}")
    chain = build_sampler(llm, args)
    chain.accept_prompt(prompt)
    gs = None
    if grammar is not None:
        grammar.check(llm.vocab)
        gs = grammar.sampler(llm.vocab)
        chain.set_grammar(gs)
    params = GenerationParams(max_tokens=args.n_predict, stop=[escaped(args, r) for r in args.reverse_prompt],
                              ignore_eos=args.ignore_eos, special=args.special)  # fmt: skip
    if args.display_prompt:  # llama-completion's default: the prompt, then the generated text
        write_out(text)
    t0 = time.perf_counter()
    t_first = None
    n_gen = 0
    finish = None
    for step in generate(seq, chain, llm.vocab, prompt, params, grammar=gs, draft_model=llm.draft_model):
        if t_first is None:
            t_first = time.perf_counter()
        if step.token is not None:
            n_gen += 1
        if step.text:
            write_out(step.text)
        finish = step.finish_reason or finish
    t1 = time.perf_counter()
    if sys.stdout.isatty():
        write_out("\n")
    t_first = t_first or t1
    n_eval = max(n_gen - 1, 0)
    log(
        f"llamapy: prompt {len(prompt)} tokens in {t_first - t0:.2f} s "
        f"({len(prompt) / max(t_first - t0, 1e-9):.1f} t/s), generated {n_gen} tokens in {t1 - t_first:.2f} s "
        f"({n_eval / max(t1 - t_first, 1e-9):.1f} t/s), stop: {finish}"
    )
    return 0
