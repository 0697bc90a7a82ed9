"""Speculative decoding with an EAGLE-3 head (``Llama(draft_model="head.gguf")``, ``llamapy serve -md``):
a one-layer draft that reads the target's own hidden states.

The head file (``general.architecture = "eagle3"``, as llama.cpp's converter writes it from an HF
``LlamaForCausalLMEagle3`` checkpoint such as yuhuili/EAGLE3-LLaMA3.1-Instruct-8B):

- metadata: the usual ``eagle3.*`` decoder keys (``block_count`` = 1, ``embedding_length``,
  ``feed_forward_length``, ``attention.head_count[_kv]``, ``attention.layer_norm_rms_epsilon``,
  ``rope.freq_base``, ``context_length``), ``eagle3.extract_layers`` (3 target layer indices: low, mid,
  high; HF's default ``[2, N // 2, N - 3]``), ``eagle3.target_hidden_size`` (the target's ``n_embd``;
  default the head's) and optionally ``eagle3.norm_before_residual`` (RedHat speculators: the residual
  is the normed ``g``);
- tensors: ``fc.weight`` [n_embd, 3 n_embd_target], ``blk.0.attn_norm.weight`` (on the token
  embedding), ``blk.0.hidden_norm.weight`` (on ``g``; llama.cpp's newer name ``blk.0.attn_norm_2.weight``
  is read too), ``blk.0.attn_{q,k,v}.weight`` over ``2 n_embd`` inputs, ``blk.0.attn_output.weight``,
  ``blk.0.ffn_{norm,gate,up,down}.weight``, ``output_norm.weight``, optionally ``output.weight``
  [n_draft_vocab, n_embd] (else the target's head), ``d2t`` (I64/I32 [n_draft_vocab]: the target id of
  each draft id, absolute as llama.cpp's graph uses it -- HF stores offsets, its converter adds the
  index), ``token_embd.weight`` (else the target's) and ``rope_freqs.weight``.

The feature of target position ``p`` is the input of each extract layer ``k`` (the output of layer
``k - 1``, ``l_out-{k-1}``; the token embedding ``inp_embd`` for ``k = 0``), concatenated low/mid/high
and projected: ``g_p = fc([f_low | f_mid | f_high])``. A :class:`FeatureTap` installed as the target
context's ``cb_eval`` reads those nodes of every ubatch and keeps ``g`` per (sequence, position); the
target's graph is otherwise unchanged. The draft at position ``p`` reads ``[embed(t_p) | g_{p-1}]``
(as the MTP draft, :mod:`.mtp`)::

    x = [attn_norm(embed(t)) | hidden_norm(g)];  r = g (or hidden_norm(g))
    h = r + attn(x);  h = h + ffn(ffn_norm(h))          (h: the "prenorm" state)
    logits_draft = output(output_norm(h));  token = d2t[argmax]

as llama.cpp's ``src/models/eagle3.cpp``; the next draft step feeds its own ``h`` in place of ``g``.
:class:`Eagle3Draft` catches its one-layer cache up on the target's confirmed tokens, drafts up to
``n_draft`` tokens greedily (stopping below ``p_min``), and :func:`~.loop.generate` (or the server's
shared batch) verifies them: output identical to decoding without a draft.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import numpy as np

from ..ggml import ops
from ..ggml.quants import dequantize
from .draft_model import DraftModelError
from .hidden_draft import Features, HiddenDraftModel, HiddenStateDraft

EAGLE3_ARCH = "eagle3"


class Eagle3Error(DraftModelError):
    """An EAGLE-3 head that cannot draft for this target (hidden size, layers, vocabulary, bad file)."""


def is_eagle3_file(path: str | os.PathLike) -> bool:
    """Whether the GGUF at ``path`` is an EAGLE-3 head (reads the header only)."""
    from ..gguf.reader import GGUFReader

    p = os.fspath(path)
    if not os.path.isfile(p):
        return False
    try:
        return GGUFReader(p).metadata.get("general.architecture") == EAGLE3_ARCH
    except Exception:  # not a GGUF: the normal load reports it
        return False


def _dense(info: Any) -> np.ndarray:
    """A tensor of the file as float32 (dequantized)."""
    a = info.array()
    return np.asarray(dequantize(a, info.ggml_type), dtype=np.float32).reshape(tuple(info.shape))


def build_eagle3(arch: Any, g: Any) -> Any:
    """The head's graph: input rows ``[embed(t) | g]`` (F32[T, 2 n_embd]) -> draft logits, prenorm h."""
    from ..model.blocks import Outputs

    hp, blk, w = arch.hp, arch.blocks[0], arch.w
    n, T = hp.n_embd, g.inp.n_tokens
    x = g.inp.embd
    e = ops.cont(ops.view(x, (T, n), x.strides, 0))
    h = ops.cont(ops.view(x, (T, n), x.strides, 4 * n))
    e = g.build_norm(e, blk["attn_norm.weight"], name="embd_norm", il=0)
    hn = g.build_norm(h, blk["hidden_norm.weight"], name="g_norm", il=0)
    res = hn if arch.norm_before_residual else h
    a = g.attention(ops.concat(e, hn, 1), blk, 0)
    a, res = g.select_outputs(0, a, res)
    x = g.cb(ops.add(a, res), "ffn_inp", 0)
    f = g.build_ffn(g.build_norm(x, blk["ffn_norm.weight"], name="ffn_norm", il=0), blk, 0)
    x = g.cb(ops.add(x, f), "eagle3_prenorm", 0)
    out = g.build_norm(x, w["output_norm.weight"], name="result_norm")
    return Outputs(g.cb(g.mm(arch.head_output, out), "result_output"), embd=x)


