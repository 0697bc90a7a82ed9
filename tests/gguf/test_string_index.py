"""StringIndex answers as the dict it stands for: dict(zip(strings, range(n))) (last position wins) or
the first position, for any strings (repeats, empty, non-ASCII, escaped bytes) and any key, before and
after it builds that dict."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamapy.gguf.string_index import StringIndex
from llamapy.gguf.strings import StringArray

# short texts from a small alphabet (so that lengths, tails and whole texts repeat), escaped bytes included
_ALPHABET = "ab\u0120\u00e9\u4e2d \n\udcff\udcc3"
texts = st.lists(st.text(alphabet=_ALPHABET, max_size=12), max_size=60)


def _expected(strings: list[str], last: bool) -> dict[str, int]:
    if last:
        return dict(zip(strings, range(len(strings)), strict=True))
    return dict(zip(reversed(strings), range(len(strings) - 1, -1, -1), strict=True))


@settings(max_examples=200, deadline=None)
@given(strings=texts, others=st.lists(st.text(alphabet=_ALPHABET, max_size=12), max_size=20),
       last=st.booleans(), budget=st.sampled_from([0, 3, 10**6]))  # fmt: skip
def test_lookups_match_the_dict(strings: list[str], others: list[str], last: bool, budget: int) -> None:
    arr = StringArray.from_strings(strings)
    idx = StringIndex(arr, last=last, budget=budget)
    want = _expected(arr.tolist(), last)
    for key in [*strings, *others]:
        assert idx.get(key) == want.get(key), key
        assert idx.get(key, -7) == want.get(key, -7)
        assert (key in idx) == (key in want)
        if key in want:
            assert idx[key] == want[key]
        else:
            with pytest.raises(KeyError):
                idx[key]
    assert idx.built == (budget < 4 * (len(strings) + len(others)))  # four lookups a key above
    assert dict(idx.items()) == want and len(idx) == len(want) and list(idx) == list(want)
    assert idx == want and idx.built
    assert idx.get(strings[0] if strings else "x") == want.get(strings[0] if strings else "x")


def test_keys_that_are_not_decoded_strings() -> None:
    """Escaped bytes spelling valid UTF-8 and lone surrogates are no string's decoded text; non-str keys
    are missing; unhashable ones raise as a dict's lookup does."""
    arr = StringArray.from_strings(["\u00e9", "a", b"\xc3", "a"])
    idx = StringIndex(arr, budget=100)
    assert idx.get("\udcc3\udca9") is None  # the bytes of "é", escaped
    assert idx.get("\ud800") is None
    assert idx.get("\udcc3") == 2 and idx.get("a") == 3 and idx.get("\u00e9") == 0
    assert idx.get(5) is None and 5 not in idx
    with pytest.raises(TypeError):
        idx.get([1])  # type: ignore[arg-type]
    assert not idx.built


def test_lookups_stay_cheap_until_the_budget() -> None:
    arr = StringArray.from_strings([f"t{i}" for i in range(1000)] + ["t5"])
    idx = StringIndex(arr, last=False, budget=2)
    assert idx.get("t5") == 5 and idx.get("t999") == 999 and not idx.built
    assert idx.get("t5") == 5 and idx.built  # the third lookup builds the dict, the same answer
    assert StringIndex(arr, last=True).get("t5") == 1000


def test_threads_share_an_index_while_it_builds() -> None:
    """Lookups from several threads, the dict built by one of them midway: every answer is the dict's."""
    import threading

    strings = [f"w{i % 700}" for i in range(2000)]
    arr = StringArray.from_strings(strings)
    want = _expected(strings, True)
    idx = StringIndex(arr, last=True, budget=500)
    bad: list[str] = []

    def work(k: int) -> None:
        for i in range(k, 2000, 4):
            key = strings[i] if i % 3 else f"x{i}"
            if idx.get(key) != want.get(key):
                bad.append(key)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad and idx.built


@pytest.mark.parametrize("scans", [0, 5, 10**6])
def test_scanned_and_sorted_lookups_agree(monkeypatch, scans: int) -> None:
    """The first ``SCAN_LOOKUPS`` lookups compare every key, later ones search the sorted keys: the same
    answers either way, repeated texts and texts sharing a key (length and last bytes) included."""
    from llamapy.gguf import string_index

    monkeypatch.setattr(string_index, "SCAN_LOOKUPS", scans)
    strings = [f"{p}-suffix" for p in ("a", "b", "a", "cc", "d")] + ["x" * 9, "y" * 9, "a-suffix"]
    arr = StringArray.from_strings(strings)
    for last in (True, False):
        idx = StringIndex(arr, last=last, budget=10**6)
        want = _expected(strings, last)
        for key in [*strings, "z-suffix", "x" * 8, ""] * 3:
            assert idx.get(key) == want.get(key), (key, last)
        assert (idx._sorted is not None) == (scans < 3 * 11)
