"""``rowgroups.x8_rows``: the one-row loop of every 8-row kernel, each part of the row groups read as two
streams. Its result does not depend on how many parts (threads) it is split into, nor on odd group
counts or more parts than groups, nor on one group a part (``nth`` 0: one stream a thread): the same
bits as one part, for every dense type's one-row kernel."""

from __future__ import annotations

import numpy as np
import pytest

from tests.ggml.test_prefetch_tune import _dense, _q


@pytest.mark.parametrize("case", range(8), ids=lambda i: _dense()[i][0])
def test_the_parts_change_no_bit(case):
    _, t, repack, kernels = _dense()[case]
    one_row = kernels[0]
    K = 768
    rng = np.random.default_rng(case)
    for groups in (1, 2, 3, 7):
        R = repack(_q(t, 8 * groups, K, case + groups), t)
        for M in (1, 3):
            x = rng.standard_normal((M, K)).astype(np.float32)
            ref = np.zeros((M, 8 * groups), np.float32)
            one_row(R, x, ref, 2048, 1)
            assert np.isfinite(ref).all()
            for parts in (2, 3, 5, 64, 0):
                out = np.zeros_like(ref)
                one_row(R, x, out, 2048, parts)
                np.testing.assert_array_equal(
                    out.view(np.uint32), ref.view(np.uint32), err_msg=f"{groups} {M} {parts}"
                )
            out = np.zeros_like(ref)
            one_row(R, x, out, 2048)  # the default: two parts
            np.testing.assert_array_equal(out.view(np.uint32), ref.view(np.uint32))
