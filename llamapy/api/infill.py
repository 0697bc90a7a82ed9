"""Fill-in-the-middle prompts: the one place that assembles them (``Llama(..., suffix=...)``, the
server's ``/infill`` and ``/v1/completions`` ``suffix``).

The layout is llama.cpp's ``format_infill`` (``tools/server/utils.hpp``), with the repo-level pattern
(https://arxiv.org/pdf/2409.12186) when the vocabulary declares ``fim_rep`` / ``fim_sep``::

    [FIM_REP]myproject\\n [FIM_SEP]filename0\\n extra chunk 0 ... [FIM_SEP]filename\\n
    [BOS] [FIM_PRE]prefix prompt [FIM_SUF]suffix [FIM_MID]

(as llama.cpp's code does, ``prompt`` follows the prefix, before ``FIM_SUF``; with ``spm_infill`` the
suffix part comes first). Truncation as llama.cpp: the prefix keeps its last ``3 * (n_batch // 4)``
tokens, the suffix its first ``n_batch // 4 - 2 - len(prompt)``, and the extra context its last
``n_ctx - n_batch - 2 * n_predict`` tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .._dataclass import dataclass

# "\n\n--- snippet ---\n\n": llama.cpp's chunk separator for vocabularies without FIM_SEP
CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"
REPO_NAME = "myproject\n"
CURRENT_FILE = "filename\n"
DEFAULT_CHUNK_FILE = "tmp"


class FimError(ValueError):
    """The vocabulary has no fill-in-the-middle tokens."""


@dataclass(frozen=True)
class FimTokens:
    """The fill-in-the-middle special tokens of a vocabulary (-1: the vocabulary has none)."""

    pre: int
    suf: int
    mid: int
    rep: int = -1
    sep: int = -1
    bos: int = -1
    add_bos: bool = False

    @classmethod
    def of(cls, vocab: Any, what: str = "the model") -> FimTokens:
        """The FIM tokens of a :class:`llamapy.vocab.Vocab` (or anything with its attributes);
        :class:`FimError` when prefix/suffix/middle are not all declared."""

        def get(name: str) -> int:
            v = getattr(vocab, name, -1)
            return -1 if v is None else int(v)

        fim = cls(
            pre=get("fim_pre"),
            suf=get("fim_suf"),
            mid=get("fim_mid"),
            rep=get("fim_rep"),
            sep=get("fim_sep"),
            bos=get("bos"),
            add_bos=bool(getattr(vocab, "add_bos", False)),
        )
        missing = [n for n in ("pre", "suf", "mid") if getattr(fim, n) < 0]
        if missing:
            raise FimError(
                f"{what} has no fill-in-the-middle tokens (its vocabulary declares no "
                f"{', '.join('fim_' + n for n in missing)})"
            )
        return fim


def assemble(
    fim: FimTokens,
    prefix: Sequence[int],
    suffix: Sequence[int],
    prompt: Sequence[int] = (),
    extra: Sequence[int] = (),
    spm_infill: bool = False,
) -> list[int]:
    """``extra [BOS] [FIM_PRE]prefix prompt [FIM_SUF]suffix [FIM_MID]`` (already truncated parts)."""
    head = [fim.pre, *prefix, *prompt]
    tail = [fim.suf, *suffix]
    first, second = (tail, head) if spm_infill else (head, tail)
    bos = [fim.bos] if fim.add_bos and fim.bos >= 0 else []
    return [*extra, *bos, *first, *second, fim.mid]


def extra_context(
    fim: FimTokens, tokenize: Callable[[str], list[int]], chunks: Sequence[tuple[str, str]]
) -> list[int]:
    """The repo-level context before the FIM prefix: ``chunks`` are (filename, text) pairs."""
    out: list[int] = []
    if fim.rep >= 0:
        out += [fim.rep, *tokenize(REPO_NAME)]
    for filename, text in chunks:
        if fim.sep >= 0:
            out += [fim.sep, *tokenize(filename + "\n")]
        else:
            out += tokenize(CHUNK_SEPARATOR)
        out += tokenize(text)
    if fim.sep >= 0:
        out += [fim.sep, *tokenize(CURRENT_FILE)]
    return out


def format_infill(
    fim: FimTokens,
    tokenize: Callable[[str], list[int]],
    prefix: Sequence[int],
    suffix: Sequence[int],
    chunks: Sequence[tuple[str, str]],
    prompt: Sequence[int],
    n_batch: int,
    n_predict: int,
    n_ctx: int,
    spm_infill: bool = False,
) -> list[int]:
    """llama.cpp's ``format_infill``: the whole prompt, truncated to fit (see the module docstring).

    ``tokenize`` turns text into tokens without special tokens (it is used for the repo name, file
    names and chunks); ``prefix``, ``suffix`` and ``prompt`` are already tokens. ``n_predict`` < 0
    (no limit) counts as 0.
    """
    extra = extra_context(fim, tokenize, chunks)
    n_prefix = min(len(prefix), 3 * (n_batch // 4))
    n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * max(n_predict, 0)), len(extra))
    return assemble(
        fim,
        list(prefix[len(prefix) - n_prefix :]),
        list(suffix[:n_suffix]),
        prompt,
        extra[len(extra) - n_extra :],
        spm_infill,
    )
