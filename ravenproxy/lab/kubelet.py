"""The kubelet stand-in: what ``ravenproxy lab`` runs on every lab node (on 10250, HTTPS, as
kubelets do), and what the L7 tests and the latency benchmark dial. Plain aiohttp, a process.

``python -m ravenproxy.lab.kubelet --host H --cert F --key F --ca F --ready-file F`` serves,
over TLS on one port (the "kubelet port") and plain HTTP on another (an "exporter" port):

- ``/containerLogs/NS/POD/CONTAINER?follow=true`` — chunked, one line every 50 ms
  (``<seq> <unix time of the write>``), forever; ``&lines=N`` stops after N lines;
- ``/exec/NS/POD/CONTAINER`` — upgrades to a WebSocket (``v5.channel.k8s.io`` framing: the first
  byte of each binary message is the channel) and echoes stdin (0) to stdout (1); ``exit\\n``
  on stdin ends the session with a Success status on channel 3 and a close;
- ``/metrics`` — Prometheus text (``fake_exporter_answer 42``), ``/metrics/cadvisor`` — a
  cAdvisor-style sample (``container_cpu_usage_seconds_total``), ``/healthz``;
- ``/echo`` — reads the body as it streams, answers its size and SHA-256;
- ``/headers`` — the request headers as JSON; ``/whoami`` — the TLS client certificate's CN.

When both ports are bound it writes ``{"tls": PORT, "http": PORT}`` to the ready file.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import ssl
import time
from pathlib import Path

from aiohttp import WSMsgType, web

LOG_INTERVAL = 0.05
CHANNEL_STDIN, CHANNEL_STDOUT, CHANNEL_ERROR, CHANNEL_CLOSE = 0, 1, 3, 255
EXEC_PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")


async def healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


async def metrics(_: web.Request) -> web.Response:
    text = (
        "# HELP fake_exporter_answer A constant the tests read back through Prometheus.\n"
        "# TYPE fake_exporter_answer gauge\n"
        "fake_exporter_answer 42\n"
    )
    return web.Response(text=text, content_type="text/plain")


async def cadvisor(_: web.Request) -> web.Response:
    text = (
        "# HELP container_cpu_usage_seconds_total Cumulative cpu time consumed in seconds.\n"
        "# TYPE container_cpu_usage_seconds_total counter\n"
        'container_cpu_usage_seconds_total{container="app",namespace="default",pod="web-1"} 7\n'
    )
    return web.Response(text=text, content_type="text/plain")


async def container_logs(request: web.Request) -> web.StreamResponse:
    follow = request.query.get("follow") == "true"
    lines = int(request.query.get("lines", "0") or 0) or (None if follow else 5)
    response = web.StreamResponse(headers={"Content-Type": "text/plain"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    seq = 0
    while lines is None or seq < lines:
        await response.write(f"{seq} {time.time():.6f}\n".encode())
        seq += 1
        await asyncio.sleep(LOG_INTERVAL)
    await response.write_eof()
    return response


async def exec_(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse(protocols=EXEC_PROTOCOLS, autoping=True)
    await ws.prepare(request)
    async for msg in ws:
        if msg.type != WSMsgType.BINARY or not msg.data:
            continue
        channel, payload = msg.data[0], msg.data[1:]
        if channel == CHANNEL_STDIN:
            if payload == b"exit\n":
                status = json.dumps({"metadata": {}, "status": "Success"}).encode()
                await ws.send_bytes(bytes([CHANNEL_ERROR]) + status)
                await ws.close()
                break
            await ws.send_bytes(bytes([CHANNEL_STDOUT]) + payload)
        elif channel == CHANNEL_CLOSE:
            await ws.close()
            break
    return ws


async def echo(request: web.Request) -> web.Response:
    digest = hashlib.sha256()
    size = 0
    async for chunk in request.content.iter_any():
        digest.update(chunk)
        size += len(chunk)
    return web.json_response({"bytes": size, "sha256": digest.hexdigest()})


async def headers(request: web.Request) -> web.Response:
    return web.json_response(
        {
            "headers": [[k.decode("latin-1"), v.decode("latin-1")] for k, v in request.raw_headers],
            "path": request.path_qs,
        }
    )


async def whoami(request: web.Request) -> web.Response:
    ssl_object = request.transport.get_extra_info("ssl_object") if request.transport else None
    cn = "anonymous"
    if ssl_object is not None:
        cert = ssl_object.getpeercert()
        if cert:
            for rdn in cert.get("subject", ()):
                for key, value in rdn:
                    if key == "commonName":
                        cn = value
    return web.Response(text=cn)


def build_app() -> web.Application:
    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/metrics/cadvisor", cadvisor)
    app.router.add_get("/containerLogs/{ns}/{pod}/{container}", container_logs)
    app.router.add_get("/exec/{ns}/{pod}/{container}", exec_)
    app.router.add_route("*", "/echo", echo)
    app.router.add_get("/headers", headers)
    app.router.add_get("/whoami", whoami)
    return app


async def serve(
    host: str, cert: str, key: str, ca: str | None, ready_file: Path, tls_port: int, http_port: int
) -> None:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    if ca:
        ctx.load_verify_locations(ca)
        ctx.verify_mode = ssl.CERT_OPTIONAL
    # Large heads (the tests send up to the proxy's limit) must reach the proxy's own check.
    runner = web.AppRunner(
        build_app(), access_log=None, max_line_size=1 << 20, max_field_size=1 << 20
    )
    await runner.setup()
    secure = web.TCPSite(runner, host, tls_port, ssl_context=ctx, backlog=1024)
    plain = web.TCPSite(runner, host, http_port, backlog=1024)
    await secure.start()
    await plain.start()
    ports = [int(a[1]) for a in runner.addresses]
    tmp = ready_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"tls": ports[0], "http": ports[1], "pid": os.getpid()}))
    tmp.replace(ready_file)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--tls-port", type=int, default=0)
    parser.add_argument("--http-port", type=int, default=0)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--ca", help="CA for (optional) client certificates")
    parser.add_argument("--ready-file", required=True, type=Path)
    args = parser.parse_args()
    import uvloop

    main_coro = serve(
        args.host, args.cert, args.key, args.ca, args.ready_file, args.tls_port, args.http_port
    )
    with (
        contextlib.suppress(KeyboardInterrupt),
        asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner,
    ):
        runner.run(main_coro)


if __name__ == "__main__":
    main()
