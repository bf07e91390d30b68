"""What grows in the soak: benchmarks/soak.py with tracemalloc snapshots taken
where the soak reads RSS (after warm-up, after the soak), and the largest
growth by allocation site.

    python evidence/DGR-023/soak_memory.py [--sessions 2000] [--top 15]
"""

import argparse
import sys
import tempfile
import tracemalloc
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import soak as soak_module  # noqa: E402
from dgr.testmodel import write_test_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    model = str(write_test_model(Path(tempfile.mkdtemp()) / "tiny.gguf"))
    snapshots = []
    rss = soak_module.rss_bytes

    def rss_and_snapshot() -> int:
        snapshots.append(tracemalloc.take_snapshot())
        return rss()

    soak_module.rss_bytes = rss_and_snapshot
    tracemalloc.start(8)
    report = trio.run(soak_module.soak, model, args.sessions, 32)
    after_warmup, after_soak = snapshots[0], snapshots[1]
    print(f"sessions {args.sessions}: rss after warm-up {report['rss_after_warmup'] >> 10} KiB, "
          f"after soak {report['rss_after_soak'] >> 10} KiB, growth {report['rss_growth']:.2%}")
    traced = sum(s.size for s in after_soak.statistics("filename")) - \
        sum(s.size for s in after_warmup.statistics("filename"))
    print(f"traced Python heap growth {traced / 1024:.1f} KiB")
    for stat in after_soak.compare_to(after_warmup, "traceback")[:args.top]:
        print(f"{stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks")
        for line in stat.traceback.format()[-6:]:
            print("      " + line)


if __name__ == "__main__":
    main()
