"""llama-cpp-python's "JSON and JSON Schema mode" example; only the import is changed.

``response_format`` constrains the answer with a grammar (llguidance), so even a tiny model answers
with JSON that validates against the schema.
Run: python examples/json_schema.py [MODEL.gguf]
"""

import json
import sys

from llamapy import Llama  # was: from llama_cpp import Llama
from llamapy.hub import resolve_model

model_path = sys.argv[1] if len(sys.argv) > 1 else str(resolve_model(None))
llm = Llama(model_path=model_path, n_ctx=2048)

answer = llm.create_chat_completion(
    messages=[
        {"role": "system", "content": "You are a helpful assistant that outputs in JSON."},
        {"role": "user", "content": "Who won the world series in 2020?"},
    ],
    response_format={
        "type": "json_object",
        "schema": {
            "type": "object",
            "properties": {"team_name": {"type": "string", "maxLength": 40}},
            "required": ["team_name"],
        },
    },
    temperature=0.7,
    max_tokens=40,
)
print(json.loads(answer["choices"][0]["message"]["content"]))
