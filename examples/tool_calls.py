"""Function calling as llama-cpp-python / OpenAI clients do it: ``tools``, ``tool_choice``, the answer's
``message.tool_calls``, and a second turn with the tool's result.

The tool-call syntax comes from the chat template (Hermes ``<tool_call>`` for Qwen 2.5 / 3, JSON for
Llama 3.x, ``[TOOL_CALLS]`` for Mistral, ...; a template without tools gets a generic JSON format).
Run: python examples/tool_calls.py [MODEL.gguf]
"""

import json
import sys

from llamapy import Llama
from llamapy.hub import resolve_model

model_path = sys.argv[1] if len(sys.argv) > 1 else str(resolve_model(None))
llm = Llama(model_path=model_path, n_ctx=2048)

tools = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 32},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
            },
        },
    }
]
messages = [{"role": "user", "content": "What's the weather like in Paris?"}]
answer = llm.create_chat_completion(messages=messages, tools=tools, tool_choice="required", max_tokens=200)
message = answer["choices"][0]["message"]
print("finish_reason:", answer["choices"][0]["finish_reason"])
for call in message.get("tool_calls") or []:
    print("call:", call["function"]["name"], json.loads(call["function"]["arguments"]))

# run the tool, give its result back, and let the model answer in words
messages.append(message)
for call in message.get("tool_calls") or []:
    result = {"temperature": 21, "sky": "clear"}
    messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)})
final = llm.create_chat_completion(messages=messages, tools=tools, tool_choice="none", max_tokens=24)
print("answer:", final["choices"][0]["message"]["content"])
