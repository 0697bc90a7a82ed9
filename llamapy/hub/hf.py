"""Hugging Face Hub references (``user/repo[:quant]``) and their downloads, through ``huggingface_hub``.

The file is picked as llama.cpp's ``common_download_get_hf_plan``: with a quant tag, the first model GGUF
whose name contains ``TAG.`` or ``TAG-`` (any case); without one, ``Q4_K_M`` first, then ``Q8_0``, then the
first model GGUF. A split model (``-00001-of-00003.gguf``) brings all its parts, and an ``mmproj*.gguf`` in
the same folder comes along (the one closest in bits to the model).

``huggingface_hub`` does the HTTP: its cache layout, resumable downloads, ``HF_TOKEN``, ``HF_ENDPOINT``,
``HF_HUB_OFFLINE``. ``HF_ENDPOINT`` and the cache folder are read at each call (``huggingface_hub`` reads
them once, at import). A file that was just downloaded is checked against its sha256 (the etag of an LFS
file); a mismatch removes it and is an error.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import field
from pathlib import Path

from .._dataclass import dataclass
from .common import ModelFetchError

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_TAGS = ("Q4_K_M", "Q8_0")
_REF = re.compile(r"^([A-Za-z0-9][\w.-]*)/([\w.-]+?)(?::([\w.-]+))?$")
_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)
_SIDECARS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")


class HubError(ModelFetchError):
    """A Hugging Face reference could not be resolved or downloaded (bad ref, unknown repo, no matching
    file, offline and not cached, a corrupted download)."""


class NoMatchingFileError(HubError, ValueError):
    """No file (or more than one) of the repo matches the requested name or quant."""

    def __init__(self, message: str, repo_id: str, gguf_files: list[str]) -> None:
        listing = "\n".join(f"  - {f}" for f in gguf_files) if gguf_files else "  (none)"
        super().__init__(f"{message}; GGUF files in {repo_id}:\n{listing}")
        self.repo_id, self.gguf_files = repo_id, gguf_files


@dataclass(frozen=True)
class HFRef:
    repo: str  # user/repo
    tag: str = ""  # quant, e.g. Q4_K_M ("" = the default choice)

    def __str__(self) -> str:
        return f"{self.repo}:{self.tag}" if self.tag else self.repo


@dataclass
class HFModel:
    """A resolved and downloaded model: its files in the cache (the first part opens a split model)."""

    ref: HFRef
    files: list[str]  # repo paths of the model's parts
    paths: list[Path] = field(default_factory=list)
    mmproj_file: str | None = None
    mmproj: Path | None = None

    @property
    def path(self) -> Path:
        return self.paths[0]

    @property
    def name(self) -> str:
        """``user/repo:QUANT`` with the quant read from the file name."""
        tag = split_info(self.files[0])[1]
        return f"{self.ref.repo}:{tag}" if tag else self.ref.repo


def looks_like_ref(s: str) -> bool:
    """``user/repo`` or ``user/repo:quant`` (not a local path: no leading ``.``/``/``/``~``, not ``.gguf``)."""
    return bool(_REF.match(s)) and not s.lower().endswith(".gguf") and not s.startswith((".", "~"))


def parse_ref(s: str) -> HFRef:
    m = _REF.match(s.strip())
    if not m:
        raise HubError(f"invalid Hugging Face repo {s!r}: expected user/repo[:quant]")
    return HFRef(f"{m.group(1)}/{m.group(2)}", m.group(3) or "")


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def hub_cache_dir() -> Path:
    """``$HF_HUB_CACHE``, ``$HF_HOME/hub`` or ``~/.cache/huggingface/hub`` (huggingface_hub's cache)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "huggingface" / "hub"


def offline_env() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


# ---------------------------------------------------------------------------------------------------
# choosing files (llama.cpp's common/download.cpp)


def split_info(path: str) -> tuple[str, str, int, int]:
    """(prefix with the tag, TAG upper-case, split index, split count) of a GGUF file name."""
    prefix = path[:-5] if path.lower().endswith(".gguf") else path
    index = count = 1
    m = _SPLIT.match(prefix)
    if m:
        prefix, index, count = m.group(1), int(m.group(2)), int(m.group(3))
    t = _TAG.search(prefix)
    return prefix, (t.group(1).upper() if t else ""), index, count


def _quant_bits(path: str) -> int:
    tag = split_info(path)[1]
    m = re.search(r"\d+", tag)
    return int(m.group()) if m else 0


def is_model_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name.lower().endswith(".gguf") and not any(s in name for s in _SIDECARS)


def gguf_files(files: list[str]) -> list[str]:
    return [f for f in files if f.lower().endswith(".gguf")]


def find_best_model(files: list[str], tag: str) -> str | None:
    for t in [tag] if tag else list(DEFAULT_TAGS):
        pat = re.compile(re.escape(t) + r"[.-]", re.IGNORECASE)
        for f in files:
            if is_model_file(f) and pat.search(f):
                _, _, index, count = split_info(f)
                if count > 1 and index != 1:
                    continue
                return f
    if not tag:
        for f in files:
            if is_model_file(f):
                _, _, index, count = split_info(f)
                if count <= 1 or index == 1:
                    return f
    return None


def split_parts(files: list[str], primary: str) -> list[str]:
    prefix, _, _, count = split_info(primary)
    if count <= 1:
        return [primary]
    parts = sorted(f for f in files if split_info(f)[0] == prefix and split_info(f)[3] == count)
    if len(parts) != count:
        raise HubError(f"{primary}: a split model of {count} parts, but the repo has {len(parts)} of them")
    return parts


def find_best_mmproj(files: list[str], model: str) -> str | None:
    """The ``mmproj`` GGUF in the model's folder (or the nearest above it), closest in bits to the model."""
    model_dir = model.split("/")[:-1]
    bits = _quant_bits(model)
    best: tuple[int, int] | None = None
    best_f = None
    for f in files:
        if not f.lower().endswith(".gguf") or "mmproj" not in f:
            continue
        sib_dir = f.split("/")[:-1]
        if model_dir[: len(sib_dir)] != sib_dir:
            continue
        key = (-len(sib_dir), abs(_quant_bits(f) - bits))
        if best is None or key < best:
            best, best_f = key, f
    return best_f


# ---------------------------------------------------------------------------------------------------
# listing and downloading through huggingface_hub


def _repo_folder(repo: str, cache_dir: Path) -> Path:
    return cache_dir / ("models--" + repo.replace("/", "--"))


def cached_repo_files(repo: str, cache_dir: Path | None = None) -> list[str]:
    """The files of ``repo``'s cached ``main`` snapshot (empty when it was never downloaded)."""
    folder = _repo_folder(repo, cache_dir or hub_cache_dir())
    try:
        commit = (folder / "refs" / "main").read_text().strip()
    except OSError:
        return []
    snap = folder / "snapshots" / commit
    if not snap.is_dir():
        return []
    return sorted(p.relative_to(snap).as_posix() for p in snap.rglob("*") if p.is_file())


def _hub_error(e: Exception, repo: str, what: str) -> HubError:
    from huggingface_hub import errors

    where = endpoint()
    if isinstance(e, errors.GatedRepoError):
        return HubError(
            f"{repo} on {where} is gated: accept its terms and give a token (--hf-token or HF_TOKEN)"
        )
    if isinstance(e, errors.RepositoryNotFoundError):
        return HubError(
            f"repository {repo} not found on {where} (or it is private: give a token with --hf-token or HF_TOKEN)"
        )
    if isinstance(e, errors.RevisionNotFoundError):
        return HubError(f"{repo} on {where} has no branch main")
    if isinstance(e, errors.LocalEntryNotFoundError):  # (a subclass of EntryNotFoundError)
        return HubError(
            f"{what} of {repo} is not in the cache {hub_cache_dir()} and {where} cannot be reached ({e})"
        )
    if isinstance(e, errors.EntryNotFoundError):
        return HubError(f"{what} not found in {repo} on {where}")
    return HubError(f"{what or repo} from {where}: {type(e).__name__}: {e}")


class HubUnreachableError(HubError):
    """The Hub could not be reached (and the repo is not in the cache)."""


def repo_files(repo: str, token: str | None = None, offline: bool = False) -> list[str]:
    """The repo's file list: from the Hub, or (offline, or the Hub unreachable) from the cached snapshot."""
    return _repo_files(repo, token, offline)[0]


def _repo_files(repo: str, token: str | None, offline: bool) -> tuple[list[str], bool]:
    """(files, from the cache because the Hub could not be reached)."""
    cached = cached_repo_files(repo)
    if offline or offline_env():
        if not cached:
            raise HubError(
                f"{repo} is not in the cache {hub_cache_dir()} (offline mode); run `llamapy pull {repo}` while online"
            )
        return cached, False
    from huggingface_hub import HfApi, errors

    try:
        why = unreachable(endpoint())  # at once, not after huggingface_hub's five retries (~24 s)
        if why is not None:
            raise ConnectionError(why)
        return sorted(HfApi(endpoint=endpoint(), token=token).list_repo_files(repo)), False
    except (errors.RepositoryNotFoundError, errors.GatedRepoError, errors.RevisionNotFoundError) as e:
        raise _hub_error(e, repo, "") from None
    except Exception as e:  # network down: the cached snapshot, as llama.cpp
        if cached:
            print(
                f"llamapy: {endpoint()} cannot be reached ({type(e).__name__}); using the cached files of {repo}",
                file=sys.stderr,
                flush=True,
            )
            return cached, True
        raise HubUnreachableError(f"cannot list {repo} on {endpoint()}: {type(e).__name__}: {e}") from None


PROBE_SECONDS = 3.0
_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def unreachable(url: str, timeout: float = PROBE_SECONDS) -> str | None:
    """Why no TCP connection to ``url``'s host opens within ``timeout`` s (refused, no such host, no
    answer), or None when it does (or a proxy is set: only the proxy knows)."""
    import socket
    from urllib.parse import urlsplit

    if any(os.environ.get(k) for k in _PROXY_VARS):
        return None
    u = urlsplit(url)
    if not u.hostname:
        return None
    try:
        socket.create_connection(
            (u.hostname, u.port or (443 if u.scheme == "https" else 80)), timeout
        ).close()
    except OSError as e:
        return f"{u.hostname}: {e.strerror or type(e).__name__}"
    return None


def plan(ref: HFRef, hf_file: str | None, files: list[str], mmproj: bool = True) -> HFModel:
    """Which files of ``files`` make the model ``ref`` (``hf_file`` names one exactly, any case)."""
    ggufs = gguf_files(files)
    if hf_file:
        primary = next((f for f in files if f.lower() == hf_file.lower()), None)
        if primary is None:
            raise NoMatchingFileError(f"file {hf_file!r} not found in {ref.repo}", ref.repo, ggufs)
    else:
        primary = find_best_model(files, ref.tag)
        if primary is None:
            what = f"no GGUF file matching the quant {ref.tag!r}" if ref.tag else "no model GGUF file"
            raise NoMatchingFileError(f"{what} in {ref.repo}", ref.repo, ggufs)
    model = HFModel(ref, split_parts(files, primary))
    if mmproj:
        model.mmproj_file = find_best_mmproj(files, primary)
    return model


@contextlib.contextmanager
def _progress(quiet: bool) -> Iterator[None]:
    """huggingface_hub's tqdm bars on stderr, only when stderr is a terminal and not ``quiet``."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    was_disabled = are_progress_bars_disabled()
    show = not quiet and sys.stderr.isatty()
    if not show:
        disable_progress_bars()
    try:
        yield
    finally:
        if not show and not was_disabled:
            enable_progress_bars()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _verify(path: Path, repo: str, filename: str) -> None:
    """A fresh download of an LFS file (its blob is named by its sha256) must have that sha256."""
    blob = path.resolve()
    expected = blob.name
    if not re.fullmatch(r"[0-9a-f]{64}", expected):
        return  # a small non-LFS file: its etag is a git hash, size is checked by huggingface_hub
    got = _sha256(blob)
    if got != expected:
        with contextlib.suppress(OSError):
            blob.unlink()
        with contextlib.suppress(OSError):
            path.unlink()
        raise HubError(
            f"corrupted download of {filename} from {repo} on {endpoint()}: sha256 {got} but the Hub says "
            f"{expected}; the file was removed, run the command again"
        )


def fetch_file(
    repo: str,
    filename: str,
    token: str | None = None,
    offline: bool = False,
    quiet: bool = False,
    cache_dir: str | os.PathLike | None = None,
    local_dir: str | os.PathLike | None = None,
) -> Path:
    """One file of ``repo`` into the cache (once; a cut connection resumes) and its path there (or in
    ``local_dir``, a plain copy, when given)."""
    from huggingface_hub import errors, hf_hub_download, try_to_load_from_cache

    cache = Path(cache_dir) if cache_dir is not None else hub_cache_dir()
    offline = offline or offline_env()
    if local_dir is not None:
        cached: object = str(Path(local_dir) / filename) if (Path(local_dir) / filename).is_file() else None
    else:
        cached = try_to_load_from_cache(repo, filename, cache_dir=cache)
    was_cached = isinstance(cached, str) and Path(cached).is_file()
    if was_cached and offline:
        return Path(str(cached))
    if not quiet and not sys.stderr.isatty() and not was_cached:
        print(f"llamapy: downloading {filename} from {repo}", file=sys.stderr, flush=True)
    try:
        with _progress(quiet):
            path = Path(
                hf_hub_download(
                    repo,
                    filename,
                    cache_dir=cache,
                    local_dir=local_dir,
                    endpoint=endpoint(),
                    token=token,
                    local_files_only=offline,
                )  # fmt: skip
            )
    except errors.LocalEntryNotFoundError as e:
        if offline:
            raise HubError(
                f"{filename} of {repo} is not in the cache {cache} (offline mode); "
                f"run `llamapy pull {repo}` while online"
            ) from None
        raise _hub_error(e, repo, filename) from None
    except (errors.HfHubHTTPError, errors.EntryNotFoundError, errors.RepositoryNotFoundError) as e:
        raise _hub_error(e, repo, filename) from None
    except OSError:
        raise
    except Exception as e:  # connection errors of the HTTP client, consistency checks
        raise HubError(
            f"download of {filename} from {repo} on {endpoint()} failed: {type(e).__name__}: {e}"
        ) from None
    if not was_cached or path.resolve() != Path(str(cached)).resolve():  # new bytes: check them
        _verify(path, repo, filename)
    return path


def match_glob(repo: str, pattern: str, files: list[str]) -> str:
    """The one file of ``files`` matching the glob ``pattern`` (fnmatch, as llama-cpp-python; any case when
    nothing matches with the case given); none or several is a :class:`NoMatchingFileError`."""
    import fnmatch

    found = [f for f in files if fnmatch.fnmatchcase(f, pattern)]
    if not found:
        found = [f for f in files if fnmatch.fnmatchcase(f.lower(), pattern.lower())]
    if len(found) > 1:  # the parts of one split model are one model: its first part
        firsts = {f for f in found if split_info(f)[3] > 1 and split_info(f)[2] == 1}
        if (
            firsts
            and len(firsts) == 1
            and all(split_info(f)[0] == split_info(next(iter(firsts)))[0] for f in found)
        ):
            found = sorted(firsts)
    if not found:
        raise NoMatchingFileError(f"no file of {repo} matches {pattern!r}", repo, gguf_files(files))
    if len(found) > 1:
        raise NoMatchingFileError(
            f"{len(found)} files of {repo} match {pattern!r} ({', '.join(found)}); give a narrower pattern",
            repo,
            gguf_files(files),
        )
    return found[0]


def pretrained(
    repo_id: str,
    filename: str,
    additional_files: list[str] | None = None,
    local_dir: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    token: str | None = None,
    offline: bool = False,
) -> tuple[Path, list[Path]]:
    """``Llama.from_pretrained``'s files: the model matching the glob ``filename`` (all its parts when it is
    split) and each of ``additional_files`` (globs too); returns (model path, additional paths)."""
    offline = offline or offline_env()
    if not offline:
        files = repo_files(repo_id, token)
    elif local_dir is not None:
        files = sorted(p.relative_to(local_dir).as_posix() for p in Path(local_dir).rglob("*") if p.is_file())
    else:
        files = cached_repo_files(repo_id, Path(cache_dir) if cache_dir is not None else None)
        if not files:
            raise HubError(f"{repo_id} is not in the cache (offline mode)")
    parts = split_parts(files, match_glob(repo_id, filename, files))
    extra_files = [match_glob(repo_id, pat, files) for pat in additional_files or []]  # all checked first
    paths = [fetch_file(repo_id, f, token, offline, False, cache_dir, local_dir) for f in parts]
    extra = [fetch_file(repo_id, f, token, offline, False, cache_dir, local_dir) for f in extra_files]
    return paths[0], extra


def download(
    ref: str | HFRef,
    hf_file: str | None = None,
    token: str | None = None,
    offline: bool = False,
    mmproj: bool = True,
    quiet: bool = False,
) -> HFModel:
    """Resolve ``user/repo[:quant]`` (or ``hf_file``) and download the model's files (all parts of a split
    model, and its mmproj unless ``mmproj`` is False) into huggingface_hub's cache."""
    r = parse_ref(ref) if isinstance(ref, str) else ref
    offline = offline or offline_env()
    files, unreachable = _repo_files(r.repo, token, offline)
    offline = offline or unreachable  # the Hub is down: the cached files, without asking again
    try:
        model = plan(r, hf_file, files, mmproj)
    except NoMatchingFileError as e:
        if not offline:
            raise
        listing = ", ".join(e.gguf_files) or "none"
        raise HubError(
            f"{hf_file or r} is not in the cache {hub_cache_dir()} (offline mode; cached GGUF files of {r.repo}: "
            f"{listing}); run `llamapy pull {r}` while online"
        ) from None
    model.paths = [fetch_file(r.repo, f, token, offline, quiet) for f in model.files]
    if model.mmproj_file:
        model.mmproj = fetch_file(r.repo, model.mmproj_file, token, offline, quiet)
    return model
