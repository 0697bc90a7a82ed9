"""llama-cpp-python's README "Chat Completion" example (plus streaming); only the import is changed.

The chat template comes from the GGUF file (``chat_format=...`` picks a built-in one instead).
Run: python examples/chat_completion.py [MODEL.gguf]
"""

import sys

from llamapy import Llama  # was: from llama_cpp import Llama
from llamapy.hub import resolve_model

model_path = sys.argv[1] if len(sys.argv) > 1 else str(resolve_model(None))

llm = Llama(model_path=model_path, n_ctx=2048)
answer = llm.create_chat_completion(
    messages=[
        {"role": "system", "content": "You are an assistant who answers in one sentence."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
    max_tokens=16,
)
print(answer["choices"][0]["message"]["content"])

# streaming: OpenAI-style chunks with a "delta"
for chunk in llm.create_chat_completion(
    messages=[{"role": "user", "content": "Name three colors."}],
    max_tokens=12,
    stream=True,
):
    delta = chunk["choices"][0]["delta"]
    if "content" in delta:
        print(delta["content"], end="", flush=True)
print()
