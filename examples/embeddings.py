"""llama-cpp-python's README "Embeddings" example; only the import is changed.

Run: python examples/embeddings.py [MODEL.gguf]
"""

import sys

from llamapy import Llama  # was: from llama_cpp import Llama
from llamapy.hub import resolve_model

model_path = sys.argv[1] if len(sys.argv) > 1 else str(resolve_model(None))

llm = Llama(model_path=model_path, embedding=True, pooling_type="mean", verbose=False)

embeddings = llm.create_embedding("Hello, world!")
print(len(embeddings["data"][0]["embedding"]))

# or create multiple embeddings at once
embeddings = llm.create_embedding(["Hello, world!", "Goodbye, world!"])
print([len(d["embedding"]) for d in embeddings["data"]], embeddings["usage"])
