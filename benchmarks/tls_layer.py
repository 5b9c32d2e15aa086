"""The tunnel's TLS layer alone: bulk bytes one way over loopback TLS 1.3 (the tunnel's mutual
TLS contexts), both ends in one uvloop process, so the CPU time is the TLS layer's and the
kernel's and nothing else's. ``sslproto``: the event loop's memory-BIO TLS
(``create_server``/``create_connection`` with ``ssl=``), as the tunnel ran before;
``tls_socket``: :mod:`ravenproxy.transport.tls_socket` on both ends. The rounds alternate, so
a noisy host weighs on both alike; rows report the median. Not a timed test: a measurement.

    .venv/bin/python benchmarks/tls_layer.py --mib 1024 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import cast

import uvloop

from ravenproxy.pki import init_pki
from ravenproxy.transport.tls import client_context, server_context
from ravenproxy.transport.tls_handshake import handshake, open_client
from ravenproxy.transport.tls_socket import TLSSocketTransport

MODES = ("sslproto", "tls_socket")


class Sink(asyncio.BufferedProtocol):
    def __init__(self, total: int, done: asyncio.Future[None]) -> None:
        self.buf = bytearray(256 * 1024)
        self.received = 0
        self.total = total
        self.done = done

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.buf

    def buffer_updated(self, nbytes: int) -> None:
        self.received += nbytes
        if self.received >= self.total and not self.done.done():
            self.done.set_result(None)


class Source(asyncio.Protocol):
    def __init__(self) -> None:
        self.can_write = asyncio.Event()
        self.can_write.set()

    def pause_writing(self) -> None:
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.can_write.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.can_write.set()


async def one_run(mode: str, pki: Path, mib: int) -> tuple[float, float]:
    """(MB/s, CPU seconds per GiB of both ends) for ``mib`` MiB."""
    loop = asyncio.get_running_loop()
    srv = server_context(pki / "ca.crt", pki / "server.crt", pki / "server.key")
    cli = client_context(pki / "ca.crt", pki / "edge-1.crt", pki / "edge-1.key")
    total = mib * 1024 * 1024
    done: asyncio.Future[None] = loop.create_future()
    server: asyncio.Server | None = None
    transport: asyncio.BaseTransport
    source: asyncio.BaseProtocol
    if mode == "sslproto":
        server = await loop.create_server(lambda: Sink(total, done), "127.0.0.1", 0, ssl=srv)
        port = server.sockets[0].getsockname()[1]
        transport, source = await loop.create_connection(
            Source, "127.0.0.1", port, ssl=cli, server_hostname="127.0.0.1"
        )
    else:
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setblocking(False)

        async def accept() -> None:
            raw, _ = await loop.sock_accept(listener)
            sock = srv.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
            await handshake(sock, 10)
            TLSSocketTransport(loop, sock, Sink(total, done))

        accepting = asyncio.create_task(accept(), name="bench-accept")
        port = listener.getsockname()[1]
        transport, source = await open_client(
            Source, "127.0.0.1", port, ssl_context=cli, server_hostname="127.0.0.1",
            handshake_timeout=10,
        )  # fmt: skip
        await accepting
        listener.close()
    assert isinstance(source, Source)
    transport = cast(asyncio.WriteTransport, transport)  # uvloop's TLS one is not a subclass
    transport.set_write_buffer_limits(high=1024 * 1024)
    chunk = os.urandom(1024 * 1024)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(mib):
        await source.can_write.wait()
        transport.write(chunk)
    await done
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    transport.close()
    if server is not None:
        server.close()
    await asyncio.sleep(0.1)
    return total / wall / 1e6, cpu * 1024 / mib


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=1024, help="MiB per run (1024)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (3)")
    opts = parser.parse_args()
    pki = Path(tempfile.mkdtemp(prefix="tls-layer-"))
    init_pki(pki, agents=["edge-1"])
    runs: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    for _ in range(opts.repeat):
        for mode in MODES:
            runs[mode].append(uvloop.run(one_run(mode, pki, opts.mib)))
    print(f"TLS layer, {opts.mib} MiB one way, both ends in one process (nproc={os.cpu_count()})")
    for mode in MODES:
        rate = statistics.median(r[0] for r in runs[mode])
        cpu = statistics.median(r[1] for r in runs[mode])
        each = ", ".join(f"{r[1]:.2f}" for r in runs[mode])
        print(f"  {mode:11s} {rate:7.1f} MB/s  CPU {cpu:.2f} s/GiB  (runs: {each})")


if __name__ == "__main__":
    main()
