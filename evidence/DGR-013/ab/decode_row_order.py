import sys, time
sys.path.insert(0,'.')
from dgr import _batch
from dgr.node import resolve_model_path
e=_batch.Engine(resolve_model_path(None), n_ctx=16384, n_seq_max=16, n_batch=512, n_ubatch=512, n_threads=2)
p=list(e.tokenize("The history of the Roman Empire begins with"))
for name, order in (("ascending", list(range(16))), ("descending", list(range(15,-1,-1))), ("shuffled", [3,0,7,1,15,2,9,4,8,5,6,11,10,13,12,14]), ("ascending", list(range(16)))):
    for s in range(16):
        e.release(s)
        e.step(p, list(range(len(p))), [s]*len(p), [0]*(len(p)-1)+[1])
    toks=[p[-1]]*16; pos=[len(p)]*16
    dec=0
    for it in range(16):
        out,*_=e.step(toks,pos,order,[1]*16); dec+=e.last_step_timing['decode']
        pos=[x+1 for x in pos]
    print(f"{name}: decode {1000*dec/16:.1f} ms/step", flush=True)
