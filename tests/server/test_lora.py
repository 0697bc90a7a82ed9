"""LoRA adapters in the server over a real socket: GET/POST /lora-adapters, a per-request ``lora`` list,
hot swap changing the output, the same output as the API with the adapter, and bad requests as 400s."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from llamapy.model import Model
from llamapy.server.app import ServerSettings
from llamapy.server.backend import ContextBackend
from tests.model.lora_files import random_pairs, write_lora
from tests.server.conftest import start_live, stop_live, wait_ready

PROMPT = "The capital of France is"


def _adapter(model_path, path) -> str:
    m = Model.load(model_path)
    names = [f"blk.{il}.{n}" for il in range(0, 30, 3) for n in ("attn_q.weight", "ffn_down.weight")]
    w = {n: np.zeros(m.impl.w[n].shape, np.float32) for n in names}
    return str(write_lora(path, "llama", random_pairs(w, names, rank=8, seed=3, s=1.0), alpha=16.0))


@pytest.fixture(scope="module")
def lora_srv(smollm2_path, tmp_path_factory):
    lora = _adapter(smollm2_path, tmp_path_factory.mktemp("lora") / "a.gguf")
    backend = ContextBackend(
        smollm2_path, n_ctx=512, n_seq_max=2, n_batch=64, n_ubatch=64, loras=[(lora, 0.0)]
    )
    live, thread = start_live(ServerSettings(model_path=str(smollm2_path)), backend)
    wait_ready(live.base_url, 60)
    yield live, lora
    stop_live(live, thread)


def _complete(base: str, **kw) -> str:
    body = dict(prompt=PROMPT, n_predict=8, temperature=0, **kw)
    r = httpx.post(base + "/completion", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["content"]


def test_hot_swap_and_per_request_scales(lora_srv, smollm2_path):
    live, lora = lora_srv
    base = live.base_url
    info = httpx.get(base + "/lora-adapters").json()
    assert info == [{"id": 0, "path": lora, "scale": 0.0}]
    plain = _complete(base)
    on = _complete(base, lora=[{"id": 0, "scale": 1.0}])  # this request only
    assert on != plain
    assert _complete(base) == plain  # the global scale is still 0 (and the cache did not leak)
    r = httpx.post(base + "/lora-adapters", json=[{"id": 0, "scale": 1.0}])
    assert r.status_code == 200 and r.json()[0]["scale"] == 1.0
    assert httpx.get(base + "/lora-adapters").json()[0]["scale"] == 1.0
    assert _complete(base) == on
    assert _complete(base, lora=[{"id": 0, "scale": 0}]) == plain
    httpx.post(base + "/lora-adapters", json=[{"id": 0, "scale": 0.0}])
    # the API with the adapter gives the same text
    from llamapy import Llama

    llm = Llama(str(smollm2_path), lora_path=lora, n_ctx=512, verbose=False)
    assert llm.create_completion(PROMPT, max_tokens=8, temperature=0)["choices"][0]["text"] == on


@pytest.mark.parametrize(
    "body, match",
    [
        ([{"id": 1, "scale": 1.0}], "no LoRA adapter with id 1"),
        ([{"id": 0, "scale": "x"}], "finite number"),
        ([{"id": 0, "scale": 1.0, "extra": 1}], "must be an object"),
        ({"id": 0}, "must be a list"),
    ],
)
def test_bad_lora_lists_are_400(lora_srv, body, match):
    live, _ = lora_srv
    r = httpx.post(live.base_url + "/lora-adapters", json=body)
    assert r.status_code == 400 and match in r.json()["error"]["message"], r.text
    r = httpx.post(live.base_url + "/completion", json=dict(prompt="x", n_predict=1, lora=body))
    assert r.status_code == 400 and "lora" in r.json()["error"]["message"], r.text


def test_adapter_for_another_model_is_refused_at_start(smollm2_path, tmp_path):
    from llamapy.model.lora import LoraError

    bad = write_lora(
        tmp_path / "bad.gguf", "qwen2", {"blk.0.attn_q.weight": (np.zeros((4, 576)), np.zeros((576, 4)))}
    )
    with pytest.raises(LoraError, match="architecture 'qwen2'"):
        ContextBackend(smollm2_path, n_ctx=256, loras=[(str(bad), 1.0)])
