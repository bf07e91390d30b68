"""What a router sends its workers: two stand-in workers that record every request
(method, path, JSON body) and answer as an OpenAI server would, behind the router,
and the everyday calls of the official `openai` client through it.

    python evidence/DGR-058/capture.py smg|vllm-router [--policy cache_aware] > out.txt

Prints, per worker request, the path and the body fields the client did not send,
then the paths the router polled on its own. The router binary comes from PATH.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SENT = {  # the fields each call below sends
    "/v1/completions": {"model", "prompt", "max_tokens", "temperature", "stream"},
    "/v1/chat/completions": {"model", "messages", "max_tokens", "temperature", "stream"},
    "/v1/responses": {"model", "input", "max_output_tokens", "temperature", "stream"},
}
seen: list[tuple[str, str, dict]] = []
lock = threading.Lock()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Worker(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _answer(self, obj, status=200, stream=False):
        if stream:
            self.send_response(status)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\ndata: [DONE]\n\n")
            return
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        with lock:
            seen.append(("GET", self.path, {}))
        if self.path.startswith("/v1/models"):
            return self._answer({"object": "list", "data": [
                {"id": "m", "object": "model", "created": 0, "owned_by": "dgr"}]})
        if self.path.startswith("/health"):
            return self._answer({"status": "ok"})
        self._answer({"error": {"message": "not found"}}, 404)

    def do_POST(self):
        n = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {"<not json>": raw[:200].decode("latin-1")}
        with lock:
            seen.append(("POST", self.path, body))
        stream = bool(body.get("stream"))
        if self.path == "/v1/completions":
            return self._answer({"id": "c", "object": "text_completion", "created": 0, "model": "m",
                                 "choices": [{"index": 0, "text": " x", "finish_reason": "stop",
                                              "logprobs": None}],
                                 "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                           "total_tokens": 2}}, stream=stream)
        if self.path == "/v1/chat/completions":
            if stream:
                return self._answer({"id": "c", "object": "chat.completion.chunk", "created": 0,
                                     "model": "m", "choices": [{"index": 0, "delta": {
                                         "role": "assistant", "content": "x"},
                                         "finish_reason": "stop"}]}, stream=True)
            return self._answer({"id": "c", "object": "chat.completion", "created": 0, "model": "m",
                                 "choices": [{"index": 0, "message": {"role": "assistant",
                                                                      "content": "x"},
                                              "finish_reason": "stop"}],
                                 "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                           "total_tokens": 2}})
        if self.path == "/v1/responses":
            response = {"id": "resp_1", "object": "response", "created_at": 0, "model": "m",
                        "status": "completed", "output": [{"type": "message", "id": "msg_1",
                        "role": "assistant", "status": "completed", "content": [
                            {"type": "output_text", "text": "x", "annotations": []}]}],
                        "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}}
            if stream:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                event = {"type": "response.completed", "sequence_number": 0, "response": response}
                self.wfile.write(b"event: response.completed\ndata: " + json.dumps(event).encode()
                                 + b"\n\n")
                return
            return self._answer(response)
        if self.path == "/tokenize":
            return self._answer({"tokens": [1, 2, 3]})
        self._answer({"error": {"message": "not found"}}, 404)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("router", choices=["smg", "vllm-router"])
    parser.add_argument("--policy", default="cache_aware")
    args = parser.parse_args()
    workers = []
    for _ in range(2):
        server = ThreadingHTTPServer(("127.0.0.1", free_port()), Worker)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        workers.append(f"http://127.0.0.1:{server.server_address[1]}")
    port = free_port()
    argv = [args.router] + (["launch"] if args.router == "smg" else []) + [
        "--worker-urls", *workers, "--policy", args.policy, "--host", "127.0.0.1",
        "--port", str(port)]
    router = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import httpx
        import openai
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                if httpx.get(base + "/v1/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        time.sleep(3)  # the router's own polls
        client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
        calls = {
            "completions": lambda: client.completions.create(model="m", prompt="hi", max_tokens=4,
                                                             temperature=0),
            "completions, streamed": lambda: list(client.completions.create(
                model="m", prompt="hi", max_tokens=4, temperature=0, stream=True)),
            "chat": lambda: client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                temperature=0),
            "chat, streamed": lambda: list(client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                temperature=0, stream=True)),
            "responses": lambda: client.responses.create(model="m", input="hi",
                                                         max_output_tokens=4, temperature=0),
            "responses, streamed": lambda: list(client.responses.create(
                model="m", input="hi", max_output_tokens=4, temperature=0, stream=True)),
            "models": lambda: client.models.list(),
            "tokenize": lambda: httpx.post(base + "/tokenize", json={"content": "hi"},
                                           timeout=10).raise_for_status(),
        }
        for name, call in calls.items():
            try:
                call()
                print(f"call {name}: ok")
            except Exception as exc:  # what the client saw
                print(f"call {name}: failed: {type(exc).__name__}: {str(exc)[:160]}")
        time.sleep(1)
    finally:
        router.terminate()
        router.wait(10)
    polled = Counter()
    for method, path, body in seen:
        if path in SENT:
            added = {k: v for k, v in body.items() if k not in SENT[path]}
            print(f"{method} {path} added: {json.dumps(added, sort_keys=True)}")
        elif method == "POST":
            print(f"{method} {path} body: {json.dumps(body, sort_keys=True)[:300]}")
        else:
            polled[f"{method} {path.split('?')[0]}"] += 1
    for path, n in sorted(polled.items()):
        print(f"polled {path}: {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
