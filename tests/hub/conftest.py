"""Fixtures of the Hub tests: tiny GGUF files (our writer), a fake Hub serving them on 127.0.0.1, and an
environment pointing huggingface_hub at it with an empty cache."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from llamapy.ggml.types import GGMLType
from llamapy.gguf import GGUFValueType
from llamapy.gguf.reader import GGUFReader
from llamapy.gguf.split import split_model
from llamapy.gguf.writer import GGUFWriter
from tests.hub.fake_hub import FakeFile, FakeHub
from tests.model.tiny import llama_config, random_llama_weights, tiny_llama, write_gguf
from tests.util import shared_path

VOCAB = "ggml-vocab-llama-spm.gguf"


def tiny_with_vocab(path: Path, seed: int = 0) -> Path:
    """A tiny random llama model with llama-spm's real vocabulary (so that prompts tokenize)."""
    src = GGUFReader(shared_path("vocab", VOCAB))
    n_vocab = len(src.get("tokenizer.ggml.tokens"))
    cfg = llama_config(n_vocab=n_vocab, n_embd=32, n_ff=48, n_layer=1)
    weights = random_llama_weights(cfg, seed, tied=True)
    write_gguf(path.with_suffix(".tmp"), "llama", cfg, weights, GGMLType.F16)
    base = GGUFReader(path.with_suffix(".tmp"))
    w = GGUFWriter(path, arch="llama")
    for k, f in base.fields.items():
        if k not in ("general.architecture", "GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"):
            w.add_key_value_raw(k, f.type, base.raw_value(k))
    for k, f in src.fields.items():
        if k.startswith("tokenizer."):
            w.add_key_value_raw(k, f.type, src.raw_value(k))
    for t in base:
        w.add_tensor(t.name, np.ascontiguousarray(t.array()), ggml_type=t.ggml_type)
    w.write()
    w.close()
    base.close()
    src.close()
    path.with_suffix(".tmp").unlink()
    return path


def _tiny(path: Path, seed: int) -> bytes:
    return tiny_llama(path, seed=seed, n_layer=1, n_embd=32, n_ff=48).read_bytes()


@pytest.fixture(scope="module")
def fake_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHub]:
    d = tmp_path_factory.mktemp("hubfiles")
    q = {tag: _tiny(d / f"{tag}.gguf", i) for i, tag in enumerate(["Q4_K_M", "Q8_0", "F16", "q5_k_s"])}
    mmproj = GGUFWriter(d / "mmproj.gguf", arch="clip")
    mmproj.add_metadata({"clip.has_vision_encoder": True}, int_type=GGUFValueType.UINT32)
    mmproj.add_tensor("v.dummy", np.zeros((4, 4), np.float32))
    mmproj.write()
    mmproj.close()
    tiny_llama(d / "big.gguf", seed=7, n_layer=3, n_embd=32, n_ff=48)
    parts = [p for p, _ in split_model(d / "big.gguf", d / "Big-Q4_K_M", max_tensors=12)]
    hub = FakeHub()
    hub.repos["test/tiny-GGUF"] = {
        "README.md": FakeFile(b"# tiny\n"),
        "tiny-Q8_0.gguf": FakeFile(q["Q8_0"]),
        "tiny-F16.gguf": FakeFile(q["F16"]),
        "tiny-Q4_K_M.gguf": FakeFile(q["Q4_K_M"]),
        "tiny-Q5_K_S.gguf": FakeFile(q["q5_k_s"]),
    }
    hub.repos["test/vision-GGUF"] = {
        "vision-Q8_0.gguf": FakeFile(q["Q8_0"]),
        "mmproj-vision-F16.gguf": FakeFile((d / "mmproj.gguf").read_bytes()),
    }
    hub.repos["test/split-GGUF"] = {Path(p).name: FakeFile(Path(p).read_bytes()) for p in parts}
    hub.repos["test/q8only-GGUF"] = {"only-Q8_0.gguf": FakeFile(q["Q8_0"])}
    hub.repos["test/flaky-GGUF"] = {"flaky-Q4_K_M.gguf": FakeFile(q["F16"] + b"\0" * 300_000, cut=True)}
    hub.repos["test/bad-GGUF"] = {"bad-Q4_K_M.gguf": FakeFile(q["Q4_K_M"], corrupt=True)}
    hub.repos["test/chat-GGUF"] = {
        "chat-Q4_K_M.gguf": FakeFile(tiny_with_vocab(d / "chat.gguf").read_bytes())
    }
    hub.start()
    yield hub
    hub.stop()


@pytest.fixture
def hf_env(fake_hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HF_ENDPOINT at the fake hub, an empty HF cache (returned), no token, online."""
    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("LLAMAPY_CACHE", str(tmp_path / "llamapy-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    # huggingface_hub reads HF_ENDPOINT and HF_HUB_OFFLINE once, at import (huggingface_hub.constants):
    # llamapy reads them at each call and passes endpoint= and local_files_only= itself, which this checks
    fake_hub.log.clear()
    return cache
