"""Where a model's layers go when some are placed on ggml RPC workers: the
handshake check that keeps ggml's client from aborting the process, each
device's share of the layers and its memory check, and the device report.
Plain Python: dgr._rpc connects to the workers and lists their devices,
dgr._engine loads the model with the placement made here."""

from __future__ import annotations

import socket
import struct

from dgr.errors import ModelLoadError

_HELLO = 14        # ggml-rpc.cpp's RPC_CMD_HELLO
_HELLO_CAPS = 24   # bytes of transport capabilities in HELLO and its answer


def check_worker(endpoint: str, proto: tuple[int, int], timeout_s: float = 5.0) -> None:
    """ggml's RPC client aborts the process when it cannot connect or its
    handshake fails: try both first (connect, HELLO, the answer's protocol
    version against `proto`, this build's (major, minor)), each within
    timeout_s. A worker that accepts but does not answer is hung, or busy with
    another node (it serves one connection at a time)."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ModelLoadError(f"RPC worker {endpoint!r} is not host:port")
    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)
    except OSError as exc:
        raise ModelLoadError(f"RPC worker {endpoint} is not reachable: {exc}") from None
    # HELLO with empty transport capabilities; the answer: its size, then major,
    # minor, patch, padding and the capabilities (ggml-rpc.cpp, rpc_msg_hello_*)
    want = 8 + 4 + _HELLO_CAPS
    with sock:
        try:
            sock.sendall(bytes([_HELLO]) + struct.pack("<Q", _HELLO_CAPS) + bytes(_HELLO_CAPS))
            answer = b""
            while len(answer) < want:
                more = sock.recv(want - len(answer))
                if not more:
                    break
                answer += more
        except OSError:
            answer = None
    if answer is None or len(answer) < 8 + 4:
        raise ModelLoadError(f"RPC worker {endpoint} accepted the connection but did not answer "
                             f"ggml's handshake within {timeout_s:g} s (hung, or serving "
                             f"another node)")
    major, minor = answer[8], answer[9]
    if major != proto[0] or minor > proto[1]:
        raise ModelLoadError(f"RPC worker {endpoint} speaks ggml RPC protocol {major}.{minor}; "
                             f"this node speaks {proto[0]}.{proto[1]}")


def layer_shares(offloaded: int, n_devices: int, weights=()) -> list[int]:
    """Repeating layers per device, `offloaded` split in proportion to `weights`
    (default: evenly); the remainder goes to the largest fractions, the first
    devices on a tie."""
    weights = list(weights) or [1.0] * n_devices
    total = sum(weights)
    exact = [offloaded * w / total for w in weights]
    shares = [int(x) for x in exact]
    by_fraction = sorted(range(n_devices), key=lambda j: (shares[j] - exact[j], j))
    for j in by_fraction[:offloaded - sum(shares)]:
        shares[j] += 1
    return shares


def place_layers(devices: list[dict], n_layer: int, rpc_layers: int, split=(),
                 model_bytes: int = 0) -> dict:
    """{"offloaded": repeating layers on workers, "devices": `devices` each with its
    "layers" and whether it holds llama.cpp's output unit ("output": the last
    one, though the engine keeps the output weights here)}. rpc_layers -1: an
    even share for this machine and each device; `split`: the devices' shares
    of the offloaded layers (default: even). A device with less free memory than
    its share of the weights (about model_bytes per layer) is a ModelLoadError."""
    offloaded = rpc_layers if rpc_layers >= 0 else n_layer * len(devices) // (len(devices) + 1)
    if offloaded > n_layer:
        raise ModelLoadError(f"rpc_layers ({offloaded}) exceeds the model's {n_layer} layers")
    if split and len(split) != len(devices):
        raise ModelLoadError(f"rpc_tensor_split has {len(split)} shares for {len(devices)} "
                             f"RPC devices")
    shares = layer_shares(offloaded, len(devices), split)
    for j, (device, layers) in enumerate(zip(devices, shares)):
        device["layers"] = layers
        device["output"] = offloaded > 0 and j == len(devices) - 1
        need = model_bytes * layers // (n_layer + 1)
        if need > device["free_bytes"]:
            raise ModelLoadError(
                f"RPC worker {device['endpoint']} has {device['free_bytes'] >> 20} MiB free; "
                f"its {layers} layers need about {need >> 20} MiB")
    return {"offloaded": offloaded, "devices": devices}


def device_report(placement: dict | None, n_layer: int) -> list[dict]:
    """Where the layers are, for the capability report: this machine (endpoint
    None), then each worker device."""
    local = {"name": "CPU", "endpoint": None, "layers": n_layer}
    if placement is None:
        return [local]
    local["layers"] = n_layer - placement["offloaded"]
    return [local] + [{k: v for k, v in d.items() if k not in ("handle", "output")}
                      for d in placement["devices"]]
