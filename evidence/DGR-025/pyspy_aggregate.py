"""Sum py-spy raw samples per thread, per function (inclusive and self).

    python evidence/DGR-025/pyspy_aggregate.py RAW [N]
"""
import sys, re, collections
incl = collections.Counter(); self_ = collections.Counter(); threads = collections.Counter()
total = 0
for line in open(sys.argv[1]):
    line = line.rstrip("\n")
    if not line: continue
    stack, n = line.rsplit(" ", 1); n = int(n)
    frames = stack.split(";")
    thread = frames[0]; frames = frames[1:]
    threads[re.sub(r"\(\d+\)", "", thread)] += n
    total += n
    names = [re.sub(r":\d+\)", ")", f) for f in frames]
    for f in set(names): incl[f] += n
    if names: self_[names[-1]] += n
print("total", total)
for t, n in threads.most_common(8): print(f"{n:6d} {t}")
print("--- inclusive")
for f, n in incl.most_common(int(sys.argv[2]) if len(sys.argv) > 2 else 40): print(f"{n:6d} {f[:150]}")
print("--- self")
for f, n in self_.most_common(30): print(f"{n:6d} {f[:150]}")
