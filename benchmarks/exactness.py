"""Exactness on the decode path: llamapy and llama.cpp against an exact (float64) computation of the same
weights (issue 16, "Exactness must not be the price").

The exact model: every tensor of the GGUF file dequantized by llamapy's reader/dequantizer
(``llamapy.ggml.quants.dequantize``; bit-identical to gguf-py's for the types of these files), loaded into
transformers' ``LlamaForCausalLM`` / ``Gemma3ForCausalLM`` built from the file's hyper-parameters (q/k rows
un-permuted, Gemma's stored ``1 + w`` norms back to ``w``), run in float64 (rotary angles too). Each run
first checks it against llamapy's NumPy backend (dequantized float32 weights and activations, f32 KV cache)
on one prompt.

For each model, 24 fixed held-out prompts (chat questions, code, prose, numbers), the SAME token ids fed to
all three, greedy (EOG tokens masked, ``ignore_eos``), 32 tokens:

- exact: greedy, checked with llamapy as the draft: one exact forward of the whole sequence verifies every
  step (the same arithmetic as a KV-cached decode, without 32 sequential float64 calls); at the first step
  where exact's token differs, llamapy's cache is cut back (``seq_rm``), fed exact's token, and goes on;
- llamapy: ``Context.decode`` of the prompt in one batch (last row only, as a generation does), then one
  token per decode (the decode path), always on exact's prefix, so every step's logits compare with exact's;
  its own greedy output equals exact's up to the first step where its argmax differs. The prompt path
  (every position's logits of the prompt in one batch) is measured separately;
- llama.cpp: ``llama-server`` (0.3.36 build, f16 KV as llamapy) ``/completion`` with the prompt as token
  ids, ``temperature 0``, ``n_probs``, ``cache_prompt false``: its free-running greedy ids and the
  top-``N_PROBS`` log-probabilities per step (softmax of its raw logits).

Diagnosis (skip with ``--no-diagnose``): llamapy with an f32 KV cache, the same tokens in one batch (the
prompt path), the k-quant mat-vec kernels bypassed in-process (``kquant_matvec_off``), and the exact model
with its linear layers' inputs rounded as llamapy's decode (Q8_K for k-quant weights) or llama.cpp's
(Q8_0/Q8_1/Q8_K for every quantized weight) mat-vec does.

Run: ``python benchmarks/exactness.py [--models smollm2,gemma3] [--prompts N] [--threads 1]
[--out benchmarks/results/exactness.md]`` (needs torch and transformers, the test-only dependencies, and
``benchmarks/build_llamacpp.sh``'s build). About 8 minutes on 2 busy cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS_DIR = Path.home() / ".cache/llamapy/models"
LLAMACPP_BIN = Path.home() / ".cache/llamapy/llamacpp/0.3.36/build/bin"
MODELS = {
    "smollm2": ("SmolLM2-135M-Instruct.Q4_1.gguf", "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"),
    "gemma3": ("gemma-3-270m-q4_k_m.gguf", "<start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n"),
}
N_GEN = 32
N_PROBS = 10
N_CTX = 1024
# threads for all three (exactness does not depend on it; on a machine other jobs keep busy, one thread each
# avoids workers waiting for a core)
N_THREADS = 1

# 24 held-out prompts (none is in ../shared/reference/prompts.json): ("chat", question) is wrapped in the
# model's chat template; ("raw", text) is fed as is.
PROMPTS: list[tuple[str, str]] = [
    ("chat", "What is the capital of Australia, and why is it not Sydney?"),
    ("chat", "Give me three tips for sleeping better."),
    ("chat", "Explain what a hash table is in two sentences."),
    ("chat", "How many minutes are there in a week? Show the calculation."),
    ("chat", "Write a haiku about autumn rain."),
    ("chat", "What is the difference between weather and climate?"),
    ("chat", "Translate 'good morning, how are you?' into French."),
    ("chat", "Is 221 a prime number?"),
    ("raw", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'),
    ("raw", "import numpy as np\n\ndef softmax(x):\n"),
    ("raw", "#include <stdio.h>\n\nint main(void) {\n"),
    ("raw", "SELECT name, COUNT(*) FROM orders\n"),
    ("raw", "function debounce(fn, ms) {\n"),
    ("raw", "The old lighthouse keeper climbed the stairs one last time, and"),
    ("raw", "In 1969, the Apollo 11 mission"),
    ("raw", "Once upon a time, in a village at the edge of a great forest,"),
    ("raw", "The mitochondria is often called the powerhouse of the cell because"),
    ("raw", "Dear hiring manager,\n\nI am writing to apply for"),
    ("raw", "1, 1, 2, 3, 5, 8, 13, 21,"),
    ("raw", "The square root of 144 is 12, the square root of 169 is"),
    ("raw", "Year,Revenue,Profit\n2019,1200,150\n2020,1350,170\n2021,"),
    ("raw", "3.14159 26535 89793"),
    ("raw", "Q: If a train travels 60 km in 45 minutes, what is its speed in km/h?\nA:"),
    ("raw", "Ingredients for pancakes:\n- 2 cups flour\n-"),
]


# ---------------------------------------------------------------------------------------------
# the exact model


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of convert_hf_to_gguf.py's LlamaModel.permute (ggml's interleaved rope rows -> HF's halves)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}


def _rope_float64(rot: Any, bases: dict[str | None, float], dim: int) -> None:
    """HF computes the rotary angles in float32 whatever the model's dtype: recompute them in float64."""
    import torch

    inv = {lt: 1.0 / (b ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)) for lt, b in bases.items()}

    def forward(x: Any, position_ids: Any, layer_type: str | None = None) -> tuple[Any, Any]:
        freqs = position_ids[..., None].double() * inv[layer_type]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    rot.forward = forward