class Eagle3Head(HiddenDraftModel):
    """A loaded EAGLE-3 head for ``target`` (a loaded ``llamapy.model.Model``): what
    :class:`~llamapy.context.Context` needs (``impl``, ``hparams``, ``vocab``...) plus ``fc``, ``d2t``,
    the token embedding rows and the extract layers. Raises :class:`Eagle3Error` when it does not fit."""

    def __init__(self, path: str | os.PathLike, target: Any) -> None:
        from ..errors import LlamapyError
        from ..model.arch.llama import Llama
        from ..model.blocks import TensorLoader, Weights
        from ..model.loader import ModelLoader

        p = os.fspath(path)
        try:
            loader = ModelLoader(p)
        except LlamapyError as e:
            raise Eagle3Error(f"{p}: cannot read the EAGLE-3 head: {e}") from None
        if loader.arch != EAGLE3_ARCH:
            raise Eagle3Error(f"{p}: not an EAGLE-3 head (general.architecture = {loader.arch!r})")
        thp = target.hparams
        md = loader.meta()
        try:
            hp = Llama.load_hparams(md, int(thp.n_vocab))
        except LlamapyError as e:
            raise Eagle3Error(str(e)) from None
        if hp.n_layer != 1:
            raise Eagle3Error(f"{p}: an EAGLE-3 head has one decoder layer, this file has {hp.n_layer}")
        n, n_tgt = int(hp.n_embd), int(md.u32("target_hidden_size", hp.n_embd) or 0)
        if n_tgt != int(thp.n_embd):
            raise Eagle3Error(
                f"{p}: the EAGLE-3 head reads hidden states of size {n_tgt} (eagle3.target_hidden_size), "
                f"the target model's are {thp.n_embd}: this head was trained for another model"
            )
        layers = md.raw("target_layers")  # (llama.cpp's converter; earlier files: extract_layers)
        layers = md.raw("extract_layers") if layers is None else layers
        layers = [int(v) for v in np.asarray(layers).reshape(-1)] if layers is not None else []
        if len(layers) != 3:
            raise Eagle3Error(
                f"{p}: eagle3.target_layers (extract_layers) must hold 3 target layers, got {layers}"
            )
        if any(not 0 <= k < int(thp.n_layer) for k in layers):
            raise Eagle3Error(
                f"{p}: eagle3.target_layers (extract_layers) {layers} are not all layers of the target "
                f"({thp.n_layer} layers)"
            )
        self.extract_layers = layers
        self.norm_before_residual = bool(md.boolean("norm_before_residual", False))
        idx = loader.tensor_index

        def need(name: str, shape: tuple[int, ...] | None) -> Any:
            info = idx.get(name)
            if info is None:
                raise Eagle3Error(f"{p}: the EAGLE-3 head has no tensor {name!r}")
            if shape is not None and tuple(info.shape) != shape:
                raise Eagle3Error(
                    f"{p}: tensor {name!r} has shape {tuple(info.shape)}, expected {shape} (the target's "
                    f"hidden size is {n_tgt}, the head's {n})"
                )
            return info

        self.fc = _dense(need("fc.weight", (n, 3 * n_tgt))).T.copy()  # [3 n_tgt, n]: g = f @ fc
        tl = TensorLoader(loader)
        try:
            for name in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate",
                         "ffn_up", "ffn_down"):  # fmt: skip
                tl(f"blk.0.{name}.weight", None)
            hname = (
                "blk.0.hidden_norm.weight"
                if "blk.0.hidden_norm.weight" in idx
                else "blk.0.attn_norm_2.weight"
            )
            tl(hname, (n,))
            tl("output_norm.weight", (n,))
            tl("rope_freqs.weight", None, required=False)
            out_w = tl("output.weight", None, required=False)
        except LlamapyError as e:
            raise Eagle3Error(str(e)) from None
        tensors = dict(tl.tensors)
        tensors["blk.0.hidden_norm.weight"] = tensors.pop(hname)
        if int(tensors["blk.0.attn_q.weight"].shape[-1]) != 2 * n:
            raise Eagle3Error(f"{p}: blk.0.attn_q.weight must read 2 x {n} inputs ([embedding | g])")
        if out_w is None:  # the target's head: the draft vocabulary is the target's
            tout = target.impl.output_weight()
            if int(tout.shape[-1]) != n:
                raise Eagle3Error(f"{p}: the head has no output.weight and the target's is not {n} wide")
            out_w = tout
        elif int(out_w.shape[-1]) != n:
            raise Eagle3Error(f"{p}: output.weight has shape {out_w.shape}, expected (n_draft_vocab, {n})")
        n_draft = int(out_w.shape[0])
        n_vocab = int(thp.n_vocab)
        d2t_info = idx.get("d2t")
        if d2t_info is not None:
            d2t = np.asarray(d2t_info.array()).reshape(-1).astype(np.int64)
            if d2t.shape[0] != n_draft or (d2t.size and (d2t.min() < 0 or d2t.max() >= n_vocab)):
                raise Eagle3Error(
                    f"{p}: d2t must map each of the {n_draft} draft tokens to a target token id "
                    f"(0..{n_vocab - 1})"
                )
        elif n_draft == n_vocab:
            d2t = np.arange(n_vocab, dtype=np.int64)
        else:
            raise Eagle3Error(
                f"{p}: a draft vocabulary of {n_draft} tokens (target {n_vocab}) needs a d2t map"
            )
        self.d2t = d2t
        emb = idx.get("token_embd.weight")
        if emb is None:
            emb = target.loader.tensor_index["token_embd.weight"]
        if int(emb.shape[-1]) != n:
            raise Eagle3Error(
                f"{p}: the token embeddings are {emb.shape[-1]} wide, the head's hidden size is {n} (a head "
                "without its own token_embd must have the target's hidden size)"
            )
        self._set_embeddings(emb)
        hp = copy.deepcopy(hp)
        hp.n_vocab = n_draft
        hp.n_deepstack_layers = 1  # an embeddings input of 2 n_embd: [embed(t) | g]
        hp.swa_layers, hp.recurrent_layers, hp.n_swa = [False], [False], 0
        impl = Llama(hp)
        impl.w = Weights(tensors)
        impl.blocks = [Weights(tensors, "blk.0.")]
        impl.head_output = out_w  # type: ignore[attr-defined]
        impl.norm_before_residual = self.norm_before_residual  # type: ignore[attr-defined]
        impl.build = lambda g: build_eagle3(impl, g)  # type: ignore[method-assign]
        self.target = target
        self.path = p
        self.loader = loader
        self.hparams = hp
        self.vocab = target.vocab
        self.impl = impl
        self.arch = EAGLE3_ARCH
        self.metadata = loader.metadata


