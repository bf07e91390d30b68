"""Issue 64, part 1: models with recurrent state served with the guarantee.

For each random-weight model (lfm2: 4 short-convolution and 2 attention layers; mamba)
in F32 and Q4_K_M, and each speculation mode: 8 sessions alone, then 8 at once
(staggered), 8 at once again, and 8 at once in a nearly full pool drafting whenever
they can, through `dgr.invariance.check` (the check of `python -m dgr check-invariance`). Prints, per case, the sessions that completed,
those bitwise equal to their solo runs, prompt tokens claimed from a cache, and
draft tokens verified and rejected.

    .venv/bin/python evidence/DGR-064/recurrent_sessions.py
"""

import tempfile
from pathlib import Path

import trio

import dgr
from dgr import invariance
from dgr.errors import DgrError
from dgr.testmodel import quantize, write_test_model

SHAPE = dict(n_embd=256, n_layer=6, n_head=4, n_head_kv=2, n_ff=256, seed=7)


async def main() -> None:
    folder = Path(tempfile.mkdtemp())
    print("model        type    speculation  completed  bitwise  cached  drafted  rejected")
    for arch in ("lfm2", "mamba"):
        source = write_test_model(folder / f"{arch}.gguf", architecture=arch, **SHAPE)
        for kind in ("F32", "Q4_K_M"):
            model = source if kind == "F32" else quantize(source, folder / f"{arch}-{kind}.gguf", kind)
            for speculation in ("off", "auto", "always"):
                config = dgr.NodeConfig(model_path=str(model), max_running=8, n_ctx=4096,
                                        n_batch=256, n_ubatch=256, prefill_chunk=16,
                                        n_threads=2, speculation=speculation)
                try:
                    report = await invariance.check(config, invariance.PROMPTS, n_new=64)
                except DgrError as exc:  # a session failed: the check cannot compare
                    print(f"{arch:12} {kind:7} {speculation:12} failed: {exc}")
                    continue
                runs = len(report["runs"]) * report["sessions"]
                equal = sum(d is None for diffs in report["runs"].values() for d in diffs)
                print(f"{arch:12} {kind:7} {speculation:12} {runs:>9}  {equal:>7}  "
                      f"{report['cached_tokens']:>6}  {report['drafted']:>7}  {report['rejected']:>8}")
    print("claim:", report["coverage"]["covered"], report["coverage"]["why_not"])


if __name__ == "__main__":
    trio.run(main)
