"""llamapy's lower-level API, llama.h style: a model, a context, batches and a sampler chain.

(llama-cpp-python exposes llama.h through ctypes; llamapy offers the same steps as Python objects.)
Run: python examples/low_level_api.py [MODEL.gguf]
"""

import sys

from llamapy.batch import Batch
from llamapy.context import Context, ContextParams
from llamapy.hub import resolve_model
from llamapy.model import Model
from llamapy.sampling import SamplingParams, build_chain

model_path = sys.argv[1] if len(sys.argv) > 1 else str(resolve_model(None))

model = Model.load(model_path)  # weights stay quantized, memory-mapped
ctx = Context(model, ContextParams(n_ctx=512))
vocab = model.vocab
sampler = build_chain(SamplingParams(temp=0.0), n_vocab=model.n_vocab, vocab=vocab)

tokens = vocab.tokenize("The three primary colors are", add_special=True, parse_special=True)
ctx.decode(Batch.from_tokens(tokens, pos0=0))  # the prompt, logits for its last token
pos = len(tokens)
pieces = []
for _ in range(12):
    token = sampler.sample(ctx.get_logits_ith(-1))
    sampler.accept(token)
    if vocab.is_eog(token):
        break
    pieces.append(vocab.token_to_piece(token))
    ctx.decode(Batch.from_tokens([token], pos0=pos))
    pos += 1
print(b"".join(pieces).decode("utf-8", errors="replace"))
