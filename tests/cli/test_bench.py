"""``llamapy bench``: llama-bench's records and table on a tiny model."""

from __future__ import annotations

import json

from llamapy.cli import main
from llamapy.cli.bench import bench, markdown
from tests.model.tiny import tiny_llama


def test_bench_records_and_table(tmp_path, capsys):
    path = tiny_llama(tmp_path / "t.gguf")
    recs = bench(str(path), [16], [4], reps=2, n_threads=1)
    assert [(r["n_prompt"], r["n_gen"]) for r in recs] == [(16, 0), (0, 4)]
    for r in recs:
        for k in ("model_filename", "model_type", "model_size", "n_threads", "n_prompt", "n_gen", "avg_ts",
                  "stddev_ts", "samples_ts", "samples_ns", "avg_ns"):  # fmt: skip
            assert k in r
        assert len(r["samples_ts"]) == 2 and r["avg_ts"] > 0 and r["n_threads"] == 1
    table = markdown(recs)
    assert "| pp16 |" in table and "| tg4 |" in table
    assert main(["bench", "-m", str(path), "-p", "8", "-n", "2", "-r", "1", "-t", "1", "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out[0]["n_prompt"] == 8 and out[1]["n_gen"] == 2 and out[0]["model_size"] > 0
