"""benchmarks/x8_prefetch_types.py: each type's library kernel at every distance (into L2, L1, two
groups ahead) gives its result at distance 0, and bad arguments are an ``error:``."""

from __future__ import annotations

import pytest

from benchmarks import x8_prefetch_types as xp


def test_every_type_and_distance_runs_and_matches() -> None:
    ds = ["2048", "-2048", "-64", "0", "0/1", "2048/1"]
    lines = xp.run(list(xp.KERNELS), [(16, 512)], ds, total_mb=0.0, sweeps=1)
    assert [ln.split()[0] for ln in lines] == list(xp.KERNELS)
    for ln in lines:
        assert "16x512" in ln and all(f" {d}: " in ln for d in ds)
    q4k, q40 = xp.run(["Q4_K", "Q4_0"], [(8, 96)], ["0"], total_mb=0.0, sweeps=1)
    assert q4k == "Q4_K 8x96: skipped (K not a multiple of 256)" and q40.startswith("Q4_0 8x96 (")


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        (["--types", "Q4_0,Q3_K"], "unknown type 'Q3_K'"),
        (["--shapes", "16x500"], "K of 32"),
        (["--distances", "2k"], "integers"),
        (["--distances", "0/3"], "integers"),
    ],
)
def test_bad_arguments_are_errors(args: list[str], msg: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert xp.main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("error:") and msg in err
