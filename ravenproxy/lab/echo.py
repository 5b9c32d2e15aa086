"""The lab's echo pods (UDP): the server answers each datagram with the source address it saw,
so a client learns whether its pod address arrived intact (no SNAT on the way).

``python -m ravenproxy.lab.echo serve IP PORT`` — a pod; ``python -m ravenproxy.lab.echo send
SRC DST PORT`` — one datagram from the pod address SRC, prints the source the far pod saw, or
``timeout``.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable


def serve(ip: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((ip, port))
        while True:
            data, peer = s.recvfrom(2048)
            s.sendto(peer[0].encode() + b" " + data, peer)


def udp_socket() -> socket.socket:
    return socket.socket(socket.AF_INET, socket.SOCK_DGRAM)


def send(
    src: str,
    dst: str,
    port: int,
    timeout: float = 1.0,
    tries: int = 3,
    make_socket: Callable[[], socket.socket] = udp_socket,
) -> str:
    """``make_socket``: where the socket comes from (``lab`` makes it inside a namespace)."""
    with make_socket() as s:
        s.bind((src, 0))
        s.settimeout(timeout)
        for _ in range(tries):
            try:
                s.sendto(b"ping", (dst, port))
                return s.recvfrom(2048)[0].decode().split()[0]
            except OSError:
                continue
    return "timeout"


def main() -> None:
    action, *rest = sys.argv[1:]
    if action == "serve":
        serve(rest[0], int(rest[1]))
    else:
        print(send(rest[0], rest[1], int(rest[2])))


if __name__ == "__main__":
    main()
