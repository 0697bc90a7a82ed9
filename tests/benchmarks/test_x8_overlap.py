"""benchmarks/x8_overlap.py: every prefetch variant of the Q4_K 8-row loop computes mm_q4_k_x8's result."""

from __future__ import annotations

import pytest

from benchmarks import x8_overlap


def test_variants_match_the_library_kernel() -> None:
    variants = [(name, d) for name in x8_overlap.MODES for d in (0, 2048)]
    (line,) = x8_overlap.run([(64, 512)], variants, total_mb=0.0, sweeps=1)
    assert line.startswith("Q4_K 64x512") and line.count("GB/s") == 1
    assert all(f"{name}:{d} " in line for name, d in variants)


def test_unknown_variant_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert x8_overlap.main(["--variants", "cur:0,nope:1", "--shapes", "64x512", "--total-mb", "0"]) == 1
    assert "error: unknown variant 'nope'" in capsys.readouterr().err
