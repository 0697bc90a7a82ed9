"""An MTP request on a model without MTP layers, over HTTP (issue 30, bad input): in router mode a preset
table asks ``spec-type = "mtp"`` of a plain llama file. The request for that model is a 4xx (424, the
router's "failed to load", naming MTP) in OpenAI's error shape through the official client, quickly and
every time; the model next to it, the same file without the spec type, keeps answering.
(``llamapy serve --spec-type mtp`` on such a file exits 1 before listening: tests/server/test_spec_ngram.py;
``Llama(draft_model="mtp")``: :class:`MtpError`, tests/generation/test_spec_mtp.py.)"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import pytest

from llamapy.cli import build_parser
from llamapy.cli.serve import make_app
from tests.hub.conftest import tiny_with_vocab
from tests.server.conftest import serve_app

pytestmark = pytest.mark.slow


def test_mtp_on_a_model_without_mtp_layers_is_a_4xx_and_the_server_keeps_serving(tmp_path: Path) -> None:
    model = tiny_with_vocab(tmp_path / "plain.gguf", seed=1)
    preset = tmp_path / "models.toml"
    preset.write_text(f'[plain]\nmodel = "{model}"\n\n[drafted]\nmodel = "{model}"\nspec-type = "mtp"\n')
    args = build_parser().parse_args(
        ["serve", "--models-preset", str(preset), "-c", "256", "-np", "1", "--no-warmup", "--no-webui"]
    )
    url, server, thread = serve_app(make_app(args, [], args.model))
    oai = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)
    try:
        for _ in range(2):  # the error each time (not a hang, not a second load)
            t0 = time.perf_counter()
            with pytest.raises(openai.APIStatusError) as e:
                oai.completions.create(model="drafted", prompt="Hello", max_tokens=4, temperature=0)
            dt = time.perf_counter() - t0
            assert 400 <= e.value.status_code < 500, e.value
            assert "MTP" in e.value.message and isinstance(e.value.body, dict), e.value.body
            assert dt < 30, dt  # (a load that fails: well under a second once the model is read)
            print(f"MTP on a plain model: HTTP {e.value.status_code} in {dt:.2f} s")
        r = oai.completions.create(model="plain", prompt="Hello", max_tokens=4, temperature=0)
        assert r.choices[0].text is not None and r.usage.completion_tokens > 0
        states = {m["id"]: m["status"] for m in httpx.get(url + "/v1/models").json()["data"]}
        assert states["drafted"]["value"] == "failed" and "MTP" in states["drafted"]["error"]
        assert states["plain"]["value"] == "loaded"
    finally:
        server.should_exit = True
        thread.join(10)
