"""llama-cpp-python's token-level API: tokenize, generate, detokenize, save/load state; only the
import is changed.

Run: python examples/tokens_and_generate.py [MODEL.gguf]
"""

import sys

from llamapy import Llama  # was: from llama_cpp import Llama
from llamapy.hub import resolve_model

model_path = sys.argv[1] if len(sys.argv) > 1 else str(resolve_model(None))

llm = Llama(model_path=model_path, verbose=False)
tokens = llm.tokenize(b"Hello, world!")
print(tokens)
out = []
for token in llm.generate(tokens, top_k=40, top_p=0.95, temp=1.0, repeat_penalty=1.1):
    if token == llm.token_eos() or len(out) == 8:
        break
    out.append(token)
print(llm.detokenize(out).decode("utf-8", errors="replace"))

# save the evaluated prompt and continue twice from the same point
llm.reset()
llm.eval(llm.tokenize(b"The capital of France is"))
state = llm.save_state()
first = llm.sample(temp=0.0)
llm.load_state(state)
assert llm.sample(temp=0.0) == first
print(llm.n_tokens, llm.detokenize([first]))