def exact_model(path: Path) -> Any:
    """The file's weights, dequantized by llamapy, in a float64 transformers model of its architecture."""
    import torch
    import transformers

    from llamapy.ggml import quants
    from llamapy.gguf import GGUFReader

    r = GGUFReader(path)
    md = r.metadata
    arch = md["general.architecture"]

    def k(name: str, default: Any = None) -> Any:
        return md.get(f"{arch}.{name}", default)

    n_embd, n_head, n_head_kv = k("embedding_length"), k("attention.head_count"), k("attention.head_count_kv")
    head_dim = k("attention.key_length", n_embd // n_head)
    tensors = {t.name: t for t in r}
    n_vocab = tensors["token_embd.weight"].shape[0]
    tied = "output.weight" not in tensors
    common = dict(
        vocab_size=n_vocab,
        hidden_size=n_embd,
        intermediate_size=k("feed_forward_length"),
        num_hidden_layers=k("block_count"),
        num_attention_heads=n_head,
        num_key_value_heads=n_head_kv,
        head_dim=head_dim,
        max_position_embeddings=k("context_length"),
        rms_norm_eps=float(k("attention.layer_norm_rms_epsilon")),
        tie_word_embeddings=tied,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
    )
    if arch == "llama":
        cfg = transformers.LlamaConfig(
            **common, rope_parameters={"rope_type": "default", "rope_theta": float(k("rope.freq_base"))}
        )
        cls = transformers.LlamaForCausalLM
    elif arch == "gemma3":
        n_layer = common["num_hidden_layers"]
        # llamapy's and llama.cpp's default pattern: every 6th layer global
        layer_types = ["full_attention" if il % 6 == 5 else "sliding_attention" for il in range(n_layer)]
        if md.get("gemma3.attention.sliding_window_pattern") is not None:
            raise NotImplementedError("gemma3.attention.sliding_window_pattern in the file")
        cfg = transformers.Gemma3TextConfig(
            **common,
            query_pre_attn_scalar=head_dim,
            sliding_window=k("attention.sliding_window"),
            layer_types=layer_types,
            hidden_activation="gelu_pytorch_tanh",
            final_logit_softcapping=None,
            attn_logit_softcapping=None,
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": float(k("rope.freq_base"))},
                "sliding_attention": {
                    "rope_type": "default",
                    "rope_theta": float(k("rope.freq_base_swa", 1e4)),
                },
            },
        )
        cls = transformers.Gemma3ForCausalLM
    else:
        raise NotImplementedError(f"{path}: no exact model for architecture {arch!r}")
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    dt = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model = cls(cfg)
    finally:
        torch.set_default_dtype(dt)
    sd: dict[str, Any] = {}
    for name, t in tensors.items():
        w = np.asarray(quants.dequantize(t.array(), t.ggml_type), dtype=np.float64).reshape(t.shape)
        if arch == "gemma3" and name.endswith("norm.weight"):
            w = w - 1.0  # the file stores 1 + w; HF's Gemma RMSNorm multiplies by (1 + w) (exact in f64)
        if name == "token_embd.weight":
            sd["model.embed_tokens.weight"] = w
            if tied:
                sd["lm_head.weight"] = w
        elif name == "output.weight":
            sd["lm_head.weight"] = w
        elif name == "output_norm.weight":
            sd["model.norm.weight"] = w
        elif name.startswith("blk."):
            il, rest = name[4:].split(".", 1)
            if rest == "ffn_norm.weight":
                hf = (
                    "pre_feedforward_layernorm.weight"
                    if arch == "gemma3"
                    else "post_attention_layernorm.weight"
                )
            elif rest == "post_attention_norm.weight":
                hf = "post_attention_layernorm.weight"
            else:
                hf = _LAYER[rest]
            if arch == "llama" and rest == "attn_q.weight":
                w = _unpermute(w, n_head)
            elif arch == "llama" and rest == "attn_k.weight":
                w = _unpermute(w, n_head_kv)
            sd[f"model.layers.{il}.{hf}"] = w
        else:
            raise KeyError(f"{path}: no HF name for tensor {name!r}")
    missing = set(model.state_dict()) - set(sd)
    if missing:
        raise KeyError(f"{path}: tensors missing for the HF model: {sorted(missing)[:5]}")
    with torch.no_grad():
        for n, p in model.state_dict().items():
            if n in sd:
                p.copy_(torch.from_numpy(np.ascontiguousarray(sd[n])))
    if arch == "gemma3":  # sqrt(n_embd) in float64 (HF keeps it as a float32 buffer)
        model.model.embed_tokens.embed_scale = torch.tensor(math.sqrt(n_embd), dtype=torch.float64)
        bases = {lt: cfg.rope_parameters[lt]["rope_theta"] for lt in set(layer_types)}
    else:
        bases = {None: cfg.rope_parameters["rope_theta"]}
    _rope_float64(model.model.rotary_emb, bases, head_dim)
    model.eval()
    model.gguf_path = path
    r.close()
    return model


