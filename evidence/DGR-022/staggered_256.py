"""256 sessions of tests/test_node.py's 8 prompts, each arriving after a random delay
(seed argv[1], up to argv[2] s), against each prompt alone on the same node (the tiny
test model at argv[3]). Prints how many sessions' token ids differ ("tok mismatches"),
how many differ in tokens or log-probabilities ("token mismatches", with their
indices), and for the first failures the slots involved (session ids, prompts,
reuse source and length, arrival and end times in seconds).

    python staggered_256.py SEED MAX_DELAY_S TINY_MODEL.gguf
"""
import os, random, sys, trio
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import dgr
from test_node import PROMPTS, config, _outputs
M = sys.argv[3]
async def main():
    params = dgr.SamplingParams(max_tokens=32, logprobs=2, ignore_eos=True)
    cfg = config(M, max_running=256, max_waiting=0, n_ctx=256 * 128, n_batch=512, n_ubatch=512, prefill_sessions_per_step=64)
    async with dgr.open_node(cfg) as node:
        solo = [_outputs(await node.generate(p, params)) for p in PROMPTS]
        together = [None] * 256; sess = {}; times = {}
        rnd = random.Random(int(sys.argv[1]))
        delays = [rnd.random() * float(sys.argv[2]) for _ in range(256)]
        async def run(i):
            await trio.sleep(delays[i])
            t0 = trio.current_time()
            async with node.stream(PROMPTS[i % len(PROMPTS)], params) as s:
                sess[i] = s.session
                times[i] = [t0]
                ids, lps = [], []
                async for ch in s:
                    if ch.token_id is not None: ids.append(ch.token_id); lps.append((ch.logprob, ch.top_logprobs))
            times[i].append(trio.current_time())
            together[i] = (ids, [a for a, _ in lps], [b for _, b in lps])
        async with trio.open_nursery() as nursery:
            for i in range(256):
                nursery.start_soon(run, i)
        bad = [i for i in range(256) if together[i] != solo[i % len(PROMPTS)]]
        badtok = [i for i in range(256) if together[i][0] != solo[i % len(PROMPTS)][0]]
        print("tok mismatches", len(badtok))
        print("token mismatches", len(bad), bad[:20])
        T0 = min(t[0] for t in times.values())
        rows = sorted((times[i][0] - T0, i) for i in range(256))
        for i in bad[:3]:
            s = sess[i]
            src = s.reuse_from
            print("FAIL", i, "id", s.id, "slot", s.slot, "src", src, "n_reused", s.n_reused, "t", round(times[i][0]-T0, 3), round(times[i][1]-T0, 3))
            for t, j in rows:
                o = sess[j]
                if o.slot == src or o.slot == s.slot:
                    print("    slot", o.slot, "id", o.id, "prompt", j % 8, "reuse", o.reuse_from, o.n_reused, "t", round(t, 3), round(times[j][1]-T0, 3), "BAD" if j in bad else "")
        for i in bad[:5]:
            s = sess[i]
            print(i, "prompt", i % 8, "n_reused", s.n_reused, "reuse_from", s.reuse_from, "leader", s.leader, "share_len", getattr(s, "share_len", None))
            a, b = solo[i % 8], together[i]
            k = next(j for j in range(len(a[1])) if a[1][j] != b[1][j] or a[2][j] != b[2][j])
            print("   first diff at token", k, a[1][k], b[1][k], a[2][k], b[2][k])
trio.run(main)
