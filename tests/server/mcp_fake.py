"""A scripted fake model for the MCP tests: the fake backend of :mod:`tests.server.fake_backend` (its KV
bookkeeping, one byte a token) under a Hermes-style chat template, whose answer to a prompt is what
``script(prompt_text)`` returns, written out one byte a token and then EOS. So a test decides that the
"model" calls a tool (``<tool_call>{...}</tool_call>``, parsed by the server's Hermes parser like a real
model's call) or answers, from what the conversation holds so far (e.g. the tool's result)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence

import numpy as np

from tests.server.fake_backend import BOS, EOS, FAIL_BYTE, FakeBackend

GEN_PROMPT = "<|im_start|>assistant\n"
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools: {{ tools | tojson }}\n"
    'Call a tool as <tool_call>{"name": <name>, "arguments": <args>}</tool_call><|im_end|>\n{% endif %}'
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>tool\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{%- elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n{{ m.content or '' }}"
    "{%- for c in m.tool_calls %}<tool_call>"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments }}}</tool_call>{% endfor %}'
    "<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}" + GEN_PROMPT + "{% endif %}"
)


def tool_call(name: str, /, **arguments: object) -> str:
    """What the model writes to call ``name``."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def tool_responses(prompt: str) -> list[str]:
    """The tool results the prompt holds, in order."""
    out, i = [], 0
    while (i := prompt.find("<tool_response>", i)) >= 0:
        j = prompt.find("</tool_response>", i)
        out.append(prompt[i + len("<tool_response>") : j])
        i = j
    return out


def last_user(prompt: str) -> str:
    i = prompt.rfind("<|im_start|>user\n")
    return prompt[i + len("<|im_start|>user\n") :].split("<|im_end|>", 1)[0] if i >= 0 else ""


class ByteVocab:
    """The duck-typed vocabulary the grammar sampler needs (tools arm a lazy grammar): tokens 0..255 are
    bytes, BOS and EOS control tokens."""

    def __init__(self, backend: FakeBackend) -> None:
        self.b = backend
        self.n_tokens, self.bos, self.eos = backend.n_vocab, BOS, EOS

    def tokenize(
        self, text: str | bytes, add_special: bool = False, parse_special: bool = False
    ) -> list[int]:
        data = text.encode() if isinstance(text, str) else bytes(text)
        return ([BOS] if add_special else []) + list(data)

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        return self.b.token_to_piece(token, special)

    def token_attr(self, token: int) -> int:
        from llamapy.vocab.vocab import TokenAttr

        return int(TokenAttr.CONTROL if token >= 256 else TokenAttr.NORMAL)

    def is_eog(self, token: int) -> bool:
        return token == EOS


class ScriptedBackend(FakeBackend):
    def __init__(self, script: Callable[[str], str] | None = None, **kw) -> None:
        super().__init__(**kw)
        self.vocab = ByteVocab(self)
        self.script = script or (lambda prompt: "Hello!")
        self.prompts: list[str] = []  # each prompt the model answered, in order

    @property
    def chat_template(self):
        from llamapy.vocab.chat_template import ChatTemplate

        return ChatTemplate(HERMES_TEMPLATE, "<s>", "</s>", name="fake hermes template")

    def _next(self, kv: list[int]) -> int:
        text = bytes(t for t in kv if t < 256).decode("utf-8", "replace")
        cut = text.rfind(GEN_PROMPT)
        if cut < 0:
            return EOS
        prompt, written = text[: cut + len(GEN_PROMPT)], text[cut + len(GEN_PROMPT) :].encode()
        if not written:
            self.prompts.append(prompt)
        answer = self.script(prompt).encode()
        return answer[len(written)] if len(written) < len(answer) else EOS

    def decode(
        self, tokens: Sequence[int], pos: Sequence[int], seq_ids: Sequence[int], outputs: Sequence[bool]
    ):
        assert len(tokens) == len(pos) == len(seq_ids) == len(outputs) and 0 < len(tokens) <= self.n_batch
        if FAIL_BYTE in tokens:
            raise RuntimeError("fake decode failure")
        if self.delay:
            time.sleep(self.delay)
        rows = []
        with self.lock:
            for t, p, s, o in zip(tokens, pos, seq_ids, outputs, strict=True):
                kv = self.kv[s]
                assert p == len(kv), f"seq {s}: position {p} but the cache holds {len(kv)} tokens"
                kv.append(int(t))
                self.pos[s].append(int(p))
                if o:
                    z = np.zeros(self.n_vocab, np.float32)
                    z[self._next(kv)] = 10.0
                    rows.append(z)
        return np.stack(rows) if rows else np.zeros((0, self.n_vocab), np.float32)

    def info(self) -> dict:
        return {**super().info(), "chat_template": HERMES_TEMPLATE}
