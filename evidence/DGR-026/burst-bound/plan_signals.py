"""Three ways a plan might see where the burst's copied drafts break, replayed on
confidence.py's answers (the bench's c = 1 burst of rounds 0-3, each with its top-2
log-probabilities) at bound.py's step times. The copier is confidence.py's stand-in
for dgr's sources: the longest match of 3-32 tokens of the context in itself, else
of 4-32 in the earlier user's prompt and answer. Each draft's length is either fixed
(at most K tokens, verified whole) or planned as dgr's auto plans it at c = 1: the
length j that gives the most expected tokens per second, (1 + sum of p^i, i <= j)
over the time of a step of 1 + j rows, p the session's record of its drafts (tokens
kept over tokens kept plus drafts broken, beside 2 tokens at 0.8, what was recorded
before weighing 0.9 a draft).

1. Margins as chances: each copied token's chance to be kept once those before it
   were is read from its margin where it was generated (log-probability less the
   runner-up's), by bins of margin, counted over every position of the answers
   (kept over kept plus broken, beside 2 at 0.8). The plan multiplies those chances
   in place of p^j. In-sample (the bins counted on all four answers) and leave one
   answer out (counted on the other three).
2. A cut at a foreign value: a draft from the earlier user's text stops before a
   token that occurs in the earlier user's prompt but nowhere in the session's
   context (another user's name or number).
3. Re-aligning after a break: where neither source matches, a session that last
   drafted from the earlier user's text looks for its last `key` tokens within
   `window` tokens after where that draft broke, and drafts what follows them.

    PYTHONPATH=. python3 evidence/DGR-026/burst-bound/plan_signals.py
"""
import statistics
import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bound import kept, step_times  # noqa: E402
from confidence import SURE, answers, locate  # noqa: E402

from benchmarks.speculation import N_NEW  # noqa: E402

BINS = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, SURE)
LONGEST = 15  # step times are measured up to 16 rows


def bin_of(margin):
    return next(i for i, top in enumerate(BINS) if margin < top or top == SURE)


class Copier:
    """One answer's drafts: the context source, else the earlier user's text, with
    the options above."""

    def __init__(self, prompt, answer, margins, earlier, e_margins, cut=False, key=0,
                 window=0):
        self.prompt, self.answer, self.margins = prompt, answer, margins
        self.earlier, self.e_margins = earlier, e_margins
        self.e_prompt = set(earlier[:len(earlier) - N_NEW])
        self.cut, self.key, self.window = cut, key, window
        self.cursor = None  # where in `earlier` the session's next token would be

    def draft(self, t):
        """(tokens, their margins, where in `earlier` they start or None)"""
        own = self.prompt + self.answer[:t]
        at = locate(own, own, 3)
        if at >= 0:
            own_margins = [SURE] * len(self.prompt) + self.margins[:t]
            return own[at:at + LONGEST], own_margins[at:at + LONGEST], None
        at = locate(self.earlier, own, 4)
        if at < 0 and self.cursor is not None and self.window:
            at = next((j for j in range(max(self.key, self.cursor),
                                        min(len(self.earlier), self.cursor + self.window))
                       if self.earlier[j - self.key:j] == own[-self.key:]), -1)
        if at < 0:
            return [], [], None
        tokens = self.earlier[at:at + LONGEST]
        if self.cut:
            context = set(own)
            tokens = next((tokens[:i] for i, tok in enumerate(tokens)
                           if tok in self.e_prompt and tok not in context), tokens)
        return tokens, self.e_margins[at:at + len(tokens)], at

    def verified(self, at, n):
        if at is not None:
            self.cursor = at + n + 1


def replay(copier, cost, longest=None, chance=None):
    """Seconds for the answer's tokens after its first: drafts of at most `longest`
    verified whole, else planned at the session's record, or at chance(margin) per
    token where given."""
    answer = copier.answer
    t, spent, accepted, broken = 1, 0.0, 0.0, 0.0
    while t < len(answer):
        tokens, margins, at = copier.draft(t)
        if longest is not None:
            tokens = tokens[:longest]
        elif tokens:
            p = (accepted + 1.6) / (accepted + broken + 2)
            best, length, gain, p_j = 1 / cost[1], 0, 0.0, 1.0
            for j in range(1, len(tokens) + 1):
                p_j *= chance(margins[j - 1]) if chance else p
                gain += p_j
                if (1 + gain) / cost[1 + j] > best:
                    best, length = (1 + gain) / cost[1 + j], j
            tokens = tokens[:length]
        n = kept(tokens, answer[t:])
        if tokens:
            accepted = 0.9 * accepted + n
            broken = 0.9 * broken + (n < len(tokens))
            copier.verified(at, n)
        spent += cost[1 + len(tokens)]
        t += n + 1
    return spent


def chances(pairs):
    """Per margin bin: a copied token's chance to be kept once those before it were,
    counted at every position of the answers; and the counts (kept, broken)."""
    kept_n, broken_n = [0] * len(BINS), [0] * len(BINS)
    for pair in pairs:
        copier = Copier(*pair)
        for t in range(1, len(copier.answer)):
            tokens, margins, _ = copier.draft(t)
            n = kept(tokens, copier.answer[t:])
            for m in margins[:n]:
                kept_n[bin_of(m)] += 1
            if n < len(tokens):
                broken_n[bin_of(margins[n])] += 1
    return [(a + 1.6) / (a + b + 2) for a, b in zip(kept_n, broken_n)], kept_n, broken_n


def show(label, speedups):
    print(f"{label}: " + ", ".join(f"{x:.2f}" for x in speedups)
          + f"; median {statistics.median(speedups):.2f}")


def main():
    pairs = trio.run(answers)
    cost = step_times(pairs[0][0] + pairs[0][1][:48])
    print("step time by rows (ms): " + ", ".join(f"{r}: {1e3 * s:.1f}" for r, s in cost.items()))

    def speedups(options, **plan):
        return [(len(pair[1]) - 1) * cost[1] / replay(Copier(*pair, **options), cost, **plan)
                for pair in pairs]

    by_bin, kept_n, broken_n = chances(pairs)
    print("## margins as chances")
    print("bins (upper margin): " + ", ".join(f"{b}" for b in BINS))
    print(f"  kept {kept_n}, broken {broken_n}, chance {[round(c, 3) for c in by_bin]}")
    show("planned at the session's record", speedups({}))
    show("planned at the margins' chances, in-sample",
         speedups({}, chance=lambda m: by_bin[bin_of(m)]))
    out = []
    for r, pair in enumerate(pairs):
        held_out, _, _ = chances([p for i, p in enumerate(pairs) if i != r])
        out.append((len(pair[1]) - 1) * cost[1] / replay(
            Copier(*pair), cost, chance=lambda m: held_out[bin_of(m)]))
    show("planned at the margins' chances, leaving the answer out", out)
    print("## a cut at a foreign value, and re-aligning after a break")
    for longest in (3, 5, None):
        plan = {"longest": longest} if longest else {}
        label = f"at most {longest}, whole" if longest else "planned at the record"
        show(f"{label}", speedups({}, **plan))
        show(f"{label}, cut at a foreign value", speedups({"cut": True}, **plan))
        for key, window in ((1, 6), (1, 12), (2, 6), (2, 12)):
            show(f"{label}, re-aligned (key {key}, window {window})",
                 speedups({"key": key, "window": window}, **plan))


if __name__ == "__main__":
    main()
