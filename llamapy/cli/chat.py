"""``llamapy chat``: a conversation through the model's chat template.

On a terminal: line editing (readline), ``/exit``, ``/clear``, a line ending in ``\\`` continues on the
next one, Ctrl-C stops the current answer (at the prompt it ends the chat). On a pipe every input line
is one user message; each answer is printed followed by a newline, and the chat ends with the input.
The KV cache of the conversation so far is reused from turn to turn.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any

from .common import (
    add_escape_args,
    add_generation_args,
    add_model_args,
    add_mtmd_args,
    add_sampling_args,
    escaped,
    log,
    read_text,
)
from .compat import add_compat_args
from .run import build_sampler, write_out


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "chat",
        help="chat with a model (interactive, or one message per line on a pipe)",
        description="Chat with a model through its chat template. Commands: /exit, /clear, /image FILE, /audio FILE.",
        allow_abbrev=False,
    )
    g = p.add_argument_group("chat")
    sys_ = g.add_mutually_exclusive_group()
    sys_.add_argument("-sys", "--system-prompt", metavar="TEXT", help="system message")
    sys_.add_argument(
        "-sysf", "--system-prompt-file", metavar="FNAME", help="read the system message from a file"
    )
    first = g.add_mutually_exclusive_group()
    first.add_argument("-p", "--prompt", metavar="TEXT", help="the first user message (then the input's)")
    first.add_argument("-f", "--file", metavar="FNAME", help="read the first user message from a file")
    add_escape_args(g, "-p, -f and -r")
    g.add_argument("-st", "--single-turn", action="store_true",
                   help="answer one message (-p, -f or the first input line), then exit")  # fmt: skip
    g.add_argument("-cnv", "--conversation", action="store_true", default=argparse.SUPPRESS,
                   help="(the default: llamapy run completes a prompt without a chat template)")  # fmt: skip
    g.add_argument(
        "--chat-template", metavar="NAME", help="built-in template (chatml, llama3, gemma, phi3, mistral)"
    )
    g.add_argument("--chat-template-file", metavar="FNAME", help="Jinja chat template file")
    add_generation_args(p)
    add_model_args(p)
    add_sampling_args(p)
    add_mtmd_args(p)
    add_compat_args(p, "cpu", "device", "log", "console", "single")
    p.set_defaults(func=run)


def read_messages(stream: Any, interactive: bool) -> Iterator[str]:
    """User messages: one per line (``\\`` at the end of a line continues the message)."""
    parts: list[str] = []
    while True:
        if interactive:
            try:
                line = input("> " if not parts else "  ")
            except EOFError:
                return
        else:
            line = stream.readline()
            if not line:
                if parts:
                    yield "\n".join(parts)
                return
            line = line.rstrip("\r\n")
        if line.endswith("\\"):
            parts.append(line[:-1])
            continue
        parts.append(line)
        yield "\n".join(parts)
        parts = []


def chain_first(first: str, stream: Any, interactive: bool) -> Iterator[str]:
    """``first``, then the messages of ``stream``."""
    yield first
    yield from read_messages(stream, interactive)


def first_message(args: argparse.Namespace) -> str | None:
    """The user message of -p or -f (as llama.cpp reads them: escapes processed unless --no-escape, one
    final newline of the file dropped), or None."""
    if args.prompt is not None:
        return escaped(args, args.prompt)
    if args.file is not None:
        text = read_text(args.file, "prompt file")
        return escaped(args, text[:-1] if text.endswith("\n") else text)
    return None


def system_prompt(args: argparse.Namespace) -> str | None:
    """-sys TEXT, or the text of -sysf FILE (one final newline dropped, as llama.cpp)."""
    if args.system_prompt_file is not None:
        text = read_text(args.system_prompt_file, "system prompt file")
        return text[:-1] if text.endswith("\n") else text
    return args.system_prompt


def run(args: argparse.Namespace) -> int:
    from ..generation import GenerationParams, generate
    from .common import grammar_from_args, load_llama

    template = None
    if args.chat_template_file:
        with open(args.chat_template_file, "rb") as f:
            data = f.read()
        try:
            template = data.decode("utf-8")
        except UnicodeDecodeError as e:
            from ..errors import LlamapyError

            raise LlamapyError(f"{args.chat_template_file}: not UTF-8 text (byte {e.start})") from None
    grammar = grammar_from_args(args)
    llm = load_llama(args)
    if grammar is not None:
        grammar.check(llm.vocab)
    if template is not None:
        llm.chat_template = template
    elif args.chat_template:
        llm.chat_format = args.chat_template
    seq = llm._need_ctx()
    seq.on_logits = None  # as in run: Llama.scores would page in a row of n_vocab floats per token
    chain = build_sampler(llm, args)
    params = GenerationParams(max_tokens=args.n_predict, stop=[escaped(args, r) for r in args.reverse_prompt],
                              ignore_eos=args.ignore_eos, special=args.special)  # fmt: skip
    interactive = sys.stdin.isatty()
    if hasattr(sys.stdin, "reconfigure"):
        sys.stdin.reconfigure(errors="replace")  # undecodable input bytes become U+FFFD, not a crash
    if interactive:
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:  # pragma: no cover - platform without readline
            pass
        log("llamapy: chat; /exit to quit, /clear to start over, Ctrl-C stops an answer")
    sys_text = system_prompt(args)
    system = [{"role": "system", "content": sys_text}] if sys_text else []
    messages: list[dict[str, str]] = list(system)
    n_accepted = 0
    pending: list[str] = list(getattr(args, "image", None) or [])  # images for the next user message
    bitmaps: list[Any] = []  # every image of the conversation, in order
    try:
        first = first_message(args)
        inputs = (
            read_messages(sys.stdin, interactive)
            if first is None
            else chain_first(first, sys.stdin, interactive)
        )
        for text in inputs:
            cmd = text.strip()
            if cmd == "/exit":
                break
            if cmd == "/clear":
                messages = list(system)
                bitmaps = []
                chain.reset()
                n_accepted = 0
                log("llamapy: conversation cleared")
                continue
            if cmd.startswith(("/image ", "/audio ")):  # the next message gets this file (llama-mtmd-cli)
                pending.append(cmd[len("/image ") :].strip())
                log(f"llamapy: {pending[-1]} goes with the next message")
                continue
            if not cmd:
                continue
            if pending:
                if llm.mtmd is None:
                    from ..mtmd import MtmdError

                    raise MtmdError("images need a multimodal projector: give --mmproj FILE")
                from ..mtmd import MEDIA_MARKER

                bitmaps += [llm.mtmd.bitmap_from_file(f) for f in pending]
                text = MEDIA_MARKER * len(pending) + text
                pending = []
            messages.append({"role": "user", "content": text})
            if bitmaps:
                from ..mtmd.prompt import prefill

                rendered = llm._chat_template().render(messages, add_generation_prompt=True)
                prompt = prefill(llm.mtmd, seq, llm.mtmd.tokenize(rendered, bitmaps))
            else:
                prompt = llm.apply_chat_template(messages)
            chain.set_grammar(None)
            chain.accept_prompt(prompt[n_accepted:])
            gs = grammar.sampler(llm.vocab) if grammar is not None else None  # a fresh one per answer
            chain.set_grammar(gs)
            answer = []
            try:
                for step in generate(
                    seq, chain, llm.vocab, prompt, params, grammar=gs, draft_model=llm.draft_model
                ):
                    if step.text:
                        answer.append(step.text)
                        write_out(step.text)
            except KeyboardInterrupt:
                if not interactive:
                    raise
                log("\nllamapy: answer stopped")
            write_out("\n")
            messages.append({"role": "assistant", "content": "".join(answer)})
            n_accepted = len(seq.tokens)
            if args.single_turn:
                break
    except KeyboardInterrupt:
        if not interactive:
            raise
        write_out("\n")
    return 0
