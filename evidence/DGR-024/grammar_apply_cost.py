"""What one grammar check of the whole vocabulary costs, against one sampler chain.

The tool call's grammar of benchmarks/grammar.py, on the default model's 262,144
tokens, in a state inside the arguments (a string being written); random logits.

    PYTHONPATH=. python evidence/DGR-024/grammar_apply_cost.py 2>/dev/null
"""
import ctypes, time, json
import llama_cpp as L
from dgr.engine import resolve_model_path
from dgr import tools
from benchmarks.grammar import TOOL
spec = tools.ToolSpec((TOOL,), "required", False)
g = tools.grammar(spec)
L.llama_backend_init()
mp = L.llama_model_default_params()
model = L.llama_model_load_from_file(resolve_model_path(None).encode(), mp)
vocab = L.llama_model_get_vocab(model)
n = L.llama_vocab_n_tokens(vocab)
print("vocab", n)
gs = L.llama_sampler_init_grammar(vocab, g.encode(), b"root")
arr = (L.llama_token_data * n)()
import random
random.seed(0)
logits = [random.gauss(0,3) for _ in range(n)]
def fill():
    for j in range(n):
        arr[j].id = j; arr[j].logit = logits[j]; arr[j].p = 0.0
cur = L.llama_token_data_array(data=arr, size=n, selected=-1, sorted=False)
# advance grammar a bit: accept tokens of a prefix
prefix = '{"tool_calls": [{"name": "add_fruits", "arguments": {"fruits": ["ap'
toks = (L.llama_token * 256)()
k = L.llama_tokenize(vocab, prefix.encode(), len(prefix), toks, 256, False, True)
for i in range(k):
    try:
        L.llama_sampler_accept(gs, toks[i])
    except Exception as e:
        print("fail", e); break
for trial in range(3):
    fill()
    cur = L.llama_token_data_array(data=arr, size=n, selected=-1, sorted=False)
    t = time.perf_counter(); L.llama_sampler_apply(gs, ctypes.byref(cur)); dt = time.perf_counter() - t
    print("grammar apply ms", dt*1e3, sum(1 for j in range(n) if arr[j].logit != float('-inf')))
sp = L.llama_sampler_chain_default_params()
ch = L.llama_sampler_chain_init(sp)
L.llama_sampler_chain_add(ch, L.llama_sampler_init_temp(0.7))
L.llama_sampler_chain_add(ch, L.llama_sampler_init_dist(1))
for trial in range(3):
    fill()
    cur = L.llama_token_data_array(data=arr, size=n, selected=-1, sorted=False)
    t = time.perf_counter(); L.llama_sampler_apply(ch, ctypes.byref(cur)); dt = time.perf_counter() - t
    print("chain apply ms", dt*1e3)