def exact_logits(model: Any, tokens: list[int], rows: slice) -> np.ndarray:
    """Exact logits (float64) of ``tokens[rows]``: one forward of the whole sequence, no cache (the same
    arithmetic as a KV-cached decode, without 32 sequential calls)."""
    import torch

    with torch.no_grad():
        h = model.model(torch.tensor([tokens])).last_hidden_state[0, rows]
        return model.lm_head(h).numpy()


KQ_FLOAT_LABEL = (
    "llamapy decode, f16 KV, k-quant mat-vec kernels bypassed (dequantized tiles + sgemm: float activations)"
)


@contextlib.contextmanager
def kquant_matvec_off() -> Any:
    """An experiment, in this process only: while active, graphs built by the CPU backend send k-quant
    weights to its dequantized-tile + sgemm path (float activations) instead of the mat-vec kernels that
    round the activations to Q8_K (``matmul_kernels.MATVEC`` without its ``*_K`` entries)."""
    from llamapy.ggml.cpu import matmul_kernels as mk

    saved = {k: mk.MATVEC.pop(k) for k in list(mk.MATVEC) if k.endswith("_K")}
    try:
        yield
    finally:
        mk.MATVEC.update(saved)


def exact_logits_with(model: Any, types: set[str], tokens: list[int], rows: slice) -> np.ndarray:
    """``exact_logits`` with the activations of the linear layers whose weight type is in ``types`` rounded
    as a quantized mat-vec does (``ActivationRounding``)."""
    hooks = ActivationRounding(model, model.gguf_path, types)
    try:
        return exact_logits(model, tokens, rows)
    finally:
        hooks.close()


def _argmax(row: np.ndarray, forbid: np.ndarray) -> int:
    r = np.array(row, dtype=np.float64)
    r[forbid] = -np.inf
    return int(np.argmax(r))


# llama.cpp's vec_dot_type: the type its CPU mat-vec rounds the activations to, per weight type
VEC_DOT = {"Q4_0": "Q8_0", "Q5_0": "Q8_0", "Q8_0": "Q8_0", "Q4_1": "Q8_1", "Q5_1": "Q8_1",
           "Q2_K": "Q8_K", "Q3_K": "Q8_K", "Q4_K": "Q8_K", "Q5_K": "Q8_K", "Q6_K": "Q8_K"}  # fmt: skip
_HF_LINEAR = {
    "attn_q.weight": "self_attn.q_proj",
    "attn_k.weight": "self_attn.k_proj",
    "attn_v.weight": "self_attn.v_proj",
    "attn_output.weight": "self_attn.o_proj",
    "ffn_gate.weight": "mlp.gate_proj",
    "ffn_up.weight": "mlp.up_proj",
    "ffn_down.weight": "mlp.down_proj",
}


