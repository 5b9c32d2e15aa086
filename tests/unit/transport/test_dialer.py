"""Dialling a target for the cloud: resolve, check against the allowlist, connect (loopback)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import AsyncIterator

import pytest

from ravenproxy.model.allowlist import Allowlist
from ravenproxy.transport.dialer import DialError, dial, resolve
from ravenproxy.wire.codes import ErrorCode
from tests.helpers import free_port


@pytest.fixture
async def listener() -> AsyncIterator[int]:
    """A loopback echo server; yields its port."""

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1024):
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def test_allowed_target_connects(listener: int) -> None:
    allow = Allowlist.parse([f"127.0.0.1:{listener}"])
    dialed = await dial("127.0.0.1", listener, allow, timeout=2)
    try:
        assert dialed.address == f"127.0.0.1:{listener}"
        dialed.writer.write(b"ping")
        await dialed.writer.drain()
        echoed = b""
        while len(echoed) < 4 and (data := await asyncio.wait_for(dialed.reader.read(), 2)):
            echoed += data
        assert echoed == b"ping"
    finally:
        dialed.writer.close()
        await dialed.writer.wait_closed()


async def test_target_not_in_allowlist_is_refused(listener: int) -> None:
    allow = Allowlist.parse([f"127.0.0.1:{listener + 1 if listener < 65535 else 1}"])
    with pytest.raises(DialError) as info:
        await dial("127.0.0.1", listener, allow, timeout=2)
    assert info.value.code is ErrorCode.REFUSED
    assert "allowlist" in info.value.message


async def test_closed_port_is_dial_failed() -> None:
    port = free_port()  # nothing listens on it
    with pytest.raises(DialError) as info:
        await dial("127.0.0.1", port, Allowlist.parse([f"127.0.0.1:{port}"]), timeout=2)
    assert info.value.code is ErrorCode.DIAL_FAILED
    assert f"127.0.0.1:{port}" in info.value.message


async def test_always_denied_address_is_refused_without_dialling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("must not dial")

    monkeypatch.setattr(asyncio, "open_connection", forbidden)
    allow = Allowlist.parse(["0.0.0.0/0:*", "[::/0]:*"])
    for host in ("169.254.169.254", "::ffff:169.254.169.254", "100.100.100.200", "fe80::1"):
        with pytest.raises(DialError) as info:
            await dial(host, 80, allow, timeout=1)
        assert info.value.code is ErrorCode.REFUSED
        assert "never dialled" in info.value.message


async def test_resolve_ip_literal_is_not_looked_up(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()

    async def no_dns(*args: object, **kwargs: object) -> None:
        raise AssertionError("an IP literal needs no DNS")

    monkeypatch.setattr(loop, "getaddrinfo", no_dns)
    assert await resolve("169.254.169.254", 80) == [ipaddress.ip_address("169.254.169.254")]
    assert await resolve("::1", 80) == [ipaddress.ip_address("::1")]


async def test_resolve_checks_every_address_a_name_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A name resolving to a denied address among good ones: only the good one is dialled."""
    loop = asyncio.get_running_loop()

    async def fake_dns(host: str, port: int, **kwargs: object) -> list[tuple[object, ...]]:
        assert host == "sneaky.example"
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", port)),
        ]

    monkeypatch.setattr(loop, "getaddrinfo", fake_dns)
    assert await resolve("sneaky.example", 80) == [ipaddress.ip_address("169.254.169.254")]
    with pytest.raises(DialError) as info:
        await dial("sneaky.example", 80, Allowlist.parse(["0.0.0.0/0:*"]), timeout=1)
    assert info.value.code is ErrorCode.REFUSED


async def test_name_dials_the_checked_address(
    monkeypatch: pytest.MonkeyPatch, listener: int
) -> None:
    loop = asyncio.get_running_loop()

    async def fake_dns(host: str, port: int, **kwargs: object) -> list[tuple[object, ...]]:
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
        ]

    monkeypatch.setattr(loop, "getaddrinfo", fake_dns)
    dialed = await dial("mixed.example", listener, Allowlist.parse(["0.0.0.0/0:*"]), timeout=2)
    try:
        assert dialed.address == f"127.0.0.1:{listener}"
    finally:
        dialed.writer.close()
        await dialed.writer.wait_closed()


async def test_unresolvable_name_is_dial_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()

    async def nxdomain(*args: object, **kwargs: object) -> None:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(loop, "getaddrinfo", nxdomain)
    with pytest.raises(DialError) as info:
        await dial("nope.invalid", 80, Allowlist.parse(["0.0.0.0/0:*"]), timeout=1)
    assert info.value.code is ErrorCode.DIAL_FAILED
    assert "nope.invalid" in info.value.message


async def test_slow_connect_is_dial_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    async def hang(*args: object, **kwargs: object) -> None:
        await asyncio.sleep(10)

    loop = asyncio.get_running_loop()
    monkeypatch.setattr(loop, "create_connection", hang)
    started = loop.time()
    with pytest.raises(DialError) as info:
        await dial("127.0.0.1", 9, Allowlist.parse(["127.0.0.1:9"]), timeout=0.1)
    assert info.value.code is ErrorCode.DIAL_TIMEOUT
    assert "timed out after 0.1s" in info.value.message
    assert loop.time() - started < 2
