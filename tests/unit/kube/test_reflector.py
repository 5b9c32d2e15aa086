"""A reflector behind something that is not kube-apiserver (a misbehaving proxy): what it cannot
read is a failed watch, logged and retried, never the end of the reflector's task (it keeps the
CA bundle, the CSR watches and the model fed)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiohttp import web

from ravenproxy.kube.kubeconfig import ClusterAccess
from ravenproxy.kube.reflector import Reflector, Resource, WatchSettings
from ravenproxy.kube.rest import RestClient
from tests.helpers import eventually

FAST = WatchSettings(watch_timeout=5, backoff_initial=0.05, backoff_max=0.1)


@pytest.mark.parametrize("line", [b"[]", b'"text"', b'{"type": "ADDED", "object": []}', b"7"])
async def test_a_watch_line_that_is_not_an_event_is_retried_not_fatal(
    line: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "ravenproxy.kube.reflector")
    watches = 0

    async def nodes(request: web.Request) -> web.StreamResponse:
        nonlocal watches
        if request.query.get("watch") != "true":
            return web.json_response(
                {"metadata": {"resourceVersion": "1"}, "items": [{"metadata": {"name": "a"}}]}
            )
        watches += 1
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(line + b"\n")
        return resp

    app = web.Application()
    app.router.add_get("/api/v1/nodes", nodes)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    client = RestClient(ClusterAccess(f"http://127.0.0.1:{port}"))
    reflector = Reflector("nodes", Resource(client, "/api/v1/nodes"), lambda: None, FAST)
    task = asyncio.create_task(reflector.run(), name="test-reflector")
    try:
        await eventually(lambda: watches >= 3, 10, what="watches retried")
        assert not task.done()
        assert list(reflector.objects) == ["a"]
        failed = [r for r in caplog.records if r.getMessage() == "kube: watch failed, retrying"]
        assert "not an event object" in str(failed[0].fields["error"])  # type: ignore[attr-defined]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()
        await runner.cleanup()