class ActivationRounding:
    """Hooks on the exact model's linear layers that round their inputs as a quantized mat-vec does:
    ``dequantize(quantize(float32(x), vec_dot_type))`` for the weights whose GGUF type is in ``types``
    (everything else stays float64). Simulates one source of error at a time."""

    def __init__(self, model: Any, path: Path, types: set[str]) -> None:
        from llamapy.gguf import GGUFReader

        self.handles = []
        with GGUFReader(path) as r:
            wtypes = {t.name: t.ggml_type.name for t in r}
        mods = dict(model.named_modules())
        for name, wt in wtypes.items():
            if wt not in types:
                continue
            if name == "token_embd.weight" and "output.weight" not in wtypes:
                mod = mods["lm_head"]
            elif name == "output.weight":
                mod = mods["lm_head"]
            elif name.startswith("blk.") and name.split(".", 2)[2] in _HF_LINEAR:
                il, rest = name[4:].split(".", 1)
                mod = mods[f"model.layers.{il}.{_HF_LINEAR[rest]}"]
            else:
                continue
            self.handles.append(mod.register_forward_pre_hook(self._hook(VEC_DOT[wt])))

    @staticmethod
    def _hook(vt: str) -> Any:
        import torch

        from llamapy.ggml import quants
        from llamapy.ggml.types import GGMLType

        t = GGMLType[vt]

        def hook(mod: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
            x = args[0]
            xf = x.detach().numpy().astype(np.float32).reshape(-1, x.shape[-1])
            y = np.asarray(quants.dequantize(quants.quantize(xf, t), t), dtype=np.float64)
            return (torch.from_numpy(y.reshape(x.shape)),) + tuple(args[1:])

        return hook

    def close(self) -> None:
        for h in self.handles:
            h.remove()


# ---------------------------------------------------------------------------------------------
# llamapy (the decode path, fed exact's tokens)


@dataclass
class PyRun:
    prompt_logits: np.ndarray  # float32[n_prompt, n_vocab]: one batch, every position (the prompt path)
    steps: np.ndarray  # float32[N_GEN, n_vocab]: step 0 from the prompt (last row only), then one per decode


def llamapy_prompt(ctx: Any, prompt: list[int]) -> np.ndarray:
    """The prompt path: the prompt in one batch, logits of every position."""
    from llamapy.batch import Batch

    ctx.memory.clear()
    ctx.decode(Batch.from_tokens(prompt, pos0=0, logits_all=True))
    return ctx.get_logits().copy()


def greedy_vs_exact(
    exact: Any, ctx: Any, prompt: list[int], forbid: np.ndarray, n: int = N_GEN
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Exact greedy ids, exact's logits of each step (float64[n, n_vocab]) and llamapy's logits of each step
    on exact's prefix (decode path), with llamapy as the draft: llamapy generates greedily, one exact forward
    checks all steps, and at the first step where exact's token differs llamapy's cache is cut back
    (``seq_rm``), fed exact's token, and goes on; repeated until exact confirms every step. Returns also the
    number of exact forwards."""
    from llamapy.batch import Batch

    n_p = len(prompt)
    ctx.memory.clear()
    ctx.decode(Batch.from_tokens(prompt, pos0=0))  # as a generation does: output on the last token only
    steps = [ctx.get_logits()[-1].copy()]  # steps[i]: logits given t[:i]
    t: list[int] = []
    verified, rounds = 0, 0
    while True:
        while len(t) < n:
            if len(steps) == len(t):
                ctx.decode(Batch.from_tokens([t[-1]]))
                steps.append(ctx.get_logits()[-1].copy())
            t.append(_argmax(steps[-1], forbid))
        ex = exact_logits(exact, prompt + t[: n - 1], slice(n_p - 1, None))
        rounds += 1
        a = [_argmax(r, forbid) for r in ex]
        bad = [i for i in range(verified, n) if a[i] != t[i]]
        if not bad:
            return np.array(t), ex, np.stack(steps), rounds
        j = bad[0]
        t, steps, verified = t[:j] + [a[j]], steps[: j + 1], j + 1
        ctx.memory.seq_rm(0, n_p + j, -1)


def llamapy_forced(ctx: Any, prompt: list[int], forced: np.ndarray, n: int = N_GEN) -> np.ndarray:
    """llamapy's logits of each step, fed ``forced`` (the decode path)."""
    from llamapy.batch import Batch

    ctx.memory.clear()
    ctx.decode(Batch.from_tokens(prompt, pos0=0))
    steps = [ctx.get_logits()[-1].copy()]
    for i in range(n - 1):
        ctx.decode(Batch.from_tokens([int(forced[i])]))
        steps.append(ctx.get_logits()[-1].copy())
    return np.stack(steps)


# ---------------------------------------------------------------------------------------------
# llama.cpp (llama-server, token ids in and out)


@dataclass
class CppRun:
    ids: list[int]
    top: list[list[tuple[int, float]]]  # per step: (id, logprob) of its top N_PROBS


class LlamaServer:
    def __init__(self, path: Path, port: int = 0) -> None:
        if not port:  # a free one (two runs at once must not talk to each other's server)
            import socket

            with socket.socket() as sk:
                sk.bind(("127.0.0.1", 0))
                port = sk.getsockname()[1]
        cmd = [str(LLAMACPP_BIN / "llama-server"), "-m", str(path), "--port", str(port), "-c", str(N_CTX),
               "-t", str(N_THREADS), "-np", "1", "--no-warmup"]  # fmt: skip
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(1200):
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"llama-server exited: {err[-500:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        self.close()
        raise RuntimeError("llama-server did not become healthy in 120 s")

    def greedy(self, prompt: list[int], n: int = N_GEN) -> CppRun:
        body = dict(prompt=prompt, n_predict=n, temperature=0, ignore_eos=True, return_tokens=True,
                    n_probs=N_PROBS, cache_prompt=False)  # fmt: skip
        req = urllib.request.Request(
            self.url + "/completion", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=300) as resp:
            d = json.loads(resp.read())
        top = [
            [(int(t["id"]), float(t["logprob"])) for t in st["top_logprobs"]]
            for st in d["completion_probabilities"]
        ]
        return CppRun([int(t) for t in d["tokens"]], top)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()


# ---------------------------------------------------------------------------------------------
# comparison


def _logsoftmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))


def first_divergence(steps: np.ndarray, ref_ids: np.ndarray, forbid: np.ndarray) -> int | None:
    """The first step whose argmax (EOG masked) is not ``ref_ids``' token; None when all agree."""
    s = steps.astype(np.float64, copy=True)
    s[:, forbid] = -np.inf
    bad = np.nonzero(np.argmax(s, axis=1) != ref_ids[: len(s)])[0]
    return int(bad[0]) if len(bad) else None


