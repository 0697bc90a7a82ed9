"""The pieces of llamapy.ray that need no cluster: the prefix index, the routing keys, the CLI's error
when Ray is missing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from llamapy.ray.keys import key_pieces, key_tokens
from llamapy.ray.prefix import PrefixIndex, block_keys


def test_block_keys_chain_the_prefix() -> None:
    a = list(range(64))
    b = list(range(32)) + [999] + list(range(33, 64))
    assert len(block_keys(a, 16)) == 4 and len(block_keys(a[:47], 16)) == 2  # partial blocks have no key
    ka, kb = block_keys(a, 16), block_keys(b, 16)
    assert ka[:2] == kb[:2] and ka[2] != kb[2] and ka[3] != kb[3]  # after a difference nothing matches


def test_longest_prefix_wins_and_forget() -> None:
    idx = PrefixIndex(block=4)
    idx.insert("r1", list(range(8)))
    idx.insert("r2", list(range(16)))
    assert idx.match(list(range(12)) + [77, 78, 79, 80]) == {"r1": 8, "r2": 12}
    assert idx.match(list(range(16)), candidates=["r1"]) == {"r1": 8}
    assert idx.match([5, 5, 5, 5]) == {}
    idx.forget("r2")
    assert idx.match(list(range(16))) == {"r1": 8} and idx.replicas() == ["r1"]
    idx.forget("r1")
    assert len(idx) == 0 and idx.match(list(range(16))) == {}


def test_lru_cap_per_replica() -> None:
    idx = PrefixIndex(block=2, max_blocks_per_replica=3)
    idx.insert("r", [1, 2, 3, 4, 5, 6])  # 3 blocks
    idx.insert("r", [9, 9, 8, 8])  # 2 more: the 2 oldest go
    assert idx.n_blocks("r") == 3
    assert idx.match([9, 9, 8, 8]) == {"r": 4}
    assert idx.match([1, 2, 3, 4]) == {}  # its first block was evicted: the chain is broken


def test_bad_index_sizes() -> None:
    with pytest.raises(ValueError):
        PrefixIndex(block=0)


def _tok(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_next_turn_key_extends_the_first() -> None:
    turn1 = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}
    turn2 = {"messages": turn1["messages"] + [{"role": "assistant", "content": "Hello!"},
                                              {"role": "user", "content": "More"}]}  # fmt: skip
    k1, _ = key_tokens(turn1, _tok)
    k2, _ = key_tokens(turn2, _tok)
    assert k1 and k2[: len(k1)] == k1 and len(k2) > len(k1)


def test_key_shapes() -> None:
    parts = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]}]
    }
    assert key_pieces(parts)[0] == ["user\na[image_url]\n"]
    assert key_pieces({"prompt": [1, 2, 3]})[0] == [1, 2, 3]
    assert key_pieces({"prompt": "abc", "user": "u1"}) == (["abc"], "u1")
    assert key_pieces({"system": "s", "messages": [], "metadata": {"user_id": "x"}}) == (["system\ns\n"], "x")
    assert key_pieces({"input": "hi", "instructions": "be"})[0] == ["instructions\nbe\n", "hi"]
    assert key_pieces(["not", "a", "dict"]) == ([], None)
    assert key_pieces({"messages": "oops", "prompt": 5}) == ([], None)
    huge = {"prompt": "x" * 10_000_000}
    assert sum(len(p) for p in key_pieces(huge)[0]) <= 16384  # bounded, whatever the body holds


def test_cli_without_ray_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from llamapy.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    monkeypatch.setitem(sys.modules, "ray.serve", None)
    assert main(["serve-ray", "-m", "whatever.gguf", "--replicas", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "pip install 'llamapy[ray]'" in err


def test_cli_bad_autoscaling_bounds(capsys: pytest.CaptureFixture) -> None:
    from llamapy.cli import main

    with pytest.raises(SystemExit) as e:
        main(["serve-ray", "-m", "whatever.gguf", "--min-replicas", "3", "--max-replicas", "2"])
    assert "--min-replicas" in str(e.value.code)


def test_autoscaling_options_pass_through() -> None:
    import argparse

    from llamapy.cli.serve_ray import _autoscaling

    ns = argparse.Namespace(min_replicas=1, max_replicas=4, replicas=2, target_ongoing_requests=3.0)
    assert _autoscaling(ns) == {
        "min_replicas": 1,
        "max_replicas": 4,
        "initial_replicas": 2,
        "target_ongoing_requests": 3.0,
    }
    ns = argparse.Namespace(min_replicas=None, max_replicas=None, replicas=2, target_ongoing_requests=2.0)
    assert _autoscaling(ns) is None  # a fixed number of replicas


def test_build_app_bad_arguments() -> None:
    from llamapy.ray import build_app, from_args

    with pytest.raises(ValueError, match="routing"):
        build_app("m.gguf", 2, routing="random")
    with pytest.raises(ValueError, match="replicas"):
        build_app("m.gguf", 0)
    with pytest.raises(ValueError, match="model"):
        from_args({"replicas": 2})
    assert from_args({"model": "m.gguf", "replicas": 2, "threads": 2}) is not None  # no cluster needed


def test_cli_not_a_gguf_fails_before_any_cluster(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from llamapy.cli import main

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    assert main(["serve-ray", "-m", str(bad), "--replicas", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "GGUF" in err
