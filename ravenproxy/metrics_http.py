"""The HTTP endpoint of a component's metrics and health (aiohttp): ``/metrics``, ``/healthz``,
``/readyz``. Its own module so that a process serving none of them (an agent without
``--metrics-addr``/``--health-addr``) never loads aiohttp's server."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from ravenproxy.config import Address
from ravenproxy.lifecycle import listening


def _health_routes(
    app: web.Application, ready: Callable[[], tuple[bool, str]] | None
) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        ok, why = ready() if ready is not None else (True, "ready")
        return web.Response(status=200 if ok else 503, text=why + "\n")

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


def metrics_app(
    registry: CollectorRegistry,
    ready: Callable[[], tuple[bool, str]] | None = None,
) -> web.Application:
    """``/metrics`` in the Prometheus text format, ``/healthz`` (alive) and ``/readyz``: what a
    ``--metrics-addr`` serves (loopback by default)."""

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return _health_routes(app, ready)


def health_app(ready: Callable[[], tuple[bool, str]] | None = None) -> web.Application:
    """``/healthz`` and ``/readyz`` alone (404 for anything else): what a ``--health-addr``
    serves, usually on every interface for the kubelet's probes, so it shows nothing more."""
    return _health_routes(web.Application(), ready)


async def start_app(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve ``app``; return its runner (for cleanup) and the bound port (``port`` may be 0)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host or None, port)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()  # a listener that cannot bind leaves nothing behind
        raise
    bound = port
    for address in runner.addresses:
        bound = int(address[1])
        break
    return runner, bound


@contextlib.asynccontextmanager
async def serving(flag: str, addr: Address, app: web.Application) -> AsyncIterator[int]:
    """Serve ``app`` on ``addr`` (the value of ``flag``) while the block runs; yields the bound
    port. An address that cannot be bound is a :class:`~ravenproxy.errors.ConfigError` naming
    ``flag``."""
    async with listening(flag, addr):
        runner, port = await start_app(app, addr.host, addr.port)
    try:
        yield port
    finally:
        await runner.cleanup()
