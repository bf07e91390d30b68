import sys, json, trio
sys.path.insert(0, "/work/main")
from benchmarks.grammar import eight_beside, SCHEMA
from dgr.engine import resolve_model_path
from llama_cpp.llama_grammar import json_schema_to_gbnf
g = json_schema_to_gbnf(json.dumps(SCHEMA))
m = resolve_model_path(None)
print(trio.run(eight_beside, m, 2, g, 96))
