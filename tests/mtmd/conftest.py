from __future__ import annotations

import pytest

from tests.mtmd import convert


@pytest.fixture(scope="session")
def gemma3_vlm(tmp_path_factory: pytest.TempPathFactory) -> convert.TinyVLM:
    """A tiny random Gemma3ForConditionalGeneration (64 px images, 8 px patches, 16 image tokens)."""
    return convert.make_gemma3(tmp_path_factory.mktemp("gemma3-vlm"))


@pytest.fixture(scope="session")
def idefics3_vlm(tmp_path_factory: pytest.TempPathFactory) -> convert.TinyVLM:
    """A tiny random Idefics3ForConditionalGeneration (SmolVLM: 64 px, 8 px patches, shuffle 2: 16 tokens)."""
    return convert.make_idefics3(tmp_path_factory.mktemp("idefics3-vlm"))


@pytest.fixture(scope="session")
def llava_vlm(tmp_path_factory: pytest.TempPathFactory) -> convert.TinyVLM:
    """A tiny random LlavaForConditionalGeneration (CLIP: 32 px, 8 px patches, 3 layers; mlp projector)."""
    return convert.make_llava(tmp_path_factory.mktemp("llava-vlm"))
