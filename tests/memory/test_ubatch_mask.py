"""The mask of a ubatch over itself for models without a KV cache (encoders): block-diagonal over
sequences, causal or not, standard or symmetric windows, ALiBi distances."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.errors import LlamapyError
from llamapy.memory import Memory, ubatch_mask

INF = -np.inf


def test_block_diagonal_over_sequences() -> None:
    pos = np.array([0, 1, 2, 0, 1])
    seq = np.array([0, 0, 0, 3, 3])
    m = ubatch_mask(pos, seq)
    ok = np.isfinite(m)
    assert ok[:3, :3].all() and ok[3:, 3:].all()
    assert not ok[:3, 3:].any() and not ok[3:, :3].any()
    assert (m[ok] == 0).all() and m.dtype == np.float32


def test_causal_windows_and_alibi() -> None:
    pos = np.arange(6)
    seq = np.zeros(6, dtype=np.int32)
    causal = np.isfinite(ubatch_mask(pos, seq, causal=True))
    assert (causal == np.tril(np.ones((6, 6), bool))).all()
    sym = np.isfinite(ubatch_mask(pos, seq, n_swa=4, swa_type="symmetric"))
    d = np.abs(pos[:, None] - pos[None, :])
    assert (sym == (d <= 2)).all()
    std = np.isfinite(ubatch_mask(pos, seq, causal=True, n_swa=3))
    assert (std == (np.tril(np.ones((6, 6), bool)) & (pos[:, None] - pos[None, :] < 3))).all()
    ali = ubatch_mask(pos, seq, alibi=True)
    np.testing.assert_array_equal(ali, -d.astype(np.float32))
    with pytest.raises(LlamapyError, match="sliding-window type"):
        ubatch_mask(pos, seq, n_swa=2, swa_type="chunked")


def test_encoder_memory_has_no_cache() -> None:
    from types import SimpleNamespace

    hp = SimpleNamespace(
        n_layer=2, n_embd_head_k=16, n_embd_head_v=16, causal_attn=False, has_swa=False,
        n_embd_k_gqa=lambda il: 32, n_embd_v_gqa=lambda il: 32, is_swa=lambda il: False,
    )  # fmt: skip
    mem = Memory(hp, 64, 16)
    assert mem.caches == [] and mem.nbytes == 0
    assert mem.seq_pos_max(0) == -1 and mem.seq_rm(0) is True
    assert mem.place(np.arange(4), np.ones(4, np.uint64)) == []
