"""MTP speculative decoding (``--spec-type mtp``): the target's own next-token-prediction layer drafts,
the target verifies. Tiny random-weight glm4moe / deepseek2 files with one nextn layer (written by
llamapy's GGUF writer from a transformers model, tests/model/families); transformers has no MTP module
for these, so the checks are the invariants: greedy output identical with and without the drafts, a
seeded sampled run identical too, and a file built so that the MTP layer must predict what the model
will say (its drafts then accepted), which a wrong MTP graph (input halves swapped, a wrong position,
the wrong hidden state) fails."""

from __future__ import annotations

import copy
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from llamapy.context import Context, ContextParams  # noqa: E402
from llamapy.generation import GenerationParams, TokenSequence, generate  # noqa: E402
from llamapy.generation.mtp import MtpDraft, MtpError  # noqa: E402
from llamapy.generation.speculative import make_spec_draft  # noqa: E402
from llamapy.ggml.types import GGMLType  # noqa: E402
from llamapy.model import Model  # noqa: E402
from tests.model import hf_tiny  # noqa: E402

hf_tiny._load_family_modules()
FAMILIES = hf_tiny.FAMILIES


class Vocab:
    n_tokens = hf_tiny.N_VOCAB

    def is_eog(self, t: int) -> bool:
        return False

    def token_to_piece(self, t: int, special: bool = False) -> bytes:
        return b"x"


OUT_PROJ = ("attn_output.weight", "ssm_out.weight", "ffn_down.weight", "ffn_down_exps.weight",
            "ffn_down_shexp.weight")  # fmt: skip


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("mtp")
    out: dict[str, Path] = {}
    try:
        for name in ("glm4moe", "deepseek2", "qwen35", "qwen3next", "mimo2"):
            tm = hf_tiny.make_tiny(FAMILIES[name], root, seed=zlib.crc32(name.encode()) % 10_000)
            tm.write(GGMLType.F32)
            out[name] = _with_mtp(tm, root, None)
            out[name + "-copy"] = _with_mtp(tm, root, 0.0)
            out[name + "-mostly"] = _with_mtp(tm, root, 0.35)
        out["llama"] = hf_tiny.make_tiny(FAMILIES["llama"], root, seed=3).write(GGMLType.F32)
    finally:
        torch.set_num_threads(n)
    return out


def _with_mtp(tm: Any, root: Path, scale: float | None) -> Path:
    """The family's file with one MTP layer ``blk.{n_layer}`` (the families' converters add a random one
    to glm4moe/deepseek2: a copy of the last layer; qwen35 / qwen3next get the same here: their last layer
    is a full-attention one, as their MTP block).

    With ``scale`` every attention / linear-attention / FFN output projection is multiplied by it and
    the MTP's eh_proj keeps only the token's half: at 0 the model's next token is a function f of the
    current one (head(norm(embed(t)))) and the MTP layer predicts f(t_{p+1}), exactly what the model
    will say after t_{p+1}; a little above 0 the context sometimes changes the model's choice, so some
    drafts are rejected (a recurrent state must then be rolled back)."""
    md, tensors = _mtp_tensors(tm, scale)
    tag = "random" if scale is None else f"s{scale}"
    return hf_tiny.write_gguf(
        root / f"{tm.family.name}-mtp-{tag}.gguf", tm.family.arch, md, tensors, GGMLType.F32
    )


