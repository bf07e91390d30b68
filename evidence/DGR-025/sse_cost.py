"""What a streamed token's event costs to write, in process: the whole chunk object
encoded (sse_event(builder.delta(...))) against the text put in its choice's
template (dgr.http_sessions.TextEvents), for a completion and a chat completion.

    python evidence/DGR-025/sse_cost.py [--events 200000]
"""

import argparse
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dgr.doors.completions import TextEvents  # noqa: E402
from dgr.doors.sse import sse_event  # noqa: E402
from dgr.doors.openai import CompletionBuilder  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--events", type=int, default=200_000)
args = parser.parse_args()
n = args.events
print(f"us an event (a token's text ' hello'), best of 3 x {n}")
for chat in (False, True):
    builder = CompletionBuilder("gemma-3-270m", chat, str)
    events = TextEvents(builder)
    whole = min(timeit.repeat(lambda: sse_event(builder.delta(" hello", [], index=0)),
                              number=n, repeat=3)) / n * 1e6
    template = min(timeit.repeat(lambda: events(" hello", 0), number=n, repeat=3)) / n * 1e6
    print(f"{'chat completion' if chat else 'completion'}: whole object {whole:.2f}, "
          f"template {template:.2f}")
