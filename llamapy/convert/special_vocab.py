"""Special tokens of a Hugging Face tokenizer as llama.cpp's converter writes them (gguf-py's
``SpecialVocab``, 0.3.36): the merges, the special token ids, the ``add_*_token`` flags, the chat
template and the normalizer flags, read from ``tokenizer.json`` (its merges, normalizer and
post-processor), ``tokenizer_config.json``, ``chat_template.jinja`` / ``.json`` and ``config.json``.

The post-processor decides the ``add_*`` flags first (ByteLevel: no BOS/EOS; RobertaProcessing: all;
TemplateProcessing: what its single and pair templates put around the text), then
``tokenizer_config.json`` fills what it left unset. Ids come from the added tokens whose content is
the config's ``<type>_token``, then from ``config.json``'s ``<type>_token_id``; the first found wins
and ids past ``n_vocab`` are ignored."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

_TYPES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _special_id(entry: dict[str, Any]) -> Any:
    return entry.get("SpecialToken", {}).get("id")


def _merges(raw: Any) -> list[str]:
    """tokenizer.json's merges: "a b" strings, or [a, b] pairs (spaces inside encoded as U+0120)."""
    if not isinstance(raw, list) or not raw:
        return []
    if isinstance(raw[0], str):
        return raw
    if isinstance(raw[0], list) and len(raw[0]) == 2 and isinstance(raw[0][0], str):
        return [
            " ".join("".join(chr(ord(c) + 256) if c == " " else c for c in part) for part in pair)
            for pair in raw
        ]
    raise ValueError("Unknown tokenizer merges format")


