import sys, time
sys.path.insert(0,'.')
from dgr import _batch
from dgr.node import resolve_model_path
e=_batch.Engine(resolve_model_path(None), n_ctx=32*256, n_seq_max=32, n_batch=512, n_ubatch=512, n_threads=2)
p=list(e.tokenize("The capital of France is"))
for s in range(32):
    e.step(p, list(range(len(p))), [s]*len(p), [0]*(len(p)-1)+[1])
toks=[p[-1]]*32; pos=[len(p)]*32
samp=[]
for it in range(20):
    out,*_=e.step(toks,pos,list(range(32)),[1]*32)
    samp.append(e.last_step_timing['sample']); toks=out.tolist(); pos=[x+1 for x in pos]
print("sample ms per step at c=32:", 1000*sorted(samp)[10], out[:8])
