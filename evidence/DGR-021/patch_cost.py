"""What the patch stack costs llama-batched-bench, with 0008's setting as dgr runs it
(GGML_CPU_FA_TILED=0) beside the patched pin's default and the pristine pin: the
bench's patch-cost tables for 512- and 2,048-token prompts at batch 1 and 4.

    python evidence/DGR-021/patch_cost.py
"""

from benchmarks.concurrency import markdown_patch_cost, patch_cost
from benchmarks.peers import ensure_peers
from dgr.engine import resolve_model_path

peers = ensure_peers()
model = str(resolve_model_path(None))
for n_prompt, n_new in ((512, 32), (2048, 32)):
    cost = patch_cost(peers["llama-batched-bench"], peers["llama-batched-bench-patched"], model,
                      [1, 4], n_new, 2, n_prompt=n_prompt)
    print("\n".join(markdown_patch_cost(cost, 3)), flush=True)
