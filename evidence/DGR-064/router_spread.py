"""Issue 64, part 5: two dgr nodes behind a router started as the README starts it.

Two nodes (the default model; with --tiny a random-weight tiny model written here;
with --sequential the conversations run one after another instead of at once), the router in front with
the README's flags (`--policy cache_aware`, its other flags at their defaults, or as
given after the router's name), 6 conversations of 3 turns each (a system prompt of
its own, non-streamed, the `openai` client without retries): how many requests each
node admitted. Then the node that admitted most is killed (SIGKILL) and 20 more
non-streamed requests are sent, one at a time: how many failed.

    PATH=.venv/bin:$PATH .venv/bin/python evidence/DGR-064/router_spread.py \
        [--tiny] [--sequential] vllm-router [FLAGS...]
"""

import random
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.scaleout import router_binary  # noqa: E402
from benchmarks.servers import ServerProcess, dgr_server, free_port  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402
from dgr.testmodel import write_test_model  # noqa: E402


def admitted(node) -> float:
    text = httpx.get(node.url + "/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("dgr_admissions_total"))


def conversation(base: str, model: str, c: int) -> list[str]:
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60)
    rng = random.Random(c)
    messages = [{"role": "system", "content": f"Conversation {c}. "
                 + " ".join(rng.choice("river stone market window garden".split())
                            for _ in range(200))}]
    errors = []
    for turn in range(3):
        messages.append({"role": "user", "content": f"Question {turn + 1}."})
        try:
            reply = client.chat.completions.create(model=model, messages=messages,
                                                   max_tokens=8, temperature=0)
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        except Exception as exc:
            errors.append(f"{type(exc).__name__}")
            messages.append({"role": "assistant", "content": "(none)"})
    return errors


def main() -> None:
    args = sys.argv[1:]
    tiny, sequential = "--tiny" in args, "--sequential" in args
    args = [a for a in args if a not in ("--tiny", "--sequential")]
    router, flags = args[0], args[1:]
    model = (str(write_test_model(Path("/tmp") / "dgr-router-tiny.gguf")) if tiny
             else resolve_model_path(None))
    nodes = [dgr_server(model, 4, 1024, 1, free_port()) for _ in range(2)]
    with nodes[0] as a, nodes[1] as b:
        port = free_port()
        argv = [router_binary(router), *(["launch"] if router == "smg" else []),
                "--worker-urls", a.url, b.url, "--policy", "cache_aware",
                "--host", "127.0.0.1", "--port", str(port), *flags]
        with ServerProcess(router, argv, port) as front:
            model_id = httpx.get(front.url + "/v1/models", timeout=10).json()["data"][0]["id"]
            with ThreadPoolExecutor(1 if sequential else 6) as pool:
                errors = sum(pool.map(lambda c: conversation(front.url, model_id, c), range(6)),
                             [])
            counts = [admitted(a), admitted(b)]
            print(f"{router} {' '.join(flags) or '(defaults)'}"
                  f"{', conversations one after another' if sequential else ''}: 18 requests, "
                  f"node a {counts[0]:.0f}, node b {counts[1]:.0f}, failed {len(errors)}")
            victim = (a, b)[counts[1] > counts[0]]
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait()
            client = openai.OpenAI(base_url=front.url + "/v1", api_key="unused", max_retries=0,
                                   timeout=60)
            lost = []
            for i in range(20):
                try:
                    client.chat.completions.create(
                        model=model_id, max_tokens=8, temperature=0,
                        messages=[{"role": "user", "content": f"After the kill {i}."}])
                except Exception as exc:
                    lost.append(type(exc).__name__)
                time.sleep(0.05)
            print(f"  node {'ab'[victim is b]} killed: {len(lost)} of 20 later requests failed"
                  + (f" ({', '.join(sorted(set(lost)))})" if lost else ""))


if __name__ == "__main__":
    main()