@dataclass
class PromptResult:
    n_prompt: int
    py_div: int | None  # llamapy's first step whose greedy token is not exact's (None: all 32 equal)
    cpp_div: int | None
    py_gap: float = math.nan  # exact's logit margin of its token over llamapy's at the divergence
    cpp_gap: float = math.nan
    prompt_err: tuple[float, float] = (0.0, 0.0)  # llamapy prompt path, every position: max abs, rms
    step0_err: tuple[float, float] = (0.0, 0.0)  # llamapy step 0 (prompt, last row only)
    dec_err: list[tuple[float, float]] = field(default_factory=list)  # llamapy per decode step (1..) agreed
    dec_err_all: list[tuple[float, float]] = field(default_factory=list)  # every decode step (forced)
    # max |logp - exact logp| over llama.cpp's top N_PROBS tokens, on the steps where llama.cpp's prefix
    # is exact's: (llama.cpp, llamapy) at step 0, and over the decode steps
    lp0: tuple[float, float] = (0.0, 0.0)
    lp_dec: tuple[float, float] = (math.nan, math.nan)
    n_lp_dec: int = 0
    logit_scale: float = 0.0  # max |exact logit| over the steps
    top1_dp: tuple[float, float] = (0.0, 0.0)  # max |p - exact p| of the top token over those steps


