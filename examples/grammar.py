"""llama-cpp-python's grammar example: ``LlamaGrammar.from_string`` with a llama.cpp GBNF grammar.

Run: python examples/grammar.py [MODEL.gguf]
"""

import sys

from llamapy import Llama, LlamaGrammar  # was: from llama_cpp import Llama, LlamaGrammar
from llamapy.hub import resolve_model

model_path = sys.argv[1] if len(sys.argv) > 1 else str(resolve_model(None))
llm = Llama(model_path=model_path, n_ctx=512)

grammar = LlamaGrammar.from_string(
    r"""
root   ::= answer " because " reason "."
answer ::= "Yes" | "No"
reason ::= [a-z ]{3,40}
"""
)
out = llm("Q: Is the sea salty? A:", grammar=grammar, max_tokens=32, temperature=0)
print(out["choices"][0]["text"])