class FeatureTap:
    """The target context's ``cb_eval``: reads the extract layers' inputs of every ubatch, keeps
    ``g = fc(features)`` by sequence and position (with the token, to check it is still the one there).
    Chains to a ``cb_eval`` the context already had. ``max_keep`` positions are kept per sequence."""

    def __init__(self, ctx: Any, head: Eagle3Head, max_keep: int = 1 << 16) -> None:
        self.ctx = ctx
        self.head = head
        self.prev = ctx.cb_eval
        self.ask_unnamed = bool(getattr(self.prev, "ask_unnamed", False))
        self.slots: dict[str, list[int]] = {}
        for i, k in enumerate(head.extract_layers):
            self.slots.setdefault("inp_embd" if k == 0 else f"l_out-{k - 1}", []).append(i)
        self.parts: dict[int, np.ndarray] = {}
        self._ub: Any = None  # the ubatch the parts are of
        self.store: dict[int, dict[int, tuple[int, np.ndarray]]] = {}
        self.max_keep = int(max_keep)
        self.n_tgt = head.fc.shape[0] // 3
        ctx.cb_eval = self
        ctx._graphs.clear()  # graphs built without the watched nodes

    @classmethod
    def install(cls, ctx: Any, head: Eagle3Head) -> FeatureTap:
        tap = ctx.cb_eval
        if isinstance(tap, FeatureTap) and tap.head is head:
            return tap
        return cls(ctx, head, max_keep=max(int(ctx.n_ctx), 1))

    def __call__(self, t: Any, ask: bool, value: np.ndarray | None) -> bool:
        mine = t.name in self.slots
        if ask:
            return mine or bool(self.prev is not None and self.prev(t, True, None))
        if not mine:
            return True if self.prev is None else bool(self.prev(t, False, value))
        ub = getattr(self.ctx, "ubatch", None)
        v = None if value is None else np.asarray(value, dtype=np.float32)
        if ub is None or v is None or v.ndim != 2 or v.shape != (ub.n_tokens, self.n_tgt):
            self.parts.clear()  # (rows selected for outputs, or another width: not a feature)
            return True
        if ub is not self._ub:  # parts of another ubatch (one whose graph lacked a node): not mixed in
            self.parts.clear()
            self._ub = ub
        for i in self.slots[t.name]:
            self.parts[i] = v
        if len(self.parts) == 3:
            g = np.concatenate([self.parts[0], self.parts[1], self.parts[2]], axis=1) @ self.head.fc
            self.parts.clear()
            toks = ub.token if ub.token is not None else np.full(ub.n_tokens, -1)
            for r in range(ub.n_tokens):
                d = self.store.setdefault(int(ub.seq_first[r]), {})
                d[int(ub.pos[r])] = (int(toks[r]), g[r])
            for d in self.store.values():
                if len(d) > self.max_keep:
                    top = max(d)
                    for q in [q for q in d if q <= top - self.max_keep]:
                        del d[q]
        return True

    def seq(self, seq_id: int) -> dict[int, tuple[int, np.ndarray]]:
        return self.store.setdefault(int(seq_id), {})