def _mtp_tensors(tm: Any, scale: float | None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    fam, cfg = tm.family, tm.hf.config
    tensors = dict(tm.tensors[GGMLType.F32])
    n_layer, n = cfg.num_hidden_layers, cfg.hidden_size
    md = hf_tiny.metadata(fam, cfg, GGMLType.F32)
    if fam.arch == "mimo2":
        _mimo2_mtp_block(tensors, md, n_layer)
    elif f"blk.{n_layer}.nextn.eh_proj.weight" not in tensors:
        last = f"blk.{n_layer - 1}."
        for k in [k for k in tensors if k.startswith(last)]:
            tensors[f"blk.{n_layer}." + k[len(last) :]] = tensors[k].copy()
    if f"blk.{n_layer}.nextn.eh_proj.weight" not in tensors:
        rng = np.random.default_rng(0)
        tensors[f"blk.{n_layer}.nextn.eh_proj.weight"] = (rng.standard_normal((n, 2 * n)) * 0.2).astype(
            np.float32
        )
        tensors[f"blk.{n_layer}.nextn.enorm.weight"] = np.ones(n, np.float32)
        tensors[f"blk.{n_layer}.nextn.hnorm.weight"] = np.ones(n, np.float32)
        md[f"{fam.arch}.block_count"] = n_layer + 1
        md[f"{fam.arch}.nextn_predict_layers"] = 1
    if scale is not None:
        for k in tensors:
            if k.endswith(OUT_PROJ):
                tensors[k] = tensors[k] * np.float32(scale)
        eye = np.eye(n, dtype=np.float32)
        tensors[f"blk.{n_layer}.nextn.eh_proj.weight"] = np.concatenate(
            [eye, np.zeros((n, n), np.float32)], 1
        )
    return md, tensors


def _mimo2_mtp_block(tensors: dict[str, np.ndarray], md: dict[str, Any], n_layer: int) -> None:
    """MiMo's MTP block as llama.cpp's mimo2 graph_mtp takes it: a window layer (the window's KV heads,
    sinks, its rope base) with fused ``attn_qkv`` and a dense FFN: the attention of window layer 1 and
    the FFN of the dense layer 0."""
    src, dst = "blk.1.", f"blk.{n_layer}."
    qkv = [tensors[src + f"attn_{x}.weight"] for x in "qkv"]
    tensors[dst + "attn_qkv.weight"] = np.concatenate(qkv, 0)
    for k in ("attn_norm.weight", "attn_output.weight", "attn_sinks.weight", "ffn_norm.weight"):
        tensors[dst + k] = tensors[src + k].copy()
    for k in ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"):
        tensors[dst + k] = tensors["blk.0." + k].copy()
    a = "mimo2"
    md[f"{a}.attention.head_count_kv"] = [
        *md[f"{a}.attention.head_count_kv"],
        md[f"{a}.attention.head_count_kv"][1],
    ]
    md[f"{a}.attention.sliding_window_pattern"] = [*md[f"{a}.attention.sliding_window_pattern"], 1]


PROMPT = [int(t) for t in np.random.default_rng(5).integers(0, hf_tiny.N_VOCAB, 24)]


def _run(model: Model, draft: Any, sample: Any = None, n: int = 32) -> list[int]:
    ctx = Context(model, ContextParams(n_ctx=256, n_batch=64))
    seq = TokenSequence(ctx)
    sample = sample or (lambda z: int(np.argmax(z)))
    steps = generate(seq, sample, Vocab(), PROMPT, GenerationParams(max_tokens=n), draft_model=draft)
    return [s.token for s in steps if s.token is not None]


@pytest.mark.parametrize("name", ["glm4moe", "qwen3next", "mimo2"])  # (deepseek2, qwen35: with -copy files)
def test_greedy_identical_with_mtp_drafts(files: dict[str, Path], name: str) -> None:
    model = Model.load(files[name])
    assert model.hparams.n_layer_nextn == 1
    plain = _run(model, None)
    draft = make_spec_draft("mtp", model, n_ctx=256)
    assert isinstance(draft, MtpDraft)
    assert _run(model, draft) == plain
    assert draft.n_drafted > 0 and draft.n_calls > 0


@pytest.mark.parametrize("name", ["glm4moe", "deepseek2", "qwen35", "qwen3next", "mimo2"])
def test_mtp_drafts_are_accepted_when_the_layer_predicts_the_model(files: dict[str, Path], name: str) -> None:
    model = Model.load(files[name + "-copy"])
    plain = _run(model, None)
    draft = MtpDraft(model, n_draft=3, n_ctx=256)
    assert _run(model, draft) == plain
    # every draft is right (up to the end of max_tokens): most of the tokens come from drafts
    assert draft.n_accepted >= 0.9 * draft.n_drafted - 3 and draft.n_accepted >= 16


@pytest.mark.parametrize("name", ["glm4moe", "qwen35", "qwen3next", "mimo2"])
def test_partly_rejected_mtp_drafts_roll_back(files: dict[str, Path], name: str) -> None:
    """Some drafts kept, some rejected: the KV cache (and the hybrids' recurrent state, through a
    checkpoint) goes back to the last kept token and the output stays the plain one."""
    model = Model.load(files[name + "-mostly"])
    plain = _run(model, None, n=40)
    draft = MtpDraft(model, n_draft=3, n_ctx=256)
    assert _run(model, draft, n=40) == plain
    assert 0 < draft.n_accepted < draft.n_drafted


def _with_llamacpp_nextn_names(tm: Any, root: Path, roll_head: int) -> Path:
    """The qwen3next ``-copy`` file with every NextN tensor of llama.cpp's list for the arch (gguf-py's
    names; llama.cpp's list for qwen3next has all six, gguf 0.19's not yet): ``embed_tokens`` (a copy of token_embd), ``shared_head_norm`` and ``shared_head_head`` (the
    output head with its rows rolled by ``roll_head``: the MTP layer then predicts f(t) + roll_head)."""
    gguf = pytest.importorskip("gguf")
    fam, n_layer = tm.family, tm.hf.config.num_hidden_layers
    md, tensors = _mtp_tensors(tm, 0.0)
    assert md[gguf.Keys.LLM.NEXTN_PREDICT_LAYERS.format(arch=fam.arch)] == 1
    head = tensors.get("output.weight", tensors["token_embd.weight"])
    T = gguf.MODEL_TENSOR
    nm = {t: gguf.TENSOR_NAMES[t].format(bid=n_layer) + ".weight" for t in T if t.name.startswith("NEXTN_")}
    tensors[nm[T.NEXTN_EMBED_TOKENS]] = tensors["token_embd.weight"].copy()
    tensors[nm[T.NEXTN_SHARED_HEAD_NORM]] = tensors["output_norm.weight"].copy()
    tensors[nm[T.NEXTN_SHARED_HEAD_HEAD]] = np.roll(head, roll_head, axis=0)
    return hf_tiny.write_gguf(
        root / f"qwen3next-mtp-names{roll_head}.gguf", fam.arch, md, tensors, GGMLType.F32
    )


def test_mtp_reads_llamacpp_nextn_tensor_names(tmp_path: Path) -> None:
    """A qwen3next file with all six of llama.cpp's ``blk.N.nextn.*`` tensors: the trunk loads (skipping
    them), the MTP layer takes its own embeddings, head norm and head (rolled head: drafts rejected)."""
    tm = hf_tiny.make_tiny(FAMILIES["qwen3next"], tmp_path, seed=zlib.crc32(b"qwen3next") % 10_000)
    tm.write(GGMLType.F32)
    runs = {}
    for roll in (0, 1):
        model = Model.load(_with_llamacpp_nextn_names(tm, tmp_path, roll))
        assert model.hparams.n_layer == 4 and model.hparams.n_layer_nextn == 1
        draft = MtpDraft(model, n_draft=3, n_ctx=256)
        blk = draft.mtp.impl.blocks[0]
        assert all(
            f"nextn.{k}.weight" in blk for k in ("shared_head_head", "shared_head_norm", "embed_tokens")
        )
        runs[roll] = (_run(model, draft), _run(model, None), draft)
    assert runs[0][0] == runs[0][1] == runs[1][0] == runs[1][1]
    assert runs[0][2].n_accepted >= 16 and getattr(runs[1][2], "n_accepted", 0) <= 2


def test_sampled_identical_with_mtp_drafts(files: dict[str, Path]) -> None:
    """A seeded sampler draws the same tokens: each is drawn from the logits of exactly the tokens before."""
    model = Model.load(files["glm4moe-copy"])

    def sampler() -> Any:
        rng = np.random.default_rng(11)

        def sample(z: np.ndarray) -> int:
            p = np.exp((z - z.max()) / 0.8)
            return int(rng.choice(len(p), p=p / p.sum()))

        return sample

    draft = MtpDraft(model, n_draft=2, n_ctx=256)
    assert _run(model, draft, sampler()) == _run(model, None, sampler())
    assert draft.n_drafted > 0


def test_mtp_reuses_its_cache_across_calls(files: dict[str, Path]) -> None:
    """A second generation over the same context (prompt-cache reuse) still drafts and stays exact."""
    model = Model.load(files["glm4moe-copy"])
    ctx = Context(model, ContextParams(n_ctx=256, n_batch=64))
    seq = TokenSequence(ctx)
    draft = MtpDraft(model, n_ctx=256)
    greedy = lambda z: int(np.argmax(z))  # noqa: E731
    first = [
        s.token
        for s in generate(seq, greedy, Vocab(), PROMPT, GenerationParams(max_tokens=8), draft_model=draft)
    ]
    n_acc = draft.n_accepted
    second_prompt = PROMPT + [t for t in first if t is not None] + [7, 8]
    second = [
        s.token
        for s in generate(
            seq, greedy, Vocab(), second_prompt, GenerationParams(max_tokens=16), draft_model=draft
        )
    ]
    assert seq.n_reused > len(PROMPT)
    assert second == [s.token for s in generate(TokenSequence(Context(model, ContextParams(n_ctx=256))), greedy,
                                                Vocab(), second_prompt, GenerationParams(max_tokens=16))]  # fmt: skip
    assert draft.n_accepted > n_acc


def test_mtp_on_a_model_without_mtp_layers_is_a_typed_error(files: dict[str, Path]) -> None:
    with pytest.raises(MtpError, match="MTP"):
        make_spec_draft("mtp", Model.load(files["llama"]))
    with pytest.raises(MtpError):
        MtpDraft(Model.load(files["glm4moe"]), n_draft=0)
    with pytest.raises(ValueError, match="unknown speculative"):
        make_spec_draft("eagle9", None)


class EngineLikeBackend:
    """What :class:`SlotDrafts` reads of a server backend (model, ctx, n_ctx, n_seq_max, decode), and a
    loop that drives two slots in shared batches as the server engine does: the prompts (an output on
    each one's last token), then per step each slot's sampled token and its guesses, every row an
    output, greedy verification, rejected cells removed."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.ctx = Context(model, ContextParams(n_ctx=512, n_seq_max=2, n_batch=128))
        self.n_ctx, self.n_seq_max = 512, 2
        self.accepted = [0, 0]

    def decode(self, tokens: list, pos: list, seq_ids: list, outputs: list) -> np.ndarray:
        from llamapy.batch import Batch

        self.ctx.decode(
            Batch(token=list(tokens), pos=list(pos), seq_id=[[s] for s in seq_ids], logits=list(outputs))
        )
        return np.asarray(self.ctx.get_logits())

    def run(self, prompts: list[list[int]], drafts: list[Any], n: int) -> list[list[int]]:
        toks, pos, seqs, outs = [], [], [], []
        for s, p in enumerate(prompts):
            toks += p
            pos += list(range(len(p)))
            seqs += [s] * len(p)
            outs += [False] * (len(p) - 1) + [True]
        logits = self.decode(toks, pos, seqs, outs)
        cache = [list(p) for p in prompts]
        nxt = [int(np.argmax(logits[s])) for s in range(len(prompts))]
        gen = [[t] for t in nxt]
        while min(len(g) for g in gen) < n:
            toks, pos, seqs, spans = [], [], [], []
            for s in range(len(prompts)):
                guess = [int(t) for t in drafts[s]([*cache[s], nxt[s]])] if drafts[s] else []
                row = [nxt[s], *guess]
                spans.append((len(toks), guess))
                toks += row
                pos += list(range(len(cache[s]), len(cache[s]) + len(row)))
                seqs += [s] * len(row)
                cache[s] += row
            logits = self.decode(toks, pos, seqs, [True] * len(toks))
            for s, (first, guess) in enumerate(spans):
                j = 0
                while True:
                    t = int(np.argmax(logits[first + j]))
                    gen[s].append(t)
                    if j == len(guess) or t != guess[j]:
                        break
                    j += 1
                self.accepted[s] += j
                keep = len(cache[s]) - len(guess) + j
                del cache[s][keep:]
                self.ctx.memory.seq_rm(s, keep, -1)
                nxt[s] = t
        return [g[:n] for g in gen]


def test_server_slots_draft_with_mtp(files: dict[str, Path]) -> None:
    """--spec-type mtp in the server: the hidden state of each output row reaches its slot's draft."""
    from llamapy.generation.spec_server import SlotDrafts, server_spec

    model = Model.load(files["glm4moe-mostly"])
    prompts = [PROMPT, PROMPT[::-1][:17]]
    plain = EngineLikeBackend(model).run(prompts, [None, None], 24)
    b = EngineLikeBackend(model)
    sd = SlotDrafts(b, server_spec("mtp", n_draft=2))
    drafts = [sd.make(), sd.make()]
    assert b.run(prompts, drafts, 24) == plain
    assert all(n > 0 for n in b.accepted) and all(d.n_drafted > 0 for d in drafts)
    with pytest.raises(MtpError):
        SlotDrafts(EngineLikeBackend(Model.load(files["llama"])), server_spec("mtp"))


def test_mtp_through_a_context_shift(files: dict[str, Path]) -> None:
    """A full context shifts (positions move down): the MTP draft starts over and stays exact."""
    model = Model.load(files["glm4moe-copy"])

    def run(draft: Any) -> list[int]:
        seq = TokenSequence(
            Context(model, ContextParams(n_ctx=256, n_batch=64)), context_shift=True, n_keep=4
        )
        steps = generate(seq, lambda z: int(np.argmax(z)), Vocab(), PROMPT, GenerationParams(max_tokens=300),
                         draft_model=draft)  # fmt: skip
        out = [s.token for s in steps if s.token is not None]
        assert seq.n_shifted > 0
        return out

    draft = MtpDraft(model, n_ctx=256)
    assert run(draft) == run(None)
    assert draft.n_accepted > 100


def test_mimo2_mtp_block_matches_a_torch_reference(tmp_path: Path) -> None:
    """MiMo's MTP block (a window layer: sinks, the window's KV heads and rope base, fused qkv, V scale,
    dense FFN; fed the target's state *before* its output norm, as llama.cpp's mimo2 graph_mtp) against
    transformers' own MiMo decoder layer with the same weights, over 16 positions (window 5): every
    row's logits. (llamapy's target reports its normed state; the block undoes the norm weight.)"""
    from llamapy.batch import Batch
    from llamapy.generation.mtp import MtpModel

    pytest.importorskip("transformers")
    from transformers.models.mimo_v2_flash import modeling_mimo_v2_flash as hf_mimo

    fam = FAMILIES["mimo2"]
    tm = hf_tiny.make_tiny(fam, tmp_path, seed=zlib.crc32(b"mimo2") % 10_000)
    tm.write(GGMLType.F32)
    md, tensors = _mtp_tensors(tm, None)
    n_layer = tm.hf.config.num_hidden_layers
    rng = np.random.default_rng(1)
    for k in ("enorm", "hnorm"):
        tensors[f"blk.{n_layer}.nextn.{k}.weight"] = (1 + 0.3 * rng.standard_normal(64)).astype(np.float32)
    path = hf_tiny.write_gguf(tmp_path / "mimo2-mtp-ref.gguf", "mimo2", md, tensors, GGMLType.F32)
    model = Model.load(path)
    toks = PROMPT[:17]
    ctx = Context(model, ContextParams(n_ctx=64, embeddings=True, pooling_type=0, type_k="f32", type_v="f32"))
    ctx.decode(Batch.from_tokens(toks, logits_all=True))
    h_normed = np.array(ctx.get_embeddings()[: len(toks)], dtype=np.float32)
    mtp = MtpModel(model)
    mctx = Context(mtp, ContextParams(n_ctx=64, embeddings=True, pooling_type=0, type_k="f32", type_v="f32"))
    rows = np.concatenate([mtp.embed(toks[1:]), h_normed[:-1]], axis=1)  # (t_{p+1}, h_p) at position p
    mctx.decode(Batch.from_embd(rows, pos0=0, logits_all=True))
    got = np.array(mctx.get_logits()[: len(rows)], dtype=np.float32)

    # the reference: HF's window layer (dense), its rotary, the pre-norm state of HF's own trunk
    cfg = copy.deepcopy(tm.hf.config)
    cfg.mlp_layer_types = ["dense"] * n_layer
    layer = hf_mimo.MiMoV2FlashDecoderLayer(cfg, 1).eval()
    T = {
        k[len(f"blk.{n_layer}.") :]: torch.from_numpy(v)
        for k, v in tensors.items()
        if k.startswith(f"blk.{n_layer}.")
    }
    nq, nk = cfg.num_attention_heads * cfg.head_dim, 2 * cfg.num_key_value_heads * cfg.head_dim
    qkv = T["attn_qkv.weight"]
    sd = {"self_attn.q_proj.weight": qkv[:nq], "self_attn.k_proj.weight": qkv[nq : nq + nk],
          "self_attn.v_proj.weight": qkv[nq + nk :], "self_attn.o_proj.weight": T["attn_output.weight"],
          "self_attn.sinks": T["attn_sinks.weight"], "input_layernorm.weight": T["attn_norm.weight"],
          "post_attention_layernorm.weight": T["ffn_norm.weight"], "mlp.gate_proj.weight": T["ffn_gate.weight"],
          "mlp.up_proj.weight": T["ffn_up.weight"], "mlp.down_proj.weight": T["ffn_down.weight"]}  # fmt: skip
    layer.load_state_dict(sd)
    pre: list[torch.Tensor] = []
    hook = tm.hf.model.norm.register_forward_hook(lambda m, i, o: pre.append(i[0]))
    with torch.no_grad():
        tm.hf(torch.tensor([toks]))
        hook.remove()

        def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * w

        e = tm.hf.model.embed_tokens(torch.tensor([toks[1:]]))
        h = pre[0][:, :-1]
        x = (
            torch.cat([rms(e, T["nextn.enorm.weight"]), rms(h, T["nextn.hnorm.weight"])], -1)
            @ T["nextn.eh_proj.weight"].T
        )
        n = x.shape[1]
        pos = torch.arange(n)[None]
        cos_sin = hf_mimo.MiMoV2FlashRotaryEmbedding(cfg)(x, pos, "sliding_attention")
        i, j = torch.arange(n)[:, None], torch.arange(n)[None]
        mask = torch.where((j <= i) & (i - j < cfg.sliding_window), 0.0, float("-inf"))[None, None]
        x = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=cos_sin)
        ref = tm.hf.lm_head(tm.hf.model.norm(x))[0].numpy()
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    print(f"mimo2 MTP block vs transformers: rel {err:.2e}")
    assert err < 1e-3
