"""Loader and hyper-parameters: real files, tiny files, and clear errors for broken ones."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.ggml.types import GGMLType
from llamapy.model import Model, ModelLoadError
from llamapy.model.hparams import MetaReader
from tests.model.tiny import llama_config, random_llama_weights, tiny_llama, write_gguf


def test_smollm2_hparams(smollm2_path):
    m = Model.load(smollm2_path)
    hp = m.hparams
    assert (m.arch, hp.n_layer, hp.n_embd, m.n_vocab, m.n_ctx_train) == ("llama", 30, 576, 49152, 8192)
    assert hp.n_head == [9] * 30 and hp.n_head_kv == [3] * 30 and hp.n_embd_head_k == 64
    assert hp.rope_freq_base == 100000.0 and hp.rope_type == 0 and not hp.has_swa
    assert m.desc == "llama 135M Q4_1"
    assert m.vocab is not None and m.vocab.n_tokens == 49152
    # tied output: the file has no output.weight
    assert "output.weight" not in m.impl.w and m.impl.output_weight().name == "token_embd.weight"
    # weights keep their GGUF type (no float copy)
    q = m.impl.blocks[0]["attn_q.weight"]
    assert q.type == GGMLType.Q4_1 and q.data.dtype == np.uint8
    assert m.size < 100 * 2**20


def test_gemma3_hparams(gemma3_path):
    m = Model.load(gemma3_path)
    hp = m.hparams
    assert hp.n_layer == 18 and hp.n_swa == 512 and hp.n_embd_head_k == 256 and hp.n_head_kv == [1] * 18
    assert [il for il in range(18) if not hp.is_swa(il)] == [5, 11, 17]
    assert hp.rope_freq_base == 1e6 and hp.rope_freq_base_swa == 10000.0 and hp.rope_type == 2
    assert hp.f_attention_scale == pytest.approx(1 / 16)
    assert m.load_time_s < 5


def test_tiny_load_modes_and_progress(tmp_path):
    p = tiny_llama(tmp_path / "t.gguf")
    seen = []
    m = Model.load(p, use_mmap=False, progress_callback=lambda f: seen.append(f))
    assert seen and seen[-1] == pytest.approx(1.0) and seen == sorted(seen)
    assert m.hparams.n_layer == 2 and m.desc.startswith("llama ")
    with pytest.raises(ModelLoadError, match="cancelled"):
        Model.load(p, progress_callback=lambda f: False)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # mlock may be refused by RLIMIT_MEMLOCK: a warning, not an error
        assert Model.load(p, use_mlock=True).hparams.n_layer == 2
    v = Model.load(p, vocab_only=True)
    assert v.impl is None and v.hparams.n_vocab == 64


def _write(tmp_path, weights, meta=None, arch="llama"):
    return write_gguf(tmp_path / "bad.gguf", arch, llama_config(), weights, "f32", meta)


def test_errors_name_what_and_where(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        Model.load(tmp_path / "nope.gguf")
    w = random_llama_weights(llama_config())
    with pytest.raises(ModelLoadError, match="unknown model architecture 'banana'"):
        Model.load(_write(tmp_path, w, arch="banana"))
    w2 = dict(w)
    del w2["blk.1.ffn_up.weight"]
    with pytest.raises(ModelLoadError, match=r"tensor 'blk.1.ffn_up.weight' is missing"):
        Model.load(_write(tmp_path, w2))
    w3 = dict(w)
    w3["blk.0.attn_k.weight"] = np.zeros((16, 64), np.float32)
    with pytest.raises(
        ModelLoadError, match=r"'blk.0.attn_k.weight' has wrong shape \(16, 64\); expected \(32, 64\)"
    ):
        Model.load(_write(tmp_path, w3))
    w4 = dict(w, **{"blk.0.extra.weight": np.zeros(4, np.float32)})
    with pytest.raises(ModelLoadError, match="not used"):
        Model.load(_write(tmp_path, w4))
    with pytest.raises(ModelLoadError, match=r"'llama.attention.head_count' has type str"):
        Model.load(_write(tmp_path, w, {"llama.attention.head_count": "four"}))
    with pytest.raises(ModelLoadError, match="head_count_kv"):
        Model.load(_write(tmp_path, w, {"llama.attention.head_count_kv": 3}))
    from llamapy.gguf.writer import GGUFWriter

    wr = GGUFWriter(tmp_path / "qnorm.gguf", arch="llama")
    for k, v in {"llama.context_length": 256, "llama.embedding_length": 64, "llama.block_count": 2,
                 "llama.feed_forward_length": 96, "llama.attention.head_count": 2}.items():  # fmt: skip
        wr.add_key_value(k, v)
    for k, v in w.items():
        wr.add_tensor(k, v, ggml_type="q8_0" if k == "output_norm.weight" else None)
    wr.write()
    wr.close()
    with pytest.raises(ModelLoadError, match="'output_norm.weight' has type Q8_0"):
        Model.load(tmp_path / "qnorm.gguf")
    good = _write(tmp_path, w)
    data = good.read_bytes()
    short = tmp_path / "short.gguf"
    short.write_bytes(data[: len(data) - 100])
    with pytest.raises(ModelLoadError, match="past the end of the file"):
        Model.load(short)


def test_meta_reader_messages():
    md = MetaReader({"x.a": 3, "x.arr": np.array([1, 2], np.int32), "x.f": "s"}, "x", where="f.gguf")
    assert md.u32("a") == 3 and md.u32("missing", 7) == 7
    with pytest.raises(ModelLoadError, match="f.gguf: metadata key 'x.missing' is missing"):
        md.u32("missing", required=True)
    with pytest.raises(ModelLoadError, match="2 entries, expected one per layer"):
        md.per_layer("arr", 3)
    assert md.per_layer("arr", 2) == [1, 2] and md.per_layer("a", 2) == [3, 3]
    with pytest.raises(ModelLoadError, match="expected a number"):
        md.f32("f")


def test_split_files_load_as_one(tmp_path):
    from llamapy.batch import Batch
    from llamapy.context import Context
    from llamapy.gguf.split import split_model

    p = tiny_llama(tmp_path / "whole.gguf", seed=7)
    plan = split_model(p, tmp_path / "part", max_tensors=5)
    assert len(plan) > 2
    logits = []
    for path in (p, plan[0][0]):
        ctx = Context(Model.load(path), n_ctx=64)
        ctx.decode(Batch.from_tokens([1, 2, 3]))
        logits.append(ctx.get_logits_ith(-1))
    np.testing.assert_array_equal(logits[0], logits[1])