def compare(
    ex_ids: np.ndarray,
    ex_prompt: np.ndarray,
    ex_steps: np.ndarray,
    py: PyRun,
    cpp: CppRun,
    n_prompt: int,
    forbid: np.ndarray,
) -> PromptResult:
    n = len(ex_ids)
    py_div = first_divergence(py.steps, ex_ids, forbid)
    cpp_ids = np.array(cpp.ids[:n])
    neq = np.nonzero(cpp_ids != ex_ids[: len(cpp_ids)])[0]
    cpp_div = int(neq[0]) if len(neq) else (None if len(cpp_ids) == n else len(cpp_ids))
    r = PromptResult(n_prompt, py_div, cpp_div)
    r.logit_scale = float(np.abs(ex_steps).max())
    if py_div is not None:
        s = py.steps[py_div].astype(np.float64)
        s[forbid] = -np.inf
        r.py_gap = float(ex_steps[py_div, ex_ids[py_div]] - ex_steps[py_div, int(np.argmax(s))])
    if cpp_div is not None and cpp_div < len(cpp_ids):
        r.cpp_gap = float(ex_steps[cpp_div, ex_ids[cpp_div]] - ex_steps[cpp_div, cpp_ids[cpp_div]])

    def err(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
        d = np.abs(a.astype(np.float64) - b)
        return float(d.max()), float(np.sqrt(np.mean(d**2)))

    r.prompt_err = err(py.prompt_logits, ex_prompt)
    r.step0_err = err(py.steps[0], ex_steps[0])
    agreed = n if py_div is None else py_div
    r.dec_err = [err(py.steps[i], ex_steps[i]) for i in range(1, agreed)]
    r.dec_err_all = [err(py.steps[i], ex_steps[i]) for i in range(1, n)]
    # log-probabilities of llama.cpp's top tokens, on the steps with exact's prefix (through its divergence)
    last = n - 1 if cpp_div is None else min(cpp_div, len(cpp.top) - 1)
    lp_ex, lp_py = _logsoftmax(ex_steps[: last + 1]), _logsoftmax(py.steps[: last + 1])
    dc, dp, p1c, p1p = [], [], [], []
    for i in range(last + 1):
        ids = np.array([t for t, _ in cpp.top[i]])
        lc = np.array([lp for _, lp in cpp.top[i]])
        dc.append(float(np.max(np.abs(lc - lp_ex[i, ids]))))
        dp.append(float(np.max(np.abs(lp_py[i, ids] - lp_ex[i, ids]))))
        p1c.append(abs(math.exp(lc[0]) - math.exp(lp_ex[i, ids[0]])))
        p1p.append(abs(math.exp(lp_py[i, ids[0]]) - math.exp(lp_ex[i, ids[0]])))
    r.lp0 = (dc[0], dp[0])
    if last >= 1:
        r.lp_dec = (max(dc[1:]), max(dp[1:]))
        r.n_lp_dec = last
    r.top1_dp = (max(p1c), max(p1p))
    return r


# ---------------------------------------------------------------------------------------------
# driver and report


@dataclass
class ModelReport:
    name: str
    file: str
    types: str
    rows: list[tuple[str, PromptResult, int | None]] = field(
        default_factory=list
    )  # (prompt, result, f32-KV div)
    seconds: float = 0.0
    n_exact_forwards: int = 0
    types_set: set[str] = field(default_factory=set)
    verify: tuple[int, float, float] = (0, math.nan, math.nan)  # prompt tokens, max abs, relative
    # variant -> per prompt: (first divergence on exact's prefix, max abs and rms error per decode step)
    diag: dict[str, list[tuple[int | None, np.ndarray, np.ndarray]]] = field(default_factory=dict)


def _types(path: Path) -> str:
    from collections import Counter

    from llamapy.gguf import GGUFReader

    with GGUFReader(path) as r:
        c = Counter(t.ggml_type.name for t in r)
    return ", ".join(f"{k} x{v}" for k, v in c.most_common())


def run_model(name: str, log: Any = print, diagnose: bool = True) -> ModelReport:
    from llamapy.batch import Batch
    from llamapy.context import Context
    from llamapy.model.model import Model
    from llamapy.vocab.vocab import eog_ids

    fname, tmpl = MODELS[name]
    path = MODELS_DIR / fname
    t0 = time.perf_counter()
    rep = ModelReport(name, fname, _types(path))
    rep.types_set = {x.split(" ")[0] for x in rep.types.split(", ")}
    lm = Model.load(str(path))
    forbid = eog_ids(lm.vocab)
    prompts = [
        lm.vocab.tokenize(tmpl.format(text) if kind == "chat" else text, add_special=True, parse_special=True)
        for kind, text in PROMPTS
    ]
    srv = LlamaServer(path)
    try:
        cpp = [srv.greedy(p) for p in prompts]
    finally:
        srv.close()
    log(f"{name}: llama.cpp done ({time.perf_counter() - t0:.0f} s)")
    exact = exact_model(path)
    log(f"{name}: exact model loaded ({time.perf_counter() - t0:.0f} s)")
    vp = prompts[min(1, len(prompts) - 1)]
    ref = exact_logits(exact, vp, slice(None))
    cnp = Context(lm, n_ctx=256, n_threads=N_THREADS, backend="numpy", type_k="f32", type_v="f32")
    cnp.decode(Batch.from_tokens(vp, pos0=0, logits_all=True))
    d = np.abs(cnp.get_logits().astype(np.float64) - ref)
    rep.verify = (len(vp), float(d.max()), float(d.max() / np.abs(ref).max()))
    del cnp
    log(
        f"{name}: exact vs llamapy's NumPy backend: max abs {rep.verify[1]:.2g} ({rep.verify[2]:.2g} relative)"
    )
    sims: dict[str, set[str]] = {}
    if diagnose:
        kq = {t for t in rep.types_set if t.endswith("_K")}
        if kq:
            sims[
                "exact + llamapy's decode rounding (activations to Q8_K for " + "/".join(sorted(kq)) + ")"
            ] = kq
        q = {t for t in rep.types_set if t in VEC_DOT}
        sims["exact + llama.cpp's rounding (activations to Q8_0/Q8_1/Q8_K for every quantized weight)"] = q
    ctx_f = None
    if diagnose and any(t.endswith("_K") for t in rep.types_set):
        ctx_f = Context(lm, n_ctx=N_CTX, n_threads=N_THREADS)  # its graphs are built with kquant_matvec_off
    ctx = Context(lm, n_ctx=N_CTX, n_threads=N_THREADS)  # defaults: f16 KV cache, flash attention
    ctx32 = Context(lm, n_ctx=N_CTX, n_threads=N_THREADS, type_k="f32", type_v="f32")
    for (kind, text), p, c in zip(PROMPTS, prompts, cpp, strict=True):
        ex_prompt = exact_logits(exact, p, slice(None))
        py_prompt = llamapy_prompt(ctx, p)
        ex_ids, ex_steps, py_steps, rounds = greedy_vs_exact(exact, ctx, p, forbid)
        rep.n_exact_forwards += rounds
        py32 = llamapy_forced(ctx32, p, ex_ids)
        res = compare(ex_ids, ex_prompt, ex_steps, PyRun(py_prompt, py_steps), c, len(p), forbid)
        rep.rows.append((f"{kind}: {text}", res, first_divergence(py32, ex_ids, forbid)))
        if diagnose:
            seq = p + [int(t) for t in ex_ids[:-1]]
            variants = {"llamapy decode, f16 KV (as above)": py_steps, "llamapy decode, f32 KV": py32}
            ctx.memory.clear()
            ctx.decode(Batch.from_tokens(seq, pos0=0, logits_all=True))
            variants["llamapy, the same tokens in one batch (prompt path), f16 KV"] = ctx.get_logits()[
                len(p) - 1 :
            ]
            if ctx_f is not None:
                with kquant_matvec_off():
                    variants[KQ_FLOAT_LABEL] = llamapy_forced(ctx_f, p, ex_ids)
            for label, hooks in sims.items():
                variants[label] = exact_logits_with(exact, hooks, seq, slice(len(p) - 1, None))
            for label, st in variants.items():
                d = np.abs(st.astype(np.float64) - ex_steps)
                rep.diag.setdefault(label, []).append(
                    (
                        first_divergence(st, ex_ids, forbid),
                        d[1:].max(axis=1),
                        np.sqrt(np.mean(d[1:] ** 2, axis=1)),
                    )
                )
        log(f"  {len(rep.rows):2d} n={len(p):3d} llamapy div {res.py_div} (f32 KV {rep.rows[-1][2]}), "
            f"llama.cpp div {res.cpp_div}")  # fmt: skip
    del exact
    rep.seconds = time.perf_counter() - t0
    return rep


def machine_line() -> str:
    cpu, flags = platform.processor() or "?", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    fl = " ".join(f for f in ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx_vnni") if f in flags)
    la = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{cpu}, {os.cpu_count()} cores, {fl}; load average {la}; Python {platform.python_version()}"


def _div(d: int | None) -> str:
    return "32/32" if d is None else f"{d}"


def _f(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2g}"


def report(reps: list[ModelReport], cmd: str, machine: str, elapsed: float) -> str:
    out = [
        "# Exactness on the decode path: llamapy and llama.cpp vs an exact float64 computation",
        "",
        f"- machine: {machine}",
        f"- command: `{cmd}` ({elapsed:.0f} s)",
        "- exact: the file's weights dequantized by llamapy (bit-identical to gguf-py's `dequantize` for every "
        "type in these files), in transformers' `LlamaForCausalLM` / `Gemma3ForCausalLM` in float64 (rotary "
        "angles in float64 too; eager attention). Checked against llamapy's NumPy backend (float32 weights and "
        "activations, f32 KV) on prompt 2 (or 1), every position: max |Δlogit| "
        + ", ".join(f"{r.verify[1]:.2g} ({r.name}, {r.verify[2]:.1g} of max |logit|)" for r in reps)
        + ". Exact greedy is computed with llamapy as the draft: one exact forward of the whole "
        "sequence checks every step (same arithmetic as a KV-cached decode); where exact's token differs, "
        "llamapy's cache is cut back there (`seq_rm`), fed exact's token, and continues; repeated until exact "
        "confirms all 32 steps.",
        f"- llamapy: `Context` (f16 KV cache, flash attention, {N_THREADS} thread(s)): the prompt in one batch "
        "(last row only, as a generation does), then one token per `decode` (the decode path), always on exact's "
        "prefix; its greedy output equals exact's up to the first step where its argmax differs. The prompt-path "
        "error is another decode of the prompt with every position's logits. Also run with an f32 KV cache.",
        f"- llama.cpp: `llama-server` 0.3.36 (`-t {N_THREADS}`, f16 KV) `/completion`, prompt as token ids, "
        f"`temperature 0`, `ignore_eos`, `n_probs {N_PROBS}`, `cache_prompt false`: its own greedy ids and the "
        f"top-{N_PROBS} log-probabilities per step (softmax of its raw logits).",
        f"- {len(PROMPTS)} held-out prompts (chat-formatted questions, code, prose, numbers; fixed in "
        f"`benchmarks/exactness.py`), the same token ids for all three, {N_GEN} greedy tokens, EOG masked. "
        "Step 0's logits come from the prompt batch (the prompt path), steps 1..31 from single-token decodes.",
        "",
    ]
    for rep in reps:
        rows = [r for _, r, _ in rep.rows]
        n = len(rows)
        py_ok = sum(r.py_div is None for r in rows)
        py32_ok = sum(d is None for _, _, d in rep.rows)
        cpp_ok = sum(r.cpp_div is None for r in rows)
        pm = max(r.prompt_err[0] for r in rows)
        prms = math.sqrt(np.mean([r.prompt_err[1] ** 2 for r in rows]))
        dec = [e for r in rows for e in r.dec_err]
        dec_all = [e for r in rows for e in r.dec_err_all]
        s0 = [r.step0_err for r in rows]
        lp0c, lp0p = max(r.lp0[0] for r in rows), max(r.lp0[1] for r in rows)
        lpd = [r.lp_dec for r in rows if r.n_lp_dec]
        lpdc, lpdp = (max(x[0] for x in lpd), max(x[1] for x in lpd)) if lpd else (math.nan, math.nan)
        lp_better = sum(x[1] < x[0] for x in lpd)
        out += [
            f"## {rep.name}: {rep.file} ({rep.types}; {rep.seconds:.0f} s, {rep.n_exact_forwards} exact forwards)",
            "",
            "| | llamapy (f16 KV) | llamapy (f32 KV) | llama.cpp |",
            "| --- | --- | --- | --- |",
            f"| prompts whose 32 greedy tokens equal exact's | **{py_ok}/{n}** | {py32_ok}/{n} | **{cpp_ok}/{n}** |",
            f"| max \\|Δlogp\\| of llama.cpp's top-{N_PROBS} tokens, step 0 (prompt path), all prompts | "
            f"{_f(lp0p)} | | {_f(lp0c)} |",
            f"| same, decode steps on exact's prefix ({sum(r.n_lp_dec for r in rows)} steps) | {_f(lpdp)} | | "
            f"{_f(lpdc)} |",
            f"| prompts where that decode error is smaller | {lp_better}/{len(lpd)} | | "
            f"{len(lpd) - lp_better}/{len(lpd)} |",
            f"| max \\|p - p_exact\\| of llama.cpp's top token, those steps | {_f(max(r.top1_dp[1] for r in rows))} "
            f"| | {_f(max(r.top1_dp[0] for r in rows))} |",
            "",
            "llamapy's logit error vs exact, all n_vocab logits (logit units; max \\|exact logit\\| per prompt "
            f"{min(r.logit_scale for r in rows):.0f}-{max(r.logit_scale for r in rows):.0f}):",
            "",
            "| path | steps | max abs | rms |",
            "| --- | --- | --- | --- |",
            f"| prompt, one batch, every position | {sum(r.n_prompt for r in rows)} | {_f(pm)} | {_f(prms)} |",
            f"| step 0 (prompt batch, last row only) | {n} | {_f(max(e[0] for e in s0))} | "
            f"{_f(math.sqrt(np.mean([e[1] ** 2 for e in s0])))} |",
            f"| decode, steps where it agreed | {len(dec)} | {_f(max(e[0] for e in dec))} | "
            f"{_f(math.sqrt(np.mean([e[1] ** 2 for e in dec])))} |",
            f"| decode, every step (exact's prefix) | {len(dec_all)} | {_f(max(e[0] for e in dec_all))} | "
            f"{_f(math.sqrt(np.mean([e[1] ** 2 for e in dec_all])))} |",
            "",
        ]
        if rep.diag:
            out += [
                "Where the decode error comes from: variants on exact's tokens (teacher forcing), decode steps "
                "1..31 of every prompt; a variant 'agrees' on a prompt when its argmax is exact's token at all 32 "
                "steps. The exact-model rows round only the activations of the linear layers (float64 otherwise).",
                "",
                "| variant | prompts agreeing | max abs | rms |",
                "| --- | --- | --- | --- |",
            ]
            for label, per in rep.diag.items():
                mx = max(float(m.max()) for _, m, _ in per)
                rms = math.sqrt(float(np.mean(np.concatenate([r**2 for _, _, r in per]))))
                ok = sum(d is None for d, _, _ in per)
                out.append(f"| {label} | {ok}/{len(per)} | {_f(mx)} | {_f(rms)} |")
            out.append("")
        out += [
            "Per prompt: first step whose greedy token differs from exact's (32/32: none) and exact's margin "
            "(logits) of its own token over the other's there; llamapy's logit error (max abs / rms over the "
            f"vocabulary, worst step); max \\|Δlogp\\| of llama.cpp's top-{N_PROBS} (llama.cpp / llamapy).",
            "",
            "| # | prompt | n | llamapy | margin | f32 KV | llama.cpp | margin | prompt path | decode | "
            "Δlogp step 0 | Δlogp decode |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for i, (text, r, d32) in enumerate(rep.rows):
            short = text.replace("\n", "\\n").replace("|", "\\|")
            short = short if len(short) <= 40 else short[:38] + "…"
            de = max(r.dec_err_all, default=(math.nan, math.nan), key=lambda e: e[0])
            out.append(
                f"| {i + 1} | `{short}` | {r.n_prompt} | {_div(r.py_div)} | {_f(r.py_gap)} | {_div(d32)} | "
                f"{_div(r.cpp_div)} | {_f(r.cpp_gap)} | {_f(r.prompt_err[0])} / {_f(r.prompt_err[1])} | "
                f"{_f(de[0])} / {_f(de[1])} | {_f(r.lp0[0])} / {_f(r.lp0[1])} | "
                f"{_f(r.lp_dec[0])} / {_f(r.lp_dec[1])} |"
            )
        out.append("")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="smollm2,gemma3", help="comma-separated: " + ", ".join(MODELS))
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/exactness.md"))
    ap.add_argument("--threads", type=int, default=N_THREADS, help="threads for exact, llamapy and llama.cpp")
    ap.add_argument(
        "--no-diagnose", action="store_true", help="skip the variants (f32 KV, one batch, simulations)"
    )
    ap.add_argument(
        "--prompts", type=int, default=len(PROMPTS), help="only the first N prompts (a quick try)"
    )
    args = ap.parse_args(argv)
    import torch

    globals()["N_THREADS"] = args.threads
    torch.set_num_threads(args.threads)
    del PROMPTS[args.prompts :]
    if not (LLAMACPP_BIN / "llama-server").exists():
        print(
            f"llama-server not found in {LLAMACPP_BIN} (benchmarks/build_llamacpp.sh builds it)",
            file=sys.stderr,
        )
        return 2
    t0 = time.perf_counter()
    machine = machine_line()
    reps = [run_model(m.strip(), diagnose=not args.no_diagnose) for m in args.models.split(",") if m.strip()]
    cmd = "python benchmarks/exactness.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = report(reps, cmd.strip(), machine, time.perf_counter() - t0)
    out = Path(args.out)
    if out.exists() and "\n## Findings" in out.read_text():  # hand-written: kept, placed after the header
        old = out.read_text()
        findings = old[old.index("\n## Findings") :].split("\n## ", 2)[1]
        head, rest = text.split("\n## ", 1)
        text = f"{head}\n## {findings.rstrip()}\n\n## {rest}"
    out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
