"""The tunnel's TLS layer alone: bulk bytes one way over loopback TLS 1.3 (the tunnel's mutual
TLS contexts), both ends in one uvloop process, so the CPU time is the TLS layer's and the
kernel's and nothing else's. ``sslproto``: the event loop's memory-BIO TLS
(``create_server``/``create_connection`` with ``ssl=``), as the tunnel ran before;
``tls_socket``: :mod:`ravenproxy.transport.tls_socket` on both ends; ``membio``: a memory-BIO
transport built for bulk (``membio_proto.py``: one big ``recv``/``send`` per ``--bio-chunk``
instead of two ``recv`` and one ``send`` per 16 KiB record) on both ends; ``membio_write`` /
``membio_read``: it on the sending / receiving end only, ``tls_socket`` on the other (the two
speak the same TLS), to tell the two directions apart. The rounds alternate (each round's order
reversed from the last), so a noisy host weighs on all alike; rows report the median and the
median ratio to the first row's run of the same round. Not a timed test: a measurement.

    taskset -c 1 .venv/bin/python benchmarks/tls_layer.py --mib 256 --repeat 14
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
from membio_proto import MemBIOTransport, handshake_bio  # beside this script

from ravenproxy.pki import init_pki
from ravenproxy.transport.tls import client_context, server_context
from ravenproxy.transport.tls_handshake import handshake, open_client
from ravenproxy.transport.tls_socket import TLSSocketTransport

MODES = ("tls_socket", "sslproto", "membio", "membio_write", "membio_read")  # 1st: ratios
# each mode's (sending end, receiving end): tls_socket and membio ends speak the same TLS
ENDS = {
    "tls_socket": ("sock", "sock"),
    "membio": ("bio", "bio"),
    "membio_write": ("bio", "sock"),
    "membio_read": ("sock", "bio"),
}
BIO_CHUNK = [256 * 1024]  # --bio-chunk


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


class Source(asyncio.BufferedProtocol):
    def __init__(self) -> None:
        self.can_write = asyncio.Event()
        self.can_write.set()
        self.buf = bytearray(16 * 1024)  # nothing comes back but TLS's own messages

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.buf

    def buffer_updated(self, nbytes: int) -> None:
        pass

    def pause_writing(self) -> None:
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.can_write.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.can_write.set()


async def one_run(mode: str, pki: Path, mib: int) -> tuple[float, float, float]:
    """(MB/s, CPU seconds per GiB of both ends, of which in the kernel) for ``mib`` MiB."""
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
        send_end, recv_end = ENDS[mode]
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setblocking(False)

        async def accept() -> None:
            raw, _ = await loop.sock_accept(listener)
            raw.setblocking(False)
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if recv_end == "bio":
                obj, inc, out = await handshake_bio(
                    raw, srv, server_side=True, server_hostname=None
                )
                MemBIOTransport(loop, raw, obj, inc, out, Sink(total, done), BIO_CHUNK[0])
                return
            sock = srv.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
            await handshake(sock, 10)
            TLSSocketTransport(loop, sock, Sink(total, done))

        accepting = asyncio.create_task(accept(), name="bench-accept")
        port = listener.getsockname()[1]
        if send_end == "bio":
            raw = socket.create_connection(("127.0.0.1", port))
            raw.setblocking(False)
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            obj, inc, out = await handshake_bio(
                raw, cli, server_side=False, server_hostname="127.0.0.1"
            )
            source = Source()
            transport = MemBIOTransport(loop, raw, obj, inc, out, source, BIO_CHUNK[0])
        else:
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
    t0, wall0 = os.times(), time.perf_counter()
    for _ in range(mib):
        await source.can_write.wait()
        transport.write(chunk)
    await done
    t1, wall = os.times(), time.perf_counter() - wall0
    sys_cpu = t1.system - t0.system
    cpu = t1.user - t0.user + sys_cpu
    transport.close()
    if server is not None:
        server.close()
    await asyncio.sleep(0.1)
    return total / wall / 1e6, cpu * 1024 / mib, sys_cpu * 1024 / mib


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=1024, help="MiB per run (1024)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (3)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated rows")
    parser.add_argument(
        "--bio-chunk", type=int, default=256, help="membio: KiB per recv / per send (256)"
    )
    opts = parser.parse_args()
    BIO_CHUNK[0] = opts.bio_chunk * 1024
    modes = opts.modes.split(",")
    pki = Path(tempfile.mkdtemp(prefix="tls-layer-"))
    init_pki(pki, agents=["edge-1"])
    runs: dict[str, list[tuple[float, float, float]]] = {mode: [] for mode in modes}
    for i in range(opts.repeat):
        for mode in modes if i % 2 == 0 else modes[::-1]:
            runs[mode].append(uvloop.run(one_run(mode, pki, opts.mib)))
    print(f"TLS layer, {opts.mib} MiB one way, both ends in one process (nproc={os.cpu_count()})")
    for mode in modes:
        rate = statistics.median(r[0] for r in runs[mode])
        cpu = statistics.median(r[1] for r in runs[mode])
        kernel = statistics.median(r[2] for r in runs[mode])
        each = ", ".join(f"{r[1]:.2f}" for r in runs[mode])
        # the same round's runs are neighbours in time: their ratio shrugs off a host whose
        # speed drifts between rounds
        paired = statistics.median(
            r[1] / b[1] for r, b in zip(runs[mode], runs[modes[0]], strict=True)
        )
        print(
            f"  {mode:12s} {rate:7.1f} MB/s  CPU {cpu:.2f} s/GiB, kernel {kernel:.2f}"
            f"  x{paired:.3f} of {modes[0]} (paired)  (runs: {each})"
        )


if __name__ == "__main__":
    main()
