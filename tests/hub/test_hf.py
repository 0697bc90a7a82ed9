"""Hugging Face downloads through huggingface_hub against a fake Hub on 127.0.0.1 (tests/hub/fake_hub.py):
the quant choice, split models and mmproj, resume after a cut connection, a corrupted file refused,
offline mode, and the errors that list the repo's GGUF files."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from llamapy import hub
from llamapy.hub import hf


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_parse_ref():
    assert hf.parse_ref("user/repo:q4_k_m") == hf.HFRef("user/repo", "q4_k_m")
    assert hf.parse_ref("user/Repo-GGUF") == hf.HFRef("user/Repo-GGUF", "")
    for bad in ("repo", "a/b/c", "user/repo:", ":x", "user/repo:a:b"):
        with pytest.raises(hf.HubError, match="expected user/repo"):
            hf.parse_ref(bad)
    assert hf.looks_like_ref("user/repo:Q8_0") and not hf.looks_like_ref("models/x.gguf")
    assert not hf.looks_like_ref("./a/b")


def test_choice_as_llama_cpp():
    files = ["a-Q8_0.gguf", "a-f16.gguf", "a-Q4_K_M.gguf", "mmproj-a-f16.gguf", "a-IQ4_XS-00002-of-00002.gguf",
             "a-IQ4_XS-00001-of-00002.gguf", "sub/b-Q4_K_M.gguf"]  # fmt: skip
    assert hf.find_best_model(files, "") == "a-Q4_K_M.gguf"
    assert hf.find_best_model(files, "f16") == "a-f16.gguf"  # not the mmproj
    assert hf.find_best_model(files, "iq4_xs") == "a-IQ4_XS-00001-of-00002.gguf"
    assert hf.find_best_model(files, "Q2_K") is None
    assert hf.find_best_model(["x-q8_0.gguf", "x-bf16.gguf"], "") == "x-q8_0.gguf"
    assert hf.find_best_model(["x-bf16.gguf", "mmproj.gguf"], "") == "x-bf16.gguf"
    assert hf.split_parts(files, "a-IQ4_XS-00001-of-00002.gguf") == [
        "a-IQ4_XS-00001-of-00002.gguf", "a-IQ4_XS-00002-of-00002.gguf"]  # fmt: skip
    assert hf.find_best_mmproj(files, "a-Q4_K_M.gguf") == "mmproj-a-f16.gguf"
    assert hf.find_best_mmproj(["sub/mmproj.gguf"], "a-Q4_K_M.gguf") is None  # not the model's folder


def test_hf_picks_the_quant(hf_env, fake_hub):
    m = hf.download("test/tiny-GGUF")  # no tag: Q4_K_M first
    assert m.files == ["tiny-Q4_K_M.gguf"] and m.name == "test/tiny-GGUF:Q4_K_M"
    assert sha(m.path) == fake_hub.repos["test/tiny-GGUF"]["tiny-Q4_K_M.gguf"].sha256
    assert str(m.path).startswith(str(hf_env))  # huggingface_hub's cache layout
    assert "models--test--tiny-GGUF" in str(m.path) and m.mmproj is None
    for tag, f in [("q8_0", "tiny-Q8_0.gguf"), ("Q5_K_S", "tiny-Q5_K_S.gguf"), ("f16", "tiny-F16.gguf")]:
        m = hf.download(f"test/tiny-GGUF:{tag}")
        assert m.files == [f] and sha(m.path) == fake_hub.repos["test/tiny-GGUF"][f].sha256
    assert hf.download("test/q8only-GGUF").files == ["only-Q8_0.gguf"]  # Q8_0 when there is no Q4_K_M
    assert hf.download("test/tiny-GGUF", hf_file="TINY-F16.gguf").files == ["tiny-F16.gguf"]  # -hff


def test_unknown_quant_lists_the_gguf_files(hf_env):
    with pytest.raises(hf.NoMatchingFileError) as e:
        hf.download("test/tiny-GGUF:Q2_K")
    msg = str(e.value)
    assert "no GGUF file matching the quant 'Q2_K' in test/tiny-GGUF" in msg
    assert "tiny-Q8_0.gguf" in msg and "tiny-Q4_K_M.gguf" in msg and "README" not in msg
    with pytest.raises(hf.NoMatchingFileError, match="file 'nope.gguf' not found"):
        hf.download("test/tiny-GGUF", hf_file="nope.gguf")


def test_unknown_repo(hf_env, fake_hub):
    with pytest.raises(hf.HubError, match=f"repository test/nope not found on {fake_hub.url}"):
        hf.download("test/nope:Q4_K_M")


def test_split_and_mmproj_come_along(hf_env, fake_hub):
    m = hf.download("test/split-GGUF")
    names = sorted(fake_hub.repos["test/split-GGUF"])
    assert len(names) >= 2 and m.files == names
    assert [sha(p) for p in m.paths] == [fake_hub.repos["test/split-GGUF"][n].sha256 for n in names]
    from llamapy.gguf import open_model

    with open_model(m.path) as g:  # the first part opens the whole model from the cache
        assert g.n_split == len(names)
    v = hf.download("test/vision-GGUF")
    assert v.mmproj_file == "mmproj-vision-F16.gguf" and v.mmproj is not None and v.mmproj.is_file()
    assert hf.download("test/vision-GGUF", mmproj=False).mmproj is None


def test_cut_download_resumes_with_the_right_sha256(hf_env, fake_hub, monkeypatch):
    import huggingface_hub.constants

    # huggingface_hub writes 10 MB chunks: smaller ones, so that the half before the cut reaches the disk
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 16384)
    f = fake_hub.repos["test/flaky-GGUF"]["flaky-Q4_K_M.gguf"]
    f.cut = True
    m = hf.download("test/flaky-GGUF")
    assert sha(m.path) == f.sha256
    ranges = fake_hub.gets("flaky-Q4_K_M.gguf")
    assert ranges[0] is None and len(ranges) == 2  # the first GET was cut ...
    start = int(ranges[1].removeprefix("bytes=").split("-")[0])
    assert 0 < start < len(f.data)  # ... and the second resumed where it stopped
    # (huggingface_hub >= 1.x downloads into a per-process temporary file: a killed process leaves nothing
    # that a later process could resume; within one process a cut connection resumes as above)


def test_corrupted_download_is_refused(hf_env, fake_hub):
    with pytest.raises(hf.HubError, match="corrupted download of bad-Q4_K_M.gguf .* sha256"):
        hf.download("test/bad-GGUF")
    blob = (
        hf_env
        / "models--test--bad-GGUF"
        / "blobs"
        / fake_hub.repos["test/bad-GGUF"]["bad-Q4_K_M.gguf"].sha256
    )
    assert not blob.exists()  # nothing corrupted is left in the cache


def test_offline_uses_the_cache_and_fails_clearly(hf_env, fake_hub, monkeypatch):
    online = hf.download("test/tiny-GGUF:Q8_0")
    fake_hub.log.clear()
    assert hf.download("test/tiny-GGUF:Q8_0", offline=True).path == online.path
    assert hf.download("test/tiny-GGUF:q8_0", offline=True).files == ["tiny-Q8_0.gguf"]
    assert fake_hub.log == []  # not one request
    with pytest.raises(
        hf.HubError, match=r"test/tiny-GGUF:Q4_K_M is not in the cache .*offline.*tiny-Q8_0.gguf"
    ):
        hf.download("test/tiny-GGUF:Q4_K_M", offline=True)
    with pytest.raises(hf.HubError, match=r"test/split-GGUF is not in the cache .*offline"):
        hf.download("test/split-GGUF", offline=True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hf.download("test/tiny-GGUF:Q8_0").path == online.path
    assert fake_hub.log == []


def test_resolve_model_takes_a_ref(hf_env, fake_hub):
    p = hub.resolve_model("test/tiny-GGUF:Q8_0")
    assert sha(p) == fake_hub.repos["test/tiny-GGUF"]["tiny-Q8_0.gguf"].sha256


def test_hub_unreachable_uses_the_cache(hf_env, fake_hub, monkeypatch, capsys):
    import huggingface_hub

    online = hf.download("test/tiny-GGUF:Q8_0")

    def down(*a, **k):
        raise ConnectionError("network is down")

    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files", down)
    fake_hub.log.clear()
    assert hf.download("test/tiny-GGUF:Q8_0").path == online.path
    assert fake_hub.log == []  # the file is not asked for again either
    assert (
        "cannot be reached (ConnectionError); using the cached files of test/tiny-GGUF"
        in capsys.readouterr().err
    )
    with pytest.raises(hf.HubUnreachableError, match="cannot list test/split-GGUF on .*network is down"):
        hf.download("test/split-GGUF")