class Eagle3Draft(HiddenStateDraft):
    """Draft with an EAGLE-3 head (see the module docstring). ``head`` is a path or an
    :class:`Eagle3Head` (server slots share one); ``model`` the loaded target. :meth:`bind` attaches it
    to the target's :class:`~.sequence.TokenSequence` (``generate`` does), :meth:`attach` to a context
    and sequence id (the server). Defaults as the draft model's (``-md``): up to 16 tokens a round,
    stopping before a guess under ``p_min`` 0.75 among the head's top 10."""

    spec_type = "eagle3"
    error = Eagle3Error

    def __init__(
        self,
        head: str | os.PathLike | Eagle3Head,
        model: Any = None,
        n_draft: int = 16,
        n_min: int = 0,
        p_min: float = 0.75,
        n_ctx: int = 4096,
        n_batch: int = 512,
        n_threads: int | None = None,
    ) -> None:
        self.check_params(n_draft, n_min, p_min)
        if not isinstance(head, Eagle3Head):
            if model is None:
                raise Eagle3Error(
                    "an EAGLE-3 head drafts from a target model's hidden states: give the model"
                )
            head = Eagle3Head(head, model)
        self._setup(head, n_draft, n_min, p_min, n_ctx, n_batch, n_threads)
        self.head = head
        self.tap: FeatureTap | None = None
        self.seq_id = 0
        self.n_accepted = 0

    @property
    def vocab(self) -> Any:
        return self.head.vocab

    def attach(self, target_ctx: Any, seq_id: int = 0, n_ctx: int | None = None) -> None:
        """Read the hidden states of sequence ``seq_id`` of ``target_ctx``."""
        self.tap = FeatureTap.install(target_ctx, self.head)
        self.seq_id = int(seq_id)
        self._context(int(n_ctx or target_ctx.n_ctx))

    def bind(self, seq: Any) -> None:
        """Attach to the target's :class:`TokenSequence` (``generate`` calls this)."""
        self.attach(seq.ctx, seq.seq_id, int(seq.n_ctx))

    def _features(self) -> Features | None:
        return None if self.tap is None else self.tap.seq(self.seq_id)  # (not attached: no features)

    def _to_target(self, best: int) -> int:
        return int(self.head.d2t[best])


__all__ = ["EAGLE3_ARCH", "Eagle3Draft", "Eagle3Error", "Eagle3Head", "FeatureTap", "build_eagle3",
           "is_eagle3_file"]  # fmt: skip
