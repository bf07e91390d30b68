"""`python -m benchmarks`: the bench (benchmarks/concurrency.py), run from a source checkout."""

import sys

from benchmarks.concurrency import main

sys.exit(main())
