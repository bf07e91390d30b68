"""What the network to each RPC worker carries, read from the kernel.

ggml's RPC client keeps one TCP connection per worker for the life of the
process and exposes no counters of its own. The kernel keeps them: for every
established connection of this process to a worker, TCP_INFO gives the bytes
sent (acknowledged) and received and the smoothed round-trip time. Read at
scrape time only, so a step pays nothing for them. Linux only: elsewhere
`figures` reports nothing.
"""

from __future__ import annotations

import os
import socket
import struct

import attrs

# struct tcp_info (linux/tcp.h): 8 bytes of u8 fields, then u32 fields (tcpi_rtt is the
# 16th, in microseconds), then u64 pacing rates and tcpi_bytes_acked, tcpi_bytes_received
_RTT_OFFSET = 8 + 15 * 4
_BYTES_OFFSET = 8 + 24 * 4 + 2 * 8
_TCP_INFO_LEN = _BYTES_OFFSET + 16


@attrs.frozen
class LinkFigures:
    """One worker's connections from this process, summed (RTT: the largest)."""

    connections: int
    bytes_sent: int
    bytes_received: int
    rtt_s: float


def _hex_address(host: str, port: int) -> str:
    """An IPv4 address as /proc/net/tcp writes it (little-endian hex, port in hex)."""
    packed = socket.inet_aton(socket.gethostbyname(host))
    return f"{struct.unpack('<I', packed)[0]:08X}:{port:04X}"


class RpcLinks:
    """Finds this process's connections to the given workers and reads their figures."""

    def __init__(self, endpoints: tuple[str, ...]):
        self._remote: dict[str, str] = {}
        for endpoint in endpoints:
            host, _, port = endpoint.rpartition(":")
            try:
                self._remote[endpoint] = _hex_address(host.strip("[]"), int(port))
            except (OSError, ValueError):
                continue  # not IPv4: no figures for it

    def figures(self) -> dict[str, LinkFigures]:
        if not self._remote or not hasattr(socket, "TCP_INFO"):
            return {}
        inodes = self._established_inodes()
        found: dict[str, list[tuple[int, int, float]]] = {e: [] for e in self._remote}
        for fd, inode in self._socket_fds():
            endpoint = inodes.get(inode)
            if endpoint is None:
                continue
            info = _tcp_info(fd)
            if info is not None:
                found[endpoint].append(info)
        return {endpoint: LinkFigures(len(infos), sum(i[0] for i in infos),
                                      sum(i[1] for i in infos), max((i[2] for i in infos), default=0.0))
                for endpoint, infos in found.items()}

    def _established_inodes(self) -> dict[str, str]:
        """inode -> endpoint for established connections to a worker."""
        by_address = {address: endpoint for endpoint, address in self._remote.items()}
        inodes = {}
        try:
            with open("/proc/self/net/tcp") as table:
                next(table)
                for line in table:
                    fields = line.split()
                    endpoint = by_address.get(fields[2])
                    if endpoint is not None and fields[3] == "01":  # TCP_ESTABLISHED
                        inodes[fields[9]] = endpoint
        except OSError:
            return {}
        return inodes

    @staticmethod
    def _socket_fds():
        try:
            names = os.listdir("/proc/self/fd")
        except OSError:
            return
        for name in names:
            try:
                target = os.readlink(f"/proc/self/fd/{name}")
            except OSError:
                continue
            if target.startswith("socket:["):
                yield int(name), target[8:-1]


def _tcp_info(fd: int):
    """(bytes sent and acknowledged, bytes received, smoothed RTT in seconds) of a
    TCP socket, read through a duplicate of its descriptor."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    except OSError:
        return None
    finally:
        sock.close()
    if len(raw) < _TCP_INFO_LEN:
        return None
    rtt_us, = struct.unpack_from("<I", raw, _RTT_OFFSET)
    sent, received = struct.unpack_from("<QQ", raw, _BYTES_OFFSET)
    return sent, received, rtt_us * 1e-6
