"""``--lora`` / ``--lora-scaled`` on ``llamapy run`` (in-process): the adapter changes the greedy text
the way the API's ``lora_path`` does, and an adapter for another model is a one-line error."""

from __future__ import annotations

import numpy as np

from llamapy.cli import main
from llamapy.model import Model
from tests.model.lora_files import random_pairs, write_lora

PROMPT = "The capital of France is"


def _run(capfd, *args: str) -> tuple[int, str, str]:
    rc = main(["run", *args])
    out, err = capfd.readouterr()
    return rc, out, err


def test_run_with_lora(capfd, smollm2_path, tmp_path):
    m = Model.load(smollm2_path)
    names = [f"blk.{il}.ffn_down.weight" for il in range(0, 30, 2)]
    w = {n: np.zeros(m.impl.w[n].shape, np.float32) for n in names}
    lora = str(write_lora(tmp_path / "a.gguf", "llama", random_pairs(w, names, rank=8, seed=4, s=1.0), 16.0))
    base = ["-m", str(smollm2_path), "-p", PROMPT, "-n", "6", "--temp", "0", "-c", "256"]
    rc0, plain, _ = _run(capfd, *base)
    rc1, on, _ = _run(capfd, *base, "--lora", lora)
    rc2, off, _ = _run(capfd, *base, "--lora-scaled", lora, "0")
    assert rc0 == rc1 == rc2 == 0
    assert on != plain and off == plain
    from llamapy import Llama

    llm = Llama(str(smollm2_path), lora_path=lora, n_ctx=256, verbose=False)
    assert on == llm.create_completion(PROMPT, max_tokens=6, temperature=0)["choices"][0]["text"]
    bad = write_lora(tmp_path / "b.gguf", "gemma3", random_pairs(w, names[:1], rank=2))
    rc, _, err = _run(capfd, *base, "--lora", str(bad))
    assert rc == 1 and "architecture 'gemma3'" in err and len(err.strip().splitlines()) <= 2, err
