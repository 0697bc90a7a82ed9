"""llama-server's line stops in the token loop (``n_indent``, ``t_max_predict_ms``: what code completion
clients such as llama.vim send): the text is cut where llama.cpp cuts it, nothing past the cut is ever
streamed, and the finish reason is a limit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamapy.generation import GenerationParams
from llamapy.generation.loop import Generation
from llamapy.generation.text import LineLimits
from tests.test_generation import FakeVocab


class Script:
    """A sampler that returns the next token of a fixed list."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = list(tokens)

    def sample(self, logits: np.ndarray) -> int:
        return self.tokens.pop(0)

    def accept(self, token: int) -> None:
        pass


def run(pieces: list[str], **params) -> tuple[list[str], str, str]:
    """Generate ``pieces`` (one token each, then the end of generation): the streamed texts, the finish
    reason and the stop type."""
    vocab = FakeVocab([p.encode() for p in pieces] + [b""], eog=(len(pieces),))
    gen = Generation(vocab, Script(list(range(len(pieces) + 1))), GenerationParams(**params))
    out = []
    while not gen.done:
        step = gen.step(np.zeros(len(pieces) + 1, np.float32))
        out.append(step.text)
    return out, step.finish_reason, step.stop_type


def llama_cpp_indent(text: str, n_indent: int) -> str | None:
    """llama-server's indentation check on the whole text, its rule written over lines: after the first
    newline, a line whose first character other than a space or a tab follows fewer than ``n_indent`` of
    them is cut there (its indentation kept); None when no line is."""
    pos = text.find("\n") + 1
    while pos > 0:
        i = pos
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and i - pos < n_indent:
            return text[:i]
        pos = text.find("\n", pos) + 1
    return None


CASES = [
    (["def f():", "\n", "    ", "return 1", "\n", "print", "(2)"], 4, "def f():\n    return 1\n"),
    (["a", "\n ", "b"], 2, "a\n "),  # the short indentation stays, the rest of the line goes
    (["a\n", "\n", "b"], 1, "a\n"),  # an empty line is a line indented by nothing
    (["x", "\n\t\t", "y", "\n", "\tz"], 2, "x\n\t\ty\n\t"),
    (["if x", ":\n  y\nz", "zz"], 2, "if x:\n  y\n"),  # several lines in one token
]


@pytest.mark.parametrize(("pieces", "n", "want"), CASES)
def test_indentation_cuts_where_llama_cpp_does(pieces, n, want):
    assert llama_cpp_indent("".join(pieces), n) == want
    texts, reason, stop_type = run(pieces, n_indent=n)
    assert "".join(texts) == want and (reason, stop_type) == ("length", "limit")


@pytest.mark.parametrize(
    ("pieces", "n"),
    [
        (["first line", "\n", "    ok", "\n", "    also"], 4),
        (["  a", "\n", "  b"], 0),
        (["no newline at all"], 9),
    ],
)
def test_indented_lines_and_the_first_line_pass(pieces, n):
    texts, reason, stop_type = run(pieces, n_indent=n)
    assert "".join(texts) == "".join(pieces) and (reason, stop_type) == ("stop", "eos")


def test_text_held_for_a_stop_string_is_dropped_after_a_cut():
    # "z" is held back (it may start the stop string "zz"); the cut comes before it
    texts, reason, _ = run(["a", "\n", "z", "b"], n_indent=1, stop=["zz"])
    assert "".join(texts) == "a\n" and reason == "length"


def test_time_limit_stops_at_a_newline_after_it_passed():
    clock = iter([0.0, 0.2, 0.4, 0.6, 0.8]).__next__
    lim = LineLimits(t_max_predict_ms=300, clock=clock)
    lim.start()  # t0 = 0
    assert lim.feed("a\n") == ("a\n", False)  # 0.2 s: not yet
    assert lim.feed("b") == ("b", False)  # no newline: no clock read
    assert lim.feed("c\nd") == ("c\nd", True)  # 0.4 s > 0.3 s
    texts, reason, stop_type = run(["ab", "\n", "cd", "\n", "ef"], t_max_predict_ms=1e-6)
    assert "".join(texts) == "ab\n" and (reason, stop_type) == ("length", "limit")
    texts, reason, _ = run(["ab", "\n", "cd"], t_max_predict_ms=0)  # off
    assert "".join(texts) == "ab\ncd" and reason == "stop"


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(["a", "b c", " ", "  ", "\t", "\n", "\n  ", " x\n", "\n\n", "if:\n    y"]),
        max_size=12,
    ),
    st.integers(0, 5),
)
def test_any_text_against_llama_cpps_rule(pieces, n):
    full = "".join(pieces)
    want = llama_cpp_indent(full, n) if n > 0 else None
    texts, reason, _ = run(pieces, n_indent=n)
    assert "".join(texts) == (full if want is None else want)
    assert reason == ("stop" if want is None else "length")
