"""What the patch stack costs, with more rounds than the bench takes:
llama-batched-bench from the pristine and the patched pin, alternating,
best of --rounds runs each.

    python3 evidence/DGR-013/patch_cost.py --rounds 5
"""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.concurrency import markdown_patch_cost, patch_cost  # noqa: E402
from benchmarks.peers import ensure_peers  # noqa: E402
from dgr.node import resolve_model_path  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=5)
args = parser.parse_args()
peers = ensure_peers()
model = resolve_model_path(None)
for levels, n_new, n_prompt in (([1, 2, 4, 8, 16, 32], 64, 64), ([1, 4], 32, 2048)):
    cost = patch_cost(peers["llama-batched-bench"], peers["llama-batched-bench-patched"], model,
                      levels, n_new, 2, n_prompt=n_prompt, rounds=args.rounds)
    print("\n".join(markdown_patch_cost(cost, args.rounds)), flush=True)
