"""Generation rate constrained by a JSON schema vs unconstrained, same prompt, same model, one run.

Run: ``python -m benchmarks.bench_structured [-n 128] [-r 3] [-t 2]``. For SmolLM2 (49k vocabulary) and
Gemma 3 270M (262k), prints decode tokens/s without a grammar and with a schema whose one string field
must be long (so both runs generate the same number of tokens), interleaved, and the ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from llamapy import Llama, LlamaGrammar, hub

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root (benchmarks.harness)
from benchmarks.harness import machine_line  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {"story": {"type": "string", "minLength": 4000}},
    "required": ["story"],
    "additionalProperties": False,
}
PROMPT = "Write a long story about a lighthouse keeper, as JSON."


def decode_rate(llm: Llama, grammar: LlamaGrammar | None, n: int) -> float:
    """Tokens/s of the generated tokens after the first (the prompt is evaluated before the clock)."""
    t_first = None
    count = 0
    for chunk in llm(PROMPT, max_tokens=n, temperature=0, grammar=grammar, stream=True):
        if chunk["choices"][0]["finish_reason"] is None:
            count += 1
            if t_first is None:
                t_first = time.perf_counter()
    assert t_first is not None
    return (count - 1) / (time.perf_counter() - t_first)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("-t", type=int, default=2)
    args = ap.parse_args()
    print(f"# {machine_line(python=True)}, -t {args.t}")
    grammar = LlamaGrammar.from_json_schema(json.dumps(SCHEMA))
    for name in ("smollm2-135m-instruct", "gemma3-270m"):
        llm = Llama(str(hub.pull(name, quiet=True)), n_ctx=512, n_threads=args.t, verbose=False)
        decode_rate(llm, None, 8)  # warm up both paths (kernels, the grammar's tokenizer)
        decode_rate(llm, grammar, 8)
        free, constrained = [], []
        for _ in range(args.r):
            free.append(decode_rate(llm, None, args.n))
            constrained.append(decode_rate(llm, grammar, args.n))
        f, c = statistics.median(free), statistics.median(constrained)
        print(
            f"{name:24s} n_vocab {llm.n_vocab():6d}  unconstrained {f:6.1f} t/s  json-schema {c:6.1f} t/s  "
            f"ratio {c / f:.2f}  (medians of {args.r}, {args.n} tokens)"
        )


if __name__ == "__main__":
    main()
