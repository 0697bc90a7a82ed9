"""``Llama.from_pretrained`` as llama-cpp-python: glob file names against the fake Hub, split models,
additional files, ``local_dir``/``cache_dir``, and a clear typed error on none or several matches."""

from __future__ import annotations

import hashlib

import pytest

from llamapy import Llama
from llamapy.hub import NoMatchingFileError


def test_glob_loads_the_model(hf_env, fake_hub):
    llm = Llama.from_pretrained("test/chat-GGUF", "*q4_k_m.gguf", n_ctx=64, verbose=False)  # any case
    assert str(llm.model.path).endswith("chat-Q4_K_M.gguf") and "models--test--chat-GGUF" in str(
        llm.model.path
    )
    assert llm.tokenize(b"hi")  # the real vocabulary came along


def test_split_model_and_additional_files(hf_env, fake_hub):
    llm = Llama.from_pretrained("test/split-GGUF", "*00001-of-*.gguf", n_ctx=64, vocab_only=True)
    assert str(llm.model.path).endswith("Big-Q4_K_M-00001-of-00003.gguf")
    parts = list((hf_env / "models--test--split-GGUF" / "snapshots").rglob("*.gguf"))
    assert len(parts) == len(fake_hub.repos["test/split-GGUF"])  # every part was fetched
    Llama.from_pretrained("test/vision-GGUF", "vision-*.gguf", additional_files=["mmproj-*"], vocab_only=True)
    assert list((hf_env / "models--test--vision-GGUF").rglob("mmproj-vision-F16.gguf"))


def test_local_dir_and_cache_dir(hf_env, fake_hub, tmp_path):
    Llama.from_pretrained("test/tiny-GGUF", "*Q8_0.gguf", local_dir=tmp_path / "here", vocab_only=True)
    f = tmp_path / "here" / "tiny-Q8_0.gguf"
    assert (
        hashlib.sha256(f.read_bytes()).hexdigest()
        == fake_hub.repos["test/tiny-GGUF"]["tiny-Q8_0.gguf"].sha256
    )
    Llama.from_pretrained("test/tiny-GGUF", "*F16*", cache_dir=tmp_path / "c", vocab_only=True)
    assert list((tmp_path / "c" / "models--test--tiny-GGUF").rglob("tiny-F16.gguf"))


def test_none_or_several_matches_raise_a_clear_error(hf_env, fake_hub):
    with pytest.raises(NoMatchingFileError) as e:
        Llama.from_pretrained("test/tiny-GGUF", "*Q2_K.gguf")
    assert "no file of test/tiny-GGUF matches '*Q2_K.gguf'" in str(e.value)
    assert "tiny-Q4_K_M.gguf" in str(e.value) and e.value.gguf_files == sorted(e.value.gguf_files)
    assert isinstance(e.value, ValueError)  # what llama-cpp-python raises
    with pytest.raises(NoMatchingFileError, match=r"4 files of test/tiny-GGUF match '\*.gguf'"):
        Llama.from_pretrained("test/tiny-GGUF", "*.gguf")
    fake_hub.log.clear()
    with pytest.raises(NoMatchingFileError, match=r"no file of test/vision-GGUF matches 'x\*'"):
        Llama.from_pretrained("test/vision-GGUF", "vision-*", additional_files=["x*"])
    assert fake_hub.gets("vision-Q8_0.gguf") == []  # checked before anything is downloaded
