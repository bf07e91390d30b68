"""The decode case (benchmarks/decode.py) on the random-weight ~1B Llama in Q4_K_M, once
with dgr's default weight repacking and once with --weight-repack decode (Q4_K
repacked too), each against llama-server's defaults; prints both tables. With
--prefill, the prefill case (benchmarks/prefill.py, prompts of 512 and 2,048 tokens)
in each mode instead.

    .venv/bin/python evidence/DGR-065/decode_modes.py [--rounds 3] [--prefill] [--folder DIR]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import decode, prefill  # noqa: E402
from benchmarks.peers import ensure_peers  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prefill", action="store_true")
    parser.add_argument("--folder", default="/tmp/dgr-decode")
    args = parser.parse_args()
    Path(args.folder).mkdir(parents=True, exist_ok=True)
    peers = ensure_peers(log=lambda m: print(m, file=sys.stderr), batched_bench=False)
    model = prefill.llama_1b(args.folder)
    for mode in ("invariant", "decode"):
        if args.prefill:
            result = prefill.run(peers, model, 2, lengths=(512, 2048), rounds=args.rounds,
                                 id_range=prefill.TEST_ID_RANGE,
                                 dgr_extra=["--weight-repack", mode])
            result["model"] = f"random-weight Llama ~1B Q4_K_M, dgr --weight-repack {mode}"
            print("\n".join(prefill.markdown(result)), flush=True)
            continue
        result = decode.run(peers, model, 2, rounds=args.rounds,
                            dgr_extra=["--weight-repack", mode])
        result["model"] = f"random-weight Llama ~1B Q4_K_M, dgr --weight-repack {mode}"
        print("\n".join(decode.markdown(result)), flush=True)
        for r, row in enumerate(result["rounds"]):
            print(f"round {r}: " + ", ".join(f"c={c}: " + " ".join(
                f"{name} {figs['decode']:.1f}" for name, figs in per.items()) for c, per in row.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
