"""The client side of ``lab check`` rows that curl cannot do: a ``kubectl exec``-style
WebSocket session (``v5.channel.k8s.io``: first byte of each message is the channel).

``python -m ravenproxy.lab.probe exec URL --host NODE:PORT --ca F --text T`` — run inside a lab
host; sends T on stdin, prints what came back on stdout, exits 0 when it is T.
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import sys

import aiohttp

CHANNEL_STDIN, CHANNEL_STDOUT = 0, 1


async def exec_echo(url: str, host: str, ca: str, text: str, timeout: float = 5.0) -> str:
    ctx = ssl.create_default_context(cafile=ca)
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(
            url,
            headers={"Host": host},
            protocols=("v5.channel.k8s.io",),
            ssl=ctx,
            timeout=aiohttp.ClientWSTimeout(ws_receive=timeout),
        ) as ws,
    ):
        await ws.send_bytes(bytes([CHANNEL_STDIN]) + text.encode())
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.BINARY and msg.data[:1] == bytes([CHANNEL_STDOUT]):
                return bytes(msg.data[1:]).decode()
        return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("action", choices=("exec",))
    parser.add_argument("url")
    parser.add_argument("--host", required=True)
    parser.add_argument("--ca", required=True)
    parser.add_argument("--text", default="hello lab\n")
    args = parser.parse_args()
    try:
        got = asyncio.run(exec_echo(args.url, args.host, args.ca, args.text))
    except (OSError, aiohttp.ClientError, TimeoutError) as exc:
        print(f"error: {exc!r}")
        sys.exit(1)
    print(got, end="")
    sys.exit(0 if got == args.text else 1)


if __name__ == "__main__":
    main()
