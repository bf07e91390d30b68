"""`python -m dgr run` as a process: start-up errors, SIGTERM drain, second signal."""

import json
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.subprocess


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_node(*args):
    return subprocess.Popen([sys.executable, "-m", "dgr", "run", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_healthy(url, proc, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError("node never became healthy")


def error_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("dgr: error:")]


def test_missing_model_is_one_line_and_exit_2(tmp_path):
    proc = run_node("--model", str(tmp_path / "gone.gguf"), "--port", str(free_port()))
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2
    (line,) = error_lines(stderr)
    assert "gone.gguf" in line and "not found" in line


def test_corrupt_model_is_one_line_and_exit_2(tiny_model, tmp_path):
    bad = tmp_path / "corrupt.gguf"
    bad.write_bytes(open(tiny_model, "rb").read()[:5000])
    proc = run_node("--model", str(bad), "--port", str(free_port()))
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2
    (line,) = error_lines(stderr)
    assert "corrupt.gguf" in line


def test_bad_flag_values_exit_2(tiny_model):
    proc = run_node("--model", tiny_model, "--max-running", "0")
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "max_running" in error_lines(stderr)[0]


def test_sigterm_drains_in_flight_then_exits_0(tiny_model):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = run_node("--model", tiny_model, "--port", str(port), "--grace", "30", "--ctx", "16384",
                    "--threads", "1")
    try:
        wait_healthy(url, proc)
        result = {"events": []}
        streaming = threading.Event()

        def long_request():
            # streamed: its first token says it is in flight, however fast the model
            with httpx.stream("POST", url + "/v1/completions", timeout=60, json={
                    "prompt": "drain me", "max_tokens": 6000, "temperature": 0,
                    "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}}) as response:
                result["status"] = response.status_code
                for line in response.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        result["events"].append(json.loads(line[6:]))
                        streaming.set()
            streaming.set()

        client = threading.Thread(target=long_request)
        client.start()
        assert streaming.wait(30)
        proc.send_signal(signal.SIGTERM)
        client.join(60)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert result["status"] == 200
    choices = [e["choices"][0] for e in result["events"] if e["choices"]]
    assert choices[-1]["finish_reason"] == "length"
    assert result["events"][-1]["usage"]["completion_tokens"] == 6000


def test_second_sigterm_exits_at_once(tiny_model):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # 16,000 tokens of the tiny model take seconds: the session outlives both signals.
    proc = run_node("--model", tiny_model, "--port", str(port), "--grace", "300", "--threads", "1",
                    "--ctx", "262144")
    try:
        wait_healthy(url, proc)

        def endless():
            try:
                httpx.post(url + "/v1/completions", timeout=60, json={
                    "prompt": "never done", "max_tokens": 16000, "temperature": 0,
                    "ignore_eos": True, "stream": True})
            except httpx.HTTPError:
                pass

        client = threading.Thread(target=endless, daemon=True)
        client.start()
        while httpx.get(url + "/capabilities").json()["load"]["active"] == 0:
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        assert proc.poll() is None  # draining: the grace period is long
        proc.send_signal(signal.SIGTERM)
        # Without the second signal the drain would wait the 300 s grace period.
        assert proc.wait(60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
