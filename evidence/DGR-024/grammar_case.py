"""The bench's grammar case alone (benchmarks/grammar.py), its rounds as Markdown.

    python evidence/DGR-024/grammar_case.py [--rounds 4]
"""

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import grammar  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=4)
args = parser.parse_args()
rounds = grammar.run(resolve_model_path(None), os.cpu_count(), rounds=args.rounds)
print("\n".join(grammar.markdown(rounds)))
