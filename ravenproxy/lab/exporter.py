"""The metrics exporter of the lab's edge pod: Prometheus text on ``/metrics``, as a
node-exporter or an application's exporter would serve it (plain HTTP).

``python -m ravenproxy.lab.exporter --host H --port P --node NODE`` — bound to H (0.0.0.0 in
the lab: reached at the pod IP and at the node's address, like a hostPort), it counts its
scrapes so that each one is seen to arrive.
"""

from __future__ import annotations

import argparse
import asyncio

from aiohttp import web

SCRAPES = web.AppKey("scrapes", list)
NODE = web.AppKey("node", str)


async def metrics(request: web.Request) -> web.Response:
    scrapes: list[int] = request.app[SCRAPES]
    scrapes[0] += 1
    node = request.app[NODE]
    text = (
        "# HELP lab_exporter_up The lab's edge exporter answers.\n"
        "# TYPE lab_exporter_up gauge\n"
        f'lab_exporter_up{{node="{node}"}} 1\n'
        "# HELP lab_exporter_scrapes_total Scrapes served.\n"
        "# TYPE lab_exporter_scrapes_total counter\n"
        f"lab_exporter_scrapes_total {scrapes[0]}\n"
    )
    return web.Response(text=text, content_type="text/plain")


def build_app(node: str) -> web.Application:
    app = web.Application()
    app[SCRAPES] = [0]
    app[NODE] = node
    app.router.add_get("/metrics", metrics)
    return app


async def serve(host: str, port: int, node: str) -> None:
    runner = web.AppRunner(build_app(node), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=9400)
    parser.add_argument("--node", default="")
    args = parser.parse_args()
    asyncio.run(serve(args.host, args.port, args.node))


if __name__ == "__main__":
    main()
