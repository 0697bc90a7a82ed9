"""Recurrent and hybrid memory: the sequence operations of ``RecurrentCache`` (a tail the state cannot
forget is refused), the equal sequence-major split, and a tiny Qwen3.5 (Gated DeltaNet + attention)
against transformers: two sequences in one batch, a prompt shared by two sequences, ``seq_cp`` then
diverging, ``seq_rm`` refused then whole, state save/load (bytes and files), ubatch splits."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest

from llamapy.batch import Batch, allocate
from llamapy.errors import LlamapyError
from llamapy.memory import StateError
from llamapy.memory.recurrent import RecurrentCache, RecurrentLayer

# -- RecurrentCache alone ----------------------------------------------------------------------------


def _cache(n_seq: int = 3) -> RecurrentCache:
    return RecurrentCache([RecurrentLayer(0, 6, 4), RecurrentLayer(2, 6, 0)], n_seq)


def _fill(c: RecurrentCache, seq: int, n: int, value: float) -> None:
    """As if ``n`` tokens of ``seq`` ran: positions recorded, rows set to ``value``."""
    p = np.arange(c.pos_max[seq] + 1, c.pos_max[seq] + 1 + n, dtype=np.int32)
    c.place(p, np.full(n, 1 << seq, np.uint64), np.full(n, seq, np.int32))
    for t in (*c.r.values(), *c.s.values()):
        c._rows(t)[seq] = value


def test_seq_rm_refuses_a_tail_and_takes_whole_sequences() -> None:
    c = _cache()
    _fill(c, 0, 5, 1.0)
    _fill(c, 1, 3, 2.0)
    assert not c.seq_rm(0, 2, -1)  # a tail: the state cannot forget it
    assert not c.seq_rm(0, 1, 3)  # the middle
    assert not c.seq_rm(-1, 2, -1)
    assert c.seq_pos_max(0) == 4 and (c._rows(c.r[0])[0] == 1).all()  # nothing changed
    assert c.seq_rm(0, 5, -1)  # beyond the end: nothing to remove
    assert c.seq_pos_max(0) == 4
    assert c.seq_rm(0, 0, -1)  # the whole sequence
    assert c.seq_pos_max(0) == -1 and (c._rows(c.r[0])[0] == 0).all() and (c._rows(c.s[0])[0] == 0).all()
    assert (c._rows(c.r[0])[1] == 2).all()  # the other sequence is untouched


def test_seq_cp_keep_clear_and_positions() -> None:
    c = _cache()
    _fill(c, 0, 4, 3.0)
    c.seq_cp(0, 2)
    assert c.seq_pos_max(2) == 3 and c.seq_pos_min(2) == 0
    assert (c._rows(c.s[0])[2] == 3).all()
    c.seq_add(2, 0, -1, 5)
    assert (c.seq_pos_min(2), c.seq_pos_max(2)) == (5, 8)
    c.seq_keep(2)
    assert c.seq_pos_max(0) == -1 and (c._rows(c.r[0])[0] == 0).all()
    c.clear()
    assert c.seq_pos_max(2) == -1 and not c.r[0].data.any()


def test_state_roundtrip_and_bad_state() -> None:
    c = _cache()
    _fill(c, 1, 4, 5.0)
    data = c.state_write(1)
    d = _cache()
    assert d.state_read(data, 0) == len(data)
    assert d.seq_pos_max(0) == 3 and (d._rows(d.s[0])[0] == 5).all()
    with pytest.raises(StateError, match="truncated"):
        _cache().state_read(data[:-3], 0)
    other = RecurrentCache([RecurrentLayer(0, 8, 4), RecurrentLayer(2, 6, 0)], 3)
    with pytest.raises(StateError, match="does not match"):
        other.state_read(data, 0)


def test_place_needs_equal_sequence_major_streams() -> None:
    c = _cache()
    with pytest.raises(LlamapyError, match="equal runs"):
        c.place(np.array([0, 1, 0], np.int32), np.array([1, 1, 2], np.uint64), np.array([0, 0, 1], np.int32))
    with pytest.raises(LlamapyError, match="share a sequence"):
        c.place(np.array([0, 0], np.int32), np.array([1, 3], np.uint64), np.array([0, 0], np.int32))


def test_split_equal_sequence_major() -> None:
    b = Batch()
    for i in range(5):
        b.add(10 + i, i, [0], True)
        if i < 3:
            b.add(20 + i, i, [1], True)
    ab = allocate(b, 256, 8, 2, 64, lambda s: -1)
    ubs = ab.split_equal(4, seq_major=True)
    assert [u.n_tokens for u in ubs] == [4, 2, 2]
    assert ubs[0].token.tolist() == [10, 11, 20, 21]  # stream after stream, each in position order
    assert ubs[2].token.tolist() == [13, 14]
    assert sorted(np.concatenate([u.idx for u in ubs]).tolist()) == list(range(8))


# -- a hybrid model against transformers ------------------------------------------------------------

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llamapy.context import Context, ContextParams  # noqa: E402
from llamapy.ggml.types import GGMLType  # noqa: E402
from llamapy.model import Model  # noqa: E402
from tests.model import hf_tiny  # noqa: E402

TOL = 1e-3


# every family with recurrent layers (the Qwen3.5-specific file tests below take ``qwen35``)
HYBRID = ["qwen35", "qwen3next", "lfm2", "mamba2", "granitehybrid", "nemotron_h", "falcon-h1", "jamba"]
HYBRID += ["nemotron_h_moe"]


@pytest.fixture(scope="module", params=HYBRID)
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> hf_tiny.TinyModel:
    torch.set_num_threads(1)
    return hf_tiny.make_tiny(hf_tiny.FAMILIES[request.param], tmp_path_factory.mktemp("rs"), seed=7)


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory: pytest.TempPathFactory) -> hf_tiny.TinyModel:
    torch.set_num_threads(1)
    return hf_tiny.make_tiny(hf_tiny.FAMILIES["qwen35"], tmp_path_factory.mktemp("rs35"), seed=7)


@pytest.fixture(scope="module")
def model(tiny: hf_tiny.TinyModel) -> Model:
    return Model.load(tiny.write(GGMLType.F32))


def _tokens(tag: str, n: int) -> list[int]:
    rng = np.random.default_rng(zlib.crc32(tag.encode()))
    return [int(t) for t in rng.integers(0, hf_tiny.N_VOCAB, n)]


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def _ctx(model: Model, **kw) -> Context:
    return Context(model, ContextParams(n_ctx=256, type_k="f32", type_v="f32", **kw))


def test_two_sequences_interleaved_then_a_step_each(tiny, model) -> None:
    a, b = _tokens("a", 15), _tokens("b", 10)
    ctx = _ctx(model, n_seq_max=2, n_ubatch=8)  # split sequence-wise into equal streams
    batch = Batch()
    order = sorted([(i, 0) for i in range(len(a) - 1)] + [(i, 1) for i in range(len(b) - 1)])
    for i, s in order:
        batch.add((a, b)[s][i], i, [s], True)
    ctx.decode(batch)
    got = ctx.get_logits()
    ref_a, ref_b = tiny.logits(a, GGMLType.F32), tiny.logits(b, GGMLType.F32)
    assert _rel(got[[k for k, (_, s) in enumerate(order) if s == 0]], ref_a[:-1]) < TOL
    assert _rel(got[[k for k, (_, s) in enumerate(order) if s == 1]], ref_b[:-1]) < TOL
    step = Batch()
    step.add(a[-1], len(a) - 1, [0], True)
    step.add(b[-1], len(b) - 1, [1], True)
    ctx.decode(step)
    assert _rel(ctx.get_logits()[0], ref_a[-1]) < TOL
    assert _rel(ctx.get_logits()[1], ref_b[-1]) < TOL


def test_seq_cp_then_diverging_and_a_shared_prompt(tiny, model) -> None:
    pre, x, y = _tokens("pre", 9), _tokens("x", 4), _tokens("y", 5)
    for shared in (False, True):
        ctx = _ctx(model, n_seq_max=3)
        if shared:  # the prompt's tokens belong to sequences 0 and 2 at once
            b = Batch()
            for i, t in enumerate(pre):
                b.add(t, i, [0, 2], i == len(pre) - 1)
            ctx.decode(b)
        else:
            ctx.decode(Batch.from_tokens(pre, seq_id=0))
            ctx.memory.seq_cp(0, 2)
        assert ctx.memory.seq_pos_max(2) == len(pre) - 1
        b = Batch()
        for i in range(max(len(x), len(y))):
            if i < len(x):
                b.add(x[i], len(pre) + i, [0], True)
            if i < len(y):
                b.add(y[i], len(pre) + i, [2], True)
        ctx.decode(b)
        rows0 = [k for k in range(b.n_tokens) if b.seq_id[k] == [0]]
        rows2 = [k for k in range(b.n_tokens) if b.seq_id[k] == [2]]
        assert _rel(ctx.get_logits()[rows0], tiny.logits(pre + x, GGMLType.F32)[len(pre) :]) < TOL
        assert _rel(ctx.get_logits()[rows2], tiny.logits(pre + y, GGMLType.F32)[len(pre) :]) < TOL


def test_seq_rm_of_a_tail_is_refused_whole_sequence_is_not(tiny, model) -> None:
    toks, other = _tokens("rm", 14), _tokens("rm2", 5)
    ctx = _ctx(model)
    ctx.decode(Batch.from_tokens(toks))
    assert not ctx.memory.seq_rm(0, 10, -1)  # the recurrent layers cannot drop their last 4 tokens
    assert ctx.memory.seq_pos_max(0) == len(toks) - 1  # nothing changed, in the KV cache neither
    ctx.decode(Batch.from_tokens(other, logits_all=True))  # so continuing is still right
    assert _rel(ctx.get_logits(), tiny.logits(toks + other, GGMLType.F32)[len(toks) :]) < TOL
    assert ctx.memory.seq_rm(0, -1, -1)  # the whole sequence: fine, and it starts over
    assert ctx.memory.seq_pos_max(0) == -1
    ctx.decode(Batch.from_tokens(other, logits_all=True))
    assert _rel(ctx.get_logits(), tiny.logits(other, GGMLType.F32)) < TOL


def test_state_save_load_continues_the_same(tiny, model, tmp_path: Path) -> None:
    toks, more = _tokens("st", 11), _tokens("st2", 4)
    ref = tiny.logits(toks + more, GGMLType.F32)[len(toks) :]
    ctx = _ctx(model, n_seq_max=2)
    ctx.decode(Batch.from_tokens(toks, seq_id=1))
    data = ctx.state_seq_get_data(1)
    ctx.state_seq_save_file(tmp_path / "s.bin", 1, toks)
    for load in ("bytes", "file"):
        other = _ctx(model, n_seq_max=2)
        if load == "bytes":
            assert other.state_seq_set_data(data, 0) == len(data)
        else:
            assert other.state_seq_load_file(tmp_path / "s.bin", 0) == toks
        assert other.memory.seq_pos_max(0) == len(toks) - 1
        other.decode(Batch.from_tokens(more, seq_id=0, logits_all=True))
        assert _rel(other.get_logits(), ref) < TOL, load
    with pytest.raises(StateError):
        _ctx(model).state_seq_set_data(data[:-10], 0)


def test_numpy_backend_and_chunked_prompt_agree(tiny, model) -> None:
    """The whole graph on the NumPy reference backend, and a prompt long enough for the chunked delta
    rule on the CPU (then one more token through the recurrent form)."""
    toks = _tokens("long", 70)
    ref = tiny.logits(toks, GGMLType.F32)
    ctx = _ctx(model)
    ctx.decode(Batch.from_tokens(toks[:-1], logits_all=True))
    first = ctx.get_logits().copy()
    ctx.decode(Batch.from_tokens(toks[-1:]))
    assert _rel(np.concatenate([first, ctx.get_logits()]), ref) < TOL
    npc = _ctx(model, backend="numpy")
    npc.decode(Batch.from_tokens(toks[:12], logits_all=True))
    assert _rel(npc.get_logits(), ref[:12]) < TOL


def _write_variant(
    tiny, tmp_path: Path, name: str, drop: str = "", md_set: dict | None = None, reshape: str = ""
):
    fam, cfg = tiny.family, tiny.hf.config
    tensors = dict(hf_tiny.convert(fam, cfg, hf_tiny.effective_state_dict(tiny.state, GGMLType.F32)))
    md = hf_tiny.metadata(fam, cfg, GGMLType.F32)
    if drop:
        del tensors[drop]
    if reshape:
        tensors[reshape] = tensors[reshape][:, :-1]
    md.update(md_set or {})
    md = {k: v for k, v in md.items() if v is not None}
    return hf_tiny.write_gguf(tmp_path / f"{name}.gguf", fam.arch, md, tensors, GGMLType.F32)


def test_bad_files_name_the_tensor_or_key(qwen35, tmp_path: Path) -> None:
    tiny = qwen35
    from llamapy.model.hparams import ModelLoadError

    with pytest.raises(ModelLoadError, match=r"blk\.1\.ssm_a"):
        Model.load(_write_variant(tiny, tmp_path, "no_a", drop="blk.1.ssm_a"))
    with pytest.raises(ModelLoadError, match=r"blk\.0\.ssm_conv1d\.weight.*shape"):
        Model.load(_write_variant(tiny, tmp_path, "conv", reshape="blk.0.ssm_conv1d.weight"))
    with pytest.raises(ModelLoadError, match=r"ssm\.inner_size"):
        Model.load(_write_variant(tiny, tmp_path, "inner", md_set={"qwen35.ssm.inner_size": 130}))
    with pytest.raises(ModelLoadError, match=r"ssm\.time_step_rank"):
        Model.load(_write_variant(tiny, tmp_path, "rank", md_set={"qwen35.ssm.time_step_rank": 3}))
    with pytest.raises(ModelLoadError, match=r"'qwen35\.ssm\.conv_kernel' is missing"):
        Model.load(_write_variant(tiny, tmp_path, "nokey", md_set={"qwen35.ssm.conv_kernel": None}))


def test_decode_reuses_its_graph_and_a_full_context_is_undone(tiny, model) -> None:
    """Token-by-token decode reuses one graph (the state rows are inputs); a batch that overflows the KV
    cache in its second ubatch leaves the recurrent states as before (the first ubatch is undone too)."""
    toks = _tokens("reuse", 8)
    ctx = _ctx(model)
    ctx.decode(Batch.from_tokens(toks[:4]))
    builds = ctx.n_graph_builds
    for t in toks[4:]:
        ctx.decode(Batch.from_tokens([t]))
    assert ctx.n_graph_builds == builds + 1 and ctx.n_graph_reuses >= 3
    from llamapy.memory import ContextFullError

    small = Context(model, ContextParams(n_ctx=256, n_batch=512, n_ubatch=200, type_k="f32", type_v="f32"))
    if not small.memory.caches:  # no attention layer (Mamba2): no cache to fill
        return
    small.decode(Batch.from_tokens(toks[:4]))
    before = small.state_seq_get_data(0)
    with pytest.raises(ContextFullError):
        small.decode(Batch.from_tokens(_tokens("big", 253)))  # 4 + 200 fit, the next 53 do not
    assert small.state_seq_get_data(0) == before
    small.decode(Batch.from_tokens(toks[4:], logits_all=True))
    assert _rel(small.get_logits(), tiny.logits(toks, GGMLType.F32)[4:]) < TOL


def test_checkpoints_unit() -> None:
    c = _cache()
    _fill(c, 0, 5, 1.0)  # positions 0..4
    assert c.checkpoint(0) == 4
    _fill(c, 0, 3, 2.0)  # 5..7
    assert c.checkpoint(0) == 7
    _fill(c, 0, 2, 3.0)  # 8..9
    assert not c.seq_rm(0, 6, -1) and c.seq_pos_restorable(0, 6) == 5
    assert c.seq_pos_restorable(0, 9) == 8 and c.seq_pos_restorable(0, 20) == 20
    c.seq_cp(0, 1)
    assert c.seq_rm(0, 5, -1)  # back to the checkpoint at 4; the later one is gone
    assert c.seq_pos_max(0) == 4 and (c._rows(c.s[0])[0] == 1).all()
    assert [k.pos_max for k in c.checkpoints[0]] == [4]
    assert c.seq_rm(1, 8, -1) and (c._rows(c.r[0])[1] == 2).all()  # the copy kept its checkpoints
    c.max_checkpoints = 2
    for _ in range(3):
        _fill(c, 2, 1, 0.0)
        c.checkpoint(2)
    assert [k.pos_max for k in c.checkpoints[2]] == [1, 2]
    c.seq_add(2, 0, -1, 3)
    assert 2 not in c.checkpoints


def test_prompt_cache_resumes_from_a_checkpoint(tiny, model) -> None:
    """A new prompt sharing 12 tokens with the cached 16 resumes after the checkpoint at position 9
    (10 tokens kept, not 0), with the logits of a cold run."""
    cached, other = _tokens("ck", 16), _tokens("ck2", 5)
    ctx = _ctx(model)
    ctx.decode(Batch.from_tokens(cached[:10]))
    assert ctx.memory.checkpoint(0) == 9
    ctx.decode(Batch.from_tokens(cached[10:]))
    new = cached[:12] + other
    assert not ctx.memory.seq_rm(0, 12, -1)  # no checkpoint at 11: refused, nothing changed
    q = ctx.memory.seq_pos_restorable(0, 12)
    assert q == 10 and ctx.memory.seq_rm(0, q, -1)
    assert ctx.memory.seq_pos_max(0) == q - 1
    ctx.decode(Batch.from_tokens(new[q:], logits_all=True))  # 7 tokens processed instead of 17
    assert _rel(ctx.get_logits(), tiny.logits(new, GGMLType.F32)[q:]) < TOL


def test_mtp_blocks_after_the_trunk_are_skipped(qwen35, tmp_path: Path) -> None:
    """A file with Qwen3.5's next-token-prediction block (``nextn_predict_layers``, block_count counting
    it) loads the trunk only and gives the same logits."""
    tiny = qwen35
    fam, cfg = tiny.family, tiny.hf.config
    tensors = dict(hf_tiny.convert(fam, cfg, hf_tiny.effective_state_dict(tiny.state, GGMLType.F32)))
    last = cfg.num_hidden_layers - 1
    for name in [n for n in tensors if n.startswith(f"blk.{last}.")]:
        tensors[name.replace(f"blk.{last}.", f"blk.{last + 1}.")] = tensors[name]
    tensors[f"blk.{last + 1}.nextn.eh_proj.weight"] = np.zeros(
        (cfg.hidden_size, 2 * cfg.hidden_size), np.float32
    )
    md = hf_tiny.metadata(fam, cfg, GGMLType.F32)
    md["qwen35.block_count"] = cfg.num_hidden_layers + 1
    md["qwen35.nextn_predict_layers"] = 1
    m = Model.load(hf_tiny.write_gguf(tmp_path / "mtp.gguf", fam.arch, md, tensors, GGMLType.F32))
    assert m.hparams.n_layer == cfg.num_hidden_layers
    toks = _tokens("mtp", 9)
    ctx = _ctx(m)
    ctx.decode(Batch.from_tokens(toks, logits_all=True))
    assert _rel(ctx.get_logits(), tiny.logits(toks, GGMLType.F32)) < TOL


def test_batch_order_does_not_matter(tiny, model) -> None:
    """Each sequence's own tokens listed before the prompt the two share, and positions reversed: the
    split still feeds every state its tokens in position order."""
    pre, x, y = _tokens("o-pre", 6), _tokens("o-x", 3), _tokens("o-y", 3)
    ctx = _ctx(model, n_seq_max=2)
    b = Batch()
    for i in reversed(range(3)):
        b.add(x[i], 6 + i, [0], True)
        b.add(y[i], 6 + i, [1], True)
    for i in reversed(range(6)):
        b.add(pre[i], i, [0, 1], False)
    ctx.decode(b)
    got = ctx.get_logits()  # rows in batch order: x2, y2, x1, y1, x0, y0
    ref_x, ref_y = tiny.logits(pre + x, GGMLType.F32)[6:], tiny.logits(pre + y, GGMLType.F32)[6:]
    assert _rel(got[0::2][::-1], ref_x) < TOL
    assert _rel(got[1::2][::-1], ref_y) < TOL