def _merges_txt(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    if lines and lines[0].strip().startswith("#"):
        lines = lines[1:]
    return [f"{p[0]} {p[1]}" for p in (line.split(None, 3) for line in lines) if len(p) == 2]


class SpecialVocab:
    """``SpecialVocab(path, load_merges, special_token_types, n_vocab)`` then ``add_to_gguf(writer)``."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        load_merges: bool = False,
        special_token_types: Iterable[str] | None = None,
        n_vocab: int | None = None,
    ) -> None:
        self.special_token_ids: dict[str, int] = {}
        self.add_special_token: dict[str, bool] = {}
        self.n_vocab = n_vocab
        self.load_merges = load_merges
        self.merges: list[str] = []
        self.chat_template: str | Sequence[Mapping[str, str]] | None = None
        self.normalizer_lowercase: bool | None = None
        self.normalizer_strip_accents: bool | None = None
        self.special_token_types = tuple(special_token_types if special_token_types is not None else _TYPES)
        path = Path(path)
        self._load_tokenizer(path)
        config = _read_json(path / "config.json")
        if config is not None:
            for typ in self.special_token_types:
                tid = config.get(f"{typ}_token_id")
                if tid is None and "text_config" in config:
                    tid = config["text_config"].get(f"{typ}_token_id")
                self._set_special_token(typ, tid)
        if load_merges and not self.merges and (path / "merges.txt").is_file():
            self.merges = _merges_txt(path / "merges.txt")

    def add_to_gguf(self, gw: Any, quiet: bool = False) -> None:
        """The keys, in gguf-py's order (``quiet``: kept for its signature; nothing is logged)."""
        if self.merges:
            gw.add_token_merges(self.merges)
        for typ, tid in self.special_token_ids.items():
            if (add := getattr(gw, f"add_{typ}_token_id", None)) is not None:
                add(tid)
        for typ, value in self.add_special_token.items():
            if (add := getattr(gw, f"add_add_{typ}_token", None)) is not None:
                add(value)
        if self.chat_template is not None:
            gw.add_chat_template(self.chat_template)
        if self.normalizer_lowercase is not None:
            gw.add_bool("tokenizer.ggml.normalizer.lowercase", self.normalizer_lowercase)
        if self.normalizer_strip_accents is not None:
            gw.add_bool("tokenizer.ggml.normalizer.strip_accents", self.normalizer_strip_accents)

    def _set_special_token(self, typ: str, tid: Any) -> None:
        """The first id found for ``typ`` (ints under ``n_vocab`` only)."""
        if not isinstance(tid, int):
            return
        if tid < 0:
            raise ValueError(f"invalid value for special token type {typ}: {tid}")
        if (self.n_vocab is None or tid < self.n_vocab) and typ not in self.special_token_ids:
            self.special_token_ids[typ] = tid

    def _parse_normalizer(self, norm: dict[str, Any]) -> None:
        kind = norm.get("type")
        if kind == "Lowercase":
            self.normalizer_lowercase = True
        elif kind == "StripAccents":
            self.normalizer_strip_accents = True
        elif kind == "BertNormalizer":
            self.normalizer_lowercase = norm.get("lowercase", self.normalizer_lowercase)
            self.normalizer_strip_accents = norm.get("strip_accents", self.normalizer_strip_accents)
        elif kind == "Sequence":
            for n in norm.get("normalizers", []):
                self._parse_normalizer(n)

    def _load_tokenizer(self, path: Path) -> None:
        tokenizer = _read_json(path / "tokenizer.json")
        cfg = _read_json(path / "tokenizer_config.json")
        added = []
        if tokenizer is not None:
            if self.load_merges:
                self.merges = _merges(tokenizer.get("model", {}).get("merges"))
            if norm := tokenizer.get("normalizer"):
                self._parse_normalizer(norm)
            added = tokenizer.get("added_tokens", {})
        if tokenizer:
            self._post_processor(tokenizer.get("post_processor"), cfg)
        if not cfg:
            return
        self._chat_template(path, cfg)
        for typ in self.special_token_types:
            flag = cfg.get(f"add_{typ}_token")
            if isinstance(flag, bool):
                self.add_special_token.setdefault(typ, flag)  # the post-processor's wins
            entry = cfg.get(f"{typ}_token")
            content = entry.get("content") if isinstance(entry, dict) else entry
            if isinstance(content, str):
                self._set_special_token(
                    typ, next((a.get("id") for a in added if a.get("content") == content), None)
                )

    def _chat_template(self, path: Path, cfg: dict[str, Any]) -> None:
        alt: Any = None
        if (path / "chat_template.jinja").is_file():
            alt = (path / "chat_template.jinja").read_text(encoding="utf-8")
            if extra := list((path / "additional_chat_templates").glob("*.jinja")):
                alt = [{"name": "default", "template": alt}]
                alt += [{"name": p.stem, "template": p.read_text(encoding="utf-8")} for p in extra]
        elif (path / "chat_template.json").is_file():
            alt = _read_json(path / "chat_template.json").get("chat_template")
        template = cfg.get("chat_template", alt)
        if template is None or isinstance(template, (str, list)):
            self.chat_template = template

    def _post_processor(self, post: dict[str, Any] | None, cfg: dict[str, Any] | None) -> None:
        """The add_bos/eos/sep flags the post-processor implies; ``cfg`` (tokenizer_config.json) gets the
        special tokens it names where the config has none, as gguf-py does."""
        c = cfg or {}
        bos, cls, eos, sep = (c.get(f"{t}_token") for t in ("bos", "cls", "eos", "sep"))
        if not bos and cls and cfg:
            cfg["bos_token"] = bos = cls
        if not eos and sep and cfg:
            cfg["eos_token"] = eos = sep
        for proc in (post or {}).get("processors", [post] if post else []):
            kind = proc.get("type")
            if kind == "ByteLevel":
                self.add_special_token.setdefault("bos", False)
                self.add_special_token.setdefault("eos", False)
            elif kind == "RobertaProcessing":
                self.add_special_token.update(bos=True, eos=True, sep=True)
                if not cls and cfg:
                    cfg["cls_token"] = cls = proc.get("cls", [bos])[0]
                if not sep and cfg:
                    cfg["sep_token"] = sep = proc.get("sep", [eos])[0]
            elif kind == "TemplateProcessing":
                bos, cls, eos, sep = self._template(proc, cfg, bos, cls, eos, sep)

    def _template(self, proc: dict[str, Any], cfg: dict[str, Any] | None, bos: Any, cls: Any, eos: Any,
                  sep: Any) -> tuple[Any, Any, Any, Any]:  # fmt: skip
        """TemplateProcessing, crudely as gguf-py parses it: a special token first in the single template
        is BOS (or CLS), one last is EOS (a different EOS moving to EOT / EOM); a special token between
        the pair's A and B means add_sep."""
        single, pair = proc.get("single", []), proc.get("pair", [])
        first = last = None
        if len(single) > 1:
            if first := _special_id(single[0]):
                if not cfg:
                    bos = first
                elif first not in (bos, cls):
                    if not bos:
                        cfg["bos_token"] = bos = first
                    if not cls:
                        cfg["cls_token"] = cls = first
                self.add_special_token["bos"] = first in (bos, cls)
            if last := _special_id(single[-1]):
                if not cfg:
                    eos = last
                elif last != eos:
                    for extra in ("eot", "eom"):
                        if extra not in self.special_token_types:
                            self.special_token_types += (extra,)
                            cfg[f"{extra}_token"] = eos
                            break
                    cfg["eos_token"] = eos = last
                self.add_special_token["eos"] = last == eos
        if not pair:
            return bos, cls, eos, sep
        start = 1 if first and _special_id(pair[0]) == first else 0
        stop = -1 if last and _special_id(pair[-1]) == last else None
        pair = pair[start:stop]
        if not pair:
            return bos, cls, eos, sep
        a, b = pair[0].get("Sequence", {}).get("id"), pair[-1].get("Sequence", {}).get("id")
        if a != "A" or b != "B" or not (middle := pair[1:-1]):
            return bos, cls, eos, sep
        add_sep = False
        if (entry := _special_id(middle[0])) and entry in (sep, eos) and not last:
            add_sep = True
        if len(middle) == 2 and (entry := _special_id(middle[1])) and entry in (sep, eos):
            add_sep = True
        self.add_special_token["sep"] = add_sep
        if add_sep and not sep and cfg:
            cfg["sep_token"] = eos
        return bos, cls, eos, sep
