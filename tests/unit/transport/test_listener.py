"""Listening sockets as asyncio binds them (transport/listener.py), and the start-up check of a
listening flag that binds the same way (lifecycle.check_listen)."""

from __future__ import annotations

import errno
import os
import socket
from typing import Any

import pytest

from ravenproxy.config import parse_address
from ravenproxy.errors import ConfigError
from ravenproxy.lifecycle import check_listen
from ravenproxy.transport.listener import BindError, bind_each
from tests.helpers import free_port


class NoIPv6Socket(socket.socket):
    """A host booted with ``ipv6.disable=1``: getaddrinfo still offers ``::`` for every
    interface, but an IPv6 socket cannot be made (EAFNOSUPPORT)."""

    def __init__(self, family: int = -1, type: int = -1, proto: int = -1, fileno: Any = None):
        if family == socket.AF_INET6:
            raise OSError(errno.EAFNOSUPPORT, os.strerror(errno.EAFNOSUPPORT))
        super().__init__(family, type, proto, fileno)


def every_interface(port: int) -> list[Any]:
    return socket.getaddrinfo(None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)


def test_each_family_gets_its_socket_ipv6_only() -> None:
    infos = every_interface(0)
    if {info[0] for info in infos} != {socket.AF_INET, socket.AF_INET6}:
        pytest.skip("this host does not resolve every interface to both families")
    sockets = bind_each(infos)
    try:
        by_family = {sock.family: sock for sock in sockets}
        assert set(by_family) == {socket.AF_INET, socket.AF_INET6}
        v6 = by_family[socket.AF_INET6]
        assert v6.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1
        assert all(s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) for s in sockets)
    finally:
        for sock in sockets:
            sock.close()


def test_a_family_the_host_lacks_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "socket", NoIPv6Socket)
    sockets = bind_each(every_interface(0))
    try:
        assert [s.family for s in sockets] == [socket.AF_INET]
    finally:
        for sock in sockets:
            sock.close()


def test_no_family_at_all_names_the_first_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "socket", NoIPv6Socket)
    infos = socket.getaddrinfo("::1", 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    with pytest.raises(BindError) as caught:
        bind_each(infos)
    assert caught.value.errno == errno.EAFNOSUPPORT
    assert str(caught.value) == (
        "error while attempting to bind on address ('::1', 0, 0, 0): "
        "Address family not supported by protocol"
    )


def test_an_address_in_use_leaves_no_socket_open() -> None:
    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    infos = [
        *socket.getaddrinfo("127.0.0.2", port, type=socket.SOCK_STREAM),
        *socket.getaddrinfo("127.0.0.1", port, type=socket.SOCK_STREAM),
    ]
    before = set(os.listdir("/proc/self/fd"))
    try:
        with pytest.raises(BindError, match=r"127\.0\.0\.1.*Address already in use"):
            bind_each(infos)
        assert set(os.listdir("/proc/self/fd")) <= before  # 127.0.0.2's socket closed too
    finally:
        taken.close()


def test_the_start_up_check_passes_every_interface_without_ipv6(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = free_port()
    monkeypatch.setattr(socket, "socket", NoIPv6Socket)
    check_listen("--listen", parse_address(f":{port}", "--listen"))


def test_the_start_up_check_refuses_an_address_of_no_family_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = free_port()
    monkeypatch.setattr(socket, "socket", NoIPv6Socket)
    with pytest.raises(ConfigError) as caught:
        check_listen("--listen", parse_address(f"[::1]:{port}", "--listen"))
    assert str(caught.value) == (
        f"--listen: cannot listen on [::1]:{port}: Address family not supported by protocol"
    )
