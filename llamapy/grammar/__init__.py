"""Grammar-constrained sampling through llguidance: GBNF, llguidance Lark, JSON schemas and regexes.

Quick start::

    from llamapy.grammar import LlamaGrammar
    g = LlamaGrammar.from_json_schema({"type": "object", "properties": {"x": {"type": "integer"}}})
    smpl = g.sampler(vocab)          # a llamapy.sampling.Sampler: put it first in the chain
    smpl.apply(cur); smpl.accept(token); smpl.is_finished()

``lltokenizer(vocab)`` is llguidance's tokenizer for a vocabulary (built once per vocabulary object).
"""

from .errors import GrammarError
from .grammar import LlamaGrammar, Trigger
from .sampler import GrammarSampler
from .tokenizer import lltokenizer, special_token_id

__all__ = ["GrammarError", "GrammarSampler", "LlamaGrammar", "Trigger", "lltokenizer", "special_token_id"]
