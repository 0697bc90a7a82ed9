"""``llamapy run/chat --mmproj F --image IMG`` (llama-mtmd-cli's job), in-process."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from llamapy.cli import main
from tests.mtmd import convert


@pytest.fixture(scope="module")
def image_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("img") / "cat.png"
    Image.fromarray(np.random.default_rng(5).integers(0, 256, (48, 60, 3), dtype=np.uint8)).save(p)
    return p


def _base(vlm: convert.TinyVLM) -> list[str]:
    return ["-m", str(vlm.text_gguf()), "-c", "256", "-b", "64", "-ub", "64", "--temp", "0", "-n", "3"]


def _n_pos(vlm: convert.TinyVLM, text: str) -> int:
    from llamapy.model.model import Model
    from llamapy.mtmd import Bitmap, MtmdContext

    mt = MtmdContext(vlm.mmproj_gguf(), Model.load(vlm.text_gguf()))
    chunks = mt.tokenize(text, [Bitmap(np.zeros((8, 8, 3), np.uint8))])
    assert sum(c.n_tokens for c in chunks if type(c).__name__ == "ImageChunk") == 16
    return sum(c.n_pos for c in chunks)


def test_run_with_an_image(
    gemma3_vlm: convert.TinyVLM, image_file: Path, capfd: pytest.CaptureFixture
) -> None:
    args = [*_base(gemma3_vlm), "--mmproj", str(gemma3_vlm.mmproj_gguf()), "--image", str(image_file)]
    rc = main(["run", *args, "-p", "describe"])
    out, err = capfd.readouterr()
    assert rc == 0, err
    assert f"prompt {_n_pos(gemma3_vlm, '<__media__>describe')} tokens" in err  # the image before the text
    rc = main(["run", *args, "-p", "a <__media__> b"])  # the marker places the image
    out2, err2 = capfd.readouterr()
    assert rc == 0 and f"prompt {_n_pos(gemma3_vlm, 'a <__media__> b')} tokens" in err2


def test_chat_with_an_image(
    gemma3_vlm: convert.TinyVLM,
    image_file: Path,
    capfd: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(f"what is this\n/image {image_file}\nand this\n"))
    rc = main(
        ["chat", *_base(gemma3_vlm), "--mmproj", str(gemma3_vlm.mmproj_gguf()), "--image", str(image_file)]
    )
    out, err = capfd.readouterr()
    assert rc == 0, err
    assert out.count("\n") >= 2 and "goes with the next message" in err


def test_image_errors_are_one_line(
    gemma3_vlm: convert.TinyVLM, image_file: Path, tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    rc = main(["run", *_base(gemma3_vlm), "--image", str(image_file), "-p", "x"])
    assert rc == 1 and "give --mmproj" in capfd.readouterr().err
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    rc = main(
        ["run", *_base(gemma3_vlm), "--mmproj", str(gemma3_vlm.mmproj_gguf()), "--image", str(bad), "-p", "x"]
    )
    err = capfd.readouterr().err
    assert rc == 1 and "bad.png" in err and err.count("error:") == 1 and "Traceback" not in err
    rc = main(["run", *_base(gemma3_vlm), "--mmproj", str(gemma3_vlm.text_gguf()), "-p", "x"])
    assert rc == 1 and "not an mmproj file" in capfd.readouterr().err
