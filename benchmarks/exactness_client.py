"""llama.cpp for ``benchmarks/exactness.py``: ``llama-server`` (started by ``benchmarks.harness``), token ids in
and out, its free-running greedy ids and top log-probabilities per step."""

from __future__ import annotations

import json
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import exactness_setup as S  # noqa: E402
from benchmarks.harness import start_server  # noqa: E402

# ---------------------------------------------------------------------------------------------
# llama.cpp (llama-server, token ids in and out)


@dataclass
class CppRun:
    ids: list[int]
    top: list[list[tuple[int, float]]]  # per step: (id, logprob) of its top N_PROBS


class LlamaServer:
    def __init__(self, path: Path) -> None:
        args = ["-c", str(S.N_CTX), "-t", str(S.N_THREADS), "-np", "1", "--no-warmup"]
        self.srv = start_server("llama.cpp", path, args, timeout=120, bin_dir=S.LLAMACPP_BIN)
        self.url = self.srv.base

    def greedy(self, prompt: list[int], n: int = S.N_GEN) -> CppRun:
        body = dict(prompt=prompt, n_predict=n, temperature=0, ignore_eos=True, return_tokens=True,
                    n_probs=S.N_PROBS, cache_prompt=False)  # fmt: skip
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
        self.srv.stop()
