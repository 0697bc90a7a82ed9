"""What ``benchmarks/exactness.py`` measures: the models, the held-out prompts, lengths and threads
(``main`` may lower ``N_THREADS`` and cut ``PROMPTS``; the other modules read them from here at call time)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.harness import llamacpp_bin  # noqa: E402
from benchmarks.shaped import DIR as SHAPED_DIR  # noqa: E402

MODELS_DIR = Path.home() / ".cache/llamapy/models"
LLAMACPP_BIN = llamacpp_bin()
_CHATML = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
MODELS = {
    "smollm2": ("SmolLM2-135M-Instruct.Q4_1.gguf", _CHATML),
    "gemma3": ("gemma-3-270m-q4_k_m.gguf", "<start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n"),
    # the real file (``llamapy pull Qwen/Qwen2.5-0.5B-Instruct-GGUF:q4_k_m``, copied into the models dir)
    "qwen2.5-0.5b": ("qwen2.5-0.5b-instruct-q4_k_m.gguf", _CHATML),
    # its shape's random-weight file (``shaped.ensure("qwen2.5-0.5b", "Q4_K_M")``, absolute, so MODELS_DIR / it
    # is itself): the arithmetic, not a model's answers
    "qwen2.5-0.5b-shape": (str(SHAPED_DIR / "qwen2.5-0.5b.Q4_K_M.gguf"), _CHATML),
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
