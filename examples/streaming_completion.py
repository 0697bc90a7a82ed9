"""Streaming a text completion, as with llama-cpp-python; only the import is changed.

Run: python examples/streaming_completion.py [MODEL.gguf]
"""

import sys

from llamapy import Llama  # was: from llama_cpp import Llama
from llamapy.hub import resolve_model

model_path = sys.argv[1] if len(sys.argv) > 1 else str(resolve_model(None))

llm = Llama(model_path=model_path, seed=1337, verbose=False)
for chunk in llm.create_completion("Once upon a time,", max_tokens=16, temperature=0.7, stream=True):
    print(chunk["choices"][0]["text"], end="", flush=True)
print()
