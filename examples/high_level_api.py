"""llama-cpp-python's README "High-level API" example; only the import is changed.

Run: python examples/high_level_api.py [MODEL.gguf]   (default: llamapy's default model, fetched once)
"""

import sys

from llamapy import Llama  # was: from llama_cpp import Llama
from llamapy.hub import resolve_model

model_path = sys.argv[1] if len(sys.argv) > 1 else str(resolve_model(None))

llm = Llama(
    model_path=model_path,
    # n_gpu_layers=-1, # Uncomment to use GPU acceleration
    # seed=1337, # Uncomment to set a specific seed
    # n_ctx=2048, # Uncomment to increase the context window
)
output = llm(
    "Q: Name the planets in the solar system? A: ",  # Prompt
    max_tokens=32,  # Generate up to 32 tokens, set to None to generate up to the end of the context window
    stop=["Q:", "\n"],  # Stop generating just before the model would generate a new question
    echo=True,  # Echo the prompt back in the output
)  # Generate a completion, can also call create_completion
print(output)
