"""gguf-py's ``SpecialVocab`` as llama.cpp 0.3.36 ships it (MIT, the ggml authors), copied because the
``gguf`` package on PyPI lags behind it (post-processor add_bos/eos flags, normalizer flags): special
token ids, ``add_*_token`` flags, merges and the chat template from ``tokenizer.json``,
``tokenizer_config.json``, ``chat_template.jinja``/``.json`` and ``config.json``."""

# ruff: noqa
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

logger = logging.getLogger("llamapy.convert")
logger.setLevel(logging.ERROR)  # its warnings are about the checkpoint, not errors of the conversion

GGUFWriter = Any


class SpecialVocab:
    merges: list[str]
    add_special_token: dict[str, bool]
    special_token_ids: dict[str, int]
    chat_template: str | Sequence[Mapping[str, str]] | None
    normalizer_lowercase: bool | None
    normalizer_strip_accents: bool | None

    def __init__(
        self,
        path: str | os.PathLike[str],
        load_merges: bool = False,
        special_token_types: Iterable[str] | None = None,
        n_vocab: int | None = None,
    ):
        self.special_token_ids = {}
        self.add_special_token = {}
        self.n_vocab = n_vocab
        self.load_merges = load_merges
        self.merges = []
        self.chat_template = None
        self.normalizer_lowercase = None
        self.normalizer_strip_accents = None
        if special_token_types is not None:
            self.special_token_types = special_token_types
        else:
            self.special_token_types = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
        self._load(Path(path))

    def __repr__(self) -> str:
        return "<SpecialVocab with {} merges, special tokens {}, add special tokens {}>".format(
            len(self.merges),
            self.special_token_ids or "unset",
            self.add_special_token or "unset",
        )

    def add_to_gguf(self, gw: GGUFWriter, quiet: bool = False) -> None:
        if self.merges:
            if not quiet:
                logger.info(f"Adding {len(self.merges)} merge(s).")
            gw.add_token_merges(self.merges)
        elif self.load_merges:
            logger.warning("Adding merges requested but no merges found, output may be non-functional.")
        for typ, tokid in self.special_token_ids.items():
            id_handler: Callable[[int], None] | None = getattr(gw, f"add_{typ}_token_id", None)
            if id_handler is None:
                logger.warning(f"No handler for special token type {typ} with id {tokid} - skipping")
                continue
            if not quiet:
                logger.info(f"Setting special token type {typ} to {tokid}")
            id_handler(tokid)
        for typ, value in self.add_special_token.items():
            add_handler: Callable[[bool], None] | None = getattr(gw, f"add_add_{typ}_token", None)
            if add_handler is None:
                logger.warning(f"No handler for add_{typ}_token with value {value} - skipping")
                continue
            if not quiet:
                logger.info(f"Setting add_{typ}_token to {value}")
            add_handler(value)
        if self.chat_template is not None:
            if not quiet:
                logger.info(f"Setting chat_template to {self.chat_template}")
            gw.add_chat_template(self.chat_template)
        if self.normalizer_lowercase is not None:
            if not quiet:
                logger.info(f"Setting normalizer_lowercase to {self.normalizer_lowercase}")
            gw.add_bool("tokenizer.ggml.normalizer.lowercase", self.normalizer_lowercase)
        if self.normalizer_strip_accents is not None:
            if not quiet:
                logger.info(f"Setting normalizer_strip_accents to {self.normalizer_strip_accents}")
            gw.add_bool("tokenizer.ggml.normalizer.strip_accents", self.normalizer_strip_accents)

    def _load(self, path: Path) -> None:
        self._try_load_from_tokenizer_json(path)
        self._try_load_from_config_json(path)
        if self.load_merges and not self.merges:
            self._try_load_merges_txt(path)

    def _try_load_merges_txt(self, path: Path) -> bool:
        merges_file = path / "merges.txt"
        if not merges_file.is_file():
            return False
        with open(merges_file, "r", encoding="utf-8") as fp:
            first_line = next(fp, "").strip()
            if not first_line.startswith("#"):
                fp.seek(0)
                line_num = 0
            else:
                line_num = 1
            merges = []
            for line in fp:
                line_num += 1
                line = line.strip()
                if not line:
                    continue
                parts = line.split(None, 3)
                if len(parts) != 2:
                    logger.warning(f"{merges_file.name}: Line {line_num}: Entry malformed, ignoring")
                    continue
                merges.append(f"{parts[0]} {parts[1]}")
        self.merges = merges
        return True

    def _set_special_token(self, typ: str, tid: Any) -> None:
        if not isinstance(tid, int):
            return
        if tid < 0:
            raise ValueError(f"invalid value for special token type {typ}: {tid}")
        if self.n_vocab is None or tid < self.n_vocab:
            if typ in self.special_token_ids:
                return
            self.special_token_ids[typ] = tid
            return
        logger.warning(
            f"Special token type {typ}, id {tid} out of range, must be under {self.n_vocab} - skipping"
        )

    def _parse_normalizer(self, normalizer: dict) -> None:
        # ref: https://huggingface.co/docs/tokenizers/api/normalizers
        #
        # Extracts normalizer flags from three possible formats:
        # 1. Standalone:           {"type": "Lowercase"}
        # 2. BertNormalizer attrs: {"type": "BertNormalizer", ...}
        # 3. Nested in Sequence:   {"type": "Sequence", "normalizers": [...]}

        normalizer_type = normalizer.get("type")
        if normalizer_type == "Lowercase":
            self.normalizer_lowercase = True
        elif normalizer_type == "StripAccents":
            self.normalizer_strip_accents = True
        elif normalizer_type == "BertNormalizer":
            if "lowercase" in normalizer:
                self.normalizer_lowercase = normalizer["lowercase"]
            if "strip_accents" in normalizer:
                self.normalizer_strip_accents = normalizer["strip_accents"]
        elif normalizer_type == "Sequence":
            for norm in normalizer.get("normalizers", []):
                self._parse_normalizer(norm)

    def _try_load_from_tokenizer_json(self, path: Path) -> bool:
        tokenizer = None
        tokenizer_file = path / "tokenizer.json"
        if tokenizer_file.is_file():
            with open(tokenizer_file, encoding="utf-8") as f:
                tokenizer = json.load(f)
            if self.load_merges:
                merges = tokenizer.get("model", {}).get("merges")
                if isinstance(merges, list) and merges:
                    if isinstance(merges[0], str):
                        self.merges = merges
                    elif (
                        isinstance(merges[0], list) and len(merges[0]) == 2 and isinstance(merges[0][0], str)
                    ):
                        # New format since transformers 4.45 to support spaces in merges
                        # ref: https://github.com/ggml-org/llama.cpp/issues/9692
                        # TODO: internally store as the new format instead of converting to old
                        if any(" " in s for pair in merges for s in pair):
                            logger.warning(f"Spaces in merges detected, encoding as {chr(ord(' ') + 256)!r}")
                        self.merges = [
                            " ".join(
                                [
                                    # ensure the spaces are properly encoded
                                    "".join(chr(ord(c) + 256) if c == " " else c for c in part)
                                    for part in pair
                                ]
                            )
                            for pair in merges
                        ]
                    else:
                        raise ValueError("Unknown tokenizer merges format")
            # Parse normalizer configuration (e.g. Lowercase) into metadata
            if normalizer := tokenizer.get("normalizer"):
                self._parse_normalizer(normalizer)
            added_tokens = tokenizer.get("added_tokens", {})
        else:
            added_tokens = {}
        tokenizer_config = None
        tokenizer_config_file = path / "tokenizer_config.json"
        if tokenizer_config_file.is_file():
            with open(tokenizer_config_file, encoding="utf-8") as f:
                tokenizer_config = json.load(f)
        if tokenizer:
            special_bos = (tokenizer_config or {}).get("bos_token")
            special_cls = (tokenizer_config or {}).get("cls_token")
            special_eos = (tokenizer_config or {}).get("eos_token")
            special_sep = (tokenizer_config or {}).get("sep_token")
            if not special_bos and special_cls and tokenizer_config:
                tokenizer_config["bos_token"] = special_bos = special_cls
            if not special_eos and special_sep and tokenizer_config:
                tokenizer_config["eos_token"] = special_eos = special_sep
            if post_processor := tokenizer.get("post_processor"):
                for processor in post_processor.get("processors", [post_processor]):
                    processor_type = processor.get("type")
                    if processor_type == "ByteLevel":
                        self.add_special_token.setdefault("bos", False)
                        self.add_special_token.setdefault("eos", False)
                    elif processor_type == "RobertaProcessing":
                        self.add_special_token["bos"] = True
                        self.add_special_token["eos"] = True
                        self.add_special_token["sep"] = True
                        if not special_cls and tokenizer_config:
                            special_cls = processor.get("cls", [special_bos])[0]
                            tokenizer_config["cls_token"] = special_cls
                        if not special_sep and tokenizer_config:
                            special_sep = processor.get("sep", [special_eos])[0]
                            tokenizer_config["sep_token"] = special_sep
                        continue
                    # Crude parsing of TemplateProcessing to determine if BOS/SEP/EOS should be added
                    # Only works with simple templates, **will** get it wrong on unusual sequences
                    elif processor_type == "TemplateProcessing":
                        tmpl_single = processor.get("single", [])
                        tmpl_pair = processor.get("pair", [])
                        special_first = None
                        special_last = None
                        if len(tmpl_single) > 1:
                            if special_first := tmpl_single[0].get("SpecialToken", {}).get("id"):
                                if not tokenizer_config:
                                    special_bos = special_first
                                elif special_first not in (special_bos, special_cls):
                                    if not special_bos:
                                        tokenizer_config["bos_token"] = special_bos = special_first
                                    if not special_cls:
                                        tokenizer_config["cls_token"] = special_cls = special_first
                                self.add_special_token["bos"] = (
                                    True if special_first in (special_bos, special_cls) else False
                                )
                                if special_first not in (special_bos, special_cls):
                                    logger.warning(
                                        f"Unknown leading special token {special_first!r} in TemplateProcessing<single>"
                                    )
                            if special_last := tmpl_single[-1].get("SpecialToken", {}).get("id"):
                                if not tokenizer_config:
                                    special_eos = special_last
                                elif special_last != special_eos:
                                    if "eot" not in self.special_token_types:
                                        self.special_token_types = tuple(self.special_token_types) + ("eot",)
                                        tokenizer_config["eot_token"] = special_eos
                                    elif "eom" not in self.special_token_types:
                                        self.special_token_types = tuple(self.special_token_types) + ("eom",)
                                        tokenizer_config["eom_token"] = special_eos
                                    else:
                                        logger.warning(
                                            f"Overriding EOS token {special_eos!r} with {special_last!r} without EOT/EOM fallback!"
                                        )
                                    tokenizer_config["eos_token"] = special_eos = special_last
                                self.add_special_token["eos"] = True if special_last == special_eos else False
                                if special_last != special_eos:
                                    logger.warning(
                                        f"Unknown trailing special token {special_last!r} in TemplateProcessing<single>"
                                    )
                        if tmpl_pair:
                            seq_start = (
                                1
                                if special_first
                                and tmpl_pair[0].get("SpecialToken", {}).get("id") == special_first
                                else 0
                            )
                            seq_stop = (
                                -1
                                if special_last
                                and tmpl_pair[-1].get("SpecialToken", {}).get("id") == special_last
                                else None
                            )
                            if (special_first and seq_start == 0) or (special_last and seq_stop is None):
                                logger.warning(
                                    "TemplateProcessing<single> leading/trailing special tokens do not match TemplateProcessing<pair>"
                                )
                            if tmpl_pair := tmpl_pair[slice(seq_start, seq_stop)]:
                                tmpl_a = tmpl_pair[0].get("Sequence", {}).get("id")
                                tmpl_b = tmpl_pair[-1].get("Sequence", {}).get("id")
                                if tmpl_a != "A" or tmpl_b != "B":
                                    logger.warning(
                                        f"Unknown sequence {tmpl_a}...{tmpl_b} in TemplateProcessing<pair>"
                                    )
                                # A [sep] [eos] B
                                if tmpl_a == "A" and tmpl_b == "B" and (tmpl_pair := tmpl_pair[1:-1]):
                                    add_sep = False
                                    if special_entry := tmpl_pair[0].get("SpecialToken", {}).get("id"):
                                        if special_entry in (special_sep, special_eos) and not special_last:
                                            add_sep = True
                                        if special_entry not in (special_sep, special_eos):
                                            logger.warning(
                                                f"Unknown separator token {special_entry!r} in TemplateProcessing<pair>"
                                            )
                                    else:
                                        logger.warning(
                                            f"Unknown middle sequence {tmpl_pair[0]!r} in TemplateProcessing<pair>"
                                        )
                                    if len(tmpl_pair) == 2:
                                        if special_entry := tmpl_pair[1].get("SpecialToken", {}).get("id"):
                                            if special_entry in (special_sep, special_eos):
                                                add_sep = True
                                            if special_entry not in (special_sep, special_eos):
                                                logger.warning(
                                                    f"Unknown second separator token {special_entry!r} in TemplateProcessing<pair>"
                                                )
                                        else:
                                            logger.warning(
                                                f"Unknown second middle sequence {tmpl_pair[1]!r} in TemplateProcessing<pair>"
                                            )
                                    self.add_special_token["sep"] = add_sep
                                    if add_sep and not special_sep and tokenizer_config:
                                        tokenizer_config["sep_token"] = special_eos
                        continue
        if not tokenizer_config:
            return True
        chat_template_alt = None
        chat_template_json = path / "chat_template.json"
        chat_template_jinja = path / "chat_template.jinja"
        if chat_template_jinja.is_file():
            with open(chat_template_jinja, encoding="utf-8") as f:
                chat_template_alt = f.read()
            if additional_templates := list((path / "additional_chat_templates").glob("*.jinja")):
                chat_template_alt = [{"name": "default", "template": chat_template_alt}]
                for template_path in additional_templates:
                    with open(template_path, encoding="utf-8") as fp:
                        chat_template_alt.append({"name": template_path.stem, "template": fp.read()})
        elif chat_template_json.is_file():
            with open(chat_template_json, encoding="utf-8") as f:
                chat_template_alt = json.load(f).get("chat_template")
        chat_template = tokenizer_config.get("chat_template", chat_template_alt)
        if chat_template is None or isinstance(chat_template, (str, list)):
            self.chat_template = chat_template
        else:
            logger.warning(f"Bad type for chat_template field in {tokenizer_config_file!r} - ignoring")
        for typ in self.special_token_types:
            add_entry = tokenizer_config.get(f"add_{typ}_token")
            if isinstance(add_entry, bool):
                if typ not in self.add_special_token:
                    self.add_special_token[typ] = add_entry
                elif self.add_special_token[typ] != add_entry:
                    logger.warning(
                        f"Mismatch between tokenizer_config add_{typ}_token({add_entry}) and tokenizer post_processor<{typ}>({self.add_special_token[typ]}) - opting for the latter"
                    )
            entry = tokenizer_config.get(f"{typ}_token")
            if isinstance(entry, str):
                tc_content = entry
            elif isinstance(entry, dict):
                entry_content = entry.get("content")
                if not isinstance(entry_content, str):
                    continue
                tc_content = entry_content
            else:
                continue
            # We only need the first match here.
            maybe_token_id = next(
                (atok.get("id") for atok in added_tokens if atok.get("content") == tc_content),
                None,
            )
            self._set_special_token(typ, maybe_token_id)
        return True

    def _try_load_from_config_json(self, path: Path) -> bool:
        config_file = path / "config.json"
        if not config_file.is_file():
            return False
        with open(config_file, encoding="utf-8") as f:
            config = json.load(f)
        for typ in self.special_token_types:
            token_id = config.get(f"{typ}_token_id")
            # If not found at root, check in text_config (for multimodal models like Kimi-VL)
            if token_id is None and "text_config" in config:
                token_id = config["text_config"].get(f"{typ}_token_id")
            self._set_special_token(typ, token_id)
        return True
