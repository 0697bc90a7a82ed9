"""What ``llamapy run`` and ``llamapy quantize`` import: their arguments parse without the server, the
multimodal code, Hugging Face libraries or templates, and a whole ``run`` on a cached model stays off
them too, and off the modules Numba would import only to compile (see benchmarks/results/startup_run.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# never needed to complete a prompt or quantize a file
HEAVY = (
    "fastapi", "uvicorn", "starlette", "pydantic", "httpx", "transformers", "torch", "jinja2",
    "huggingface_hub", "tokenizers", "safetensors", "llguidance", "PIL", "scipy", "yaml",
    "llamapy.server", "llamapy.mtmd", "llamapy.convert", "llamapy.chat", "llamapy.grammar", "llamapy.ray",
)  # fmt: skip
# imported by Numba only to compile, or by typing an array; a cached kernel needs neither
COMPILE_ONLY = ("numba.np.arrayobj", "numba.cpython.charseq", "numpy.ma", "numba.core.typing.cffi_utils")
# what a model run reads none of: the quantizers' codecs, the GGUF writer, LoRA, --mlock's ctypes.util, the
# hub's download code (a model file is a path), multiprocessing (Numba's threading-layer lock)
NOT_FOR_A_RUN = (
    "llamapy.ggml.quants.kquants", "llamapy.ggml.quants.legacy", "llamapy.ggml.quants._kquantize",
    "llamapy.gguf.writer", "llamapy.model.lora", "email", "llamapy.hub.known", "llamapy.hub.hf", "multiprocessing",
)  # fmt: skip

REPORT = (
    "import json, sys\nprint()\n"
    "mods = sorted(m for m in sys.modules if any(m == h or m.startswith(h + '.') for h in {names!r}))\n"
    "print(json.dumps(mods))\n"
)


def _py(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMAPY_NUMBA")}
    env["LLAMAPY_QUIET"] = "1"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)


def _imported(code: str, names: tuple[str, ...]) -> list[str]:
    out = _py(code + REPORT.format(names=names))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "-m", "model.gguf", "-p", "Hello", "-n", "16", "-c", "4096", "-t", "2"],
        ["quantize", "in.gguf", "out.gguf", "Q8_0", "2"],
    ],
    ids=["run", "quantize"],
)
def test_parsing_a_subcommand_imports_nothing_heavy(argv: list[str]) -> None:
    code = f"from llamapy.cli import build_parser\nbuild_parser({argv[0]!r}).parse_args({argv!r})\n"
    assert _imported(code, HEAVY) == []


def test_a_whole_run_imports_only_what_it_needs(smollm2_path) -> None:
    code = (
        "import io, sys\n"
        "from llamapy.cli import main\n"
        f"argv = ['run', '-m', {str(smollm2_path)!r}, '-p', 'Hello', '-n', '2', '--temp', '0']\n"
        "assert main(argv) == 0\n"
    )
    first = _py(code)  # may compile kernels (then Numba imports its whole library): the cache is warm after
    assert first.returncode == 0, first.stderr
    assert _imported(code, HEAVY + COMPILE_ONLY + NOT_FOR_A_RUN) == []
    # importlib.metadata (Numba's entry points, read before a compile only) stays the lazy module
    lazy = _py(code + "print()\nimport importlib.util as u\nm = sys.modules.get('importlib.metadata')\n"
               "print(m is None or type(m) is u._LazyModule)\n")  # fmt: skip
    assert lazy.returncode == 0 and lazy.stdout.strip().splitlines()[-1] == "True", lazy.stderr
