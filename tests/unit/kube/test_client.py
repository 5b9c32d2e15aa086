"""kubernetes_asyncio's list methods as a reflector's list and watch (the controller's and
``dns``'s feeds): a failing connection comes out as ``ConnectionError``, as from our REST client,
so the reflector retries it the same way."""

from __future__ import annotations

import socket

import pytest
from kubernetes_asyncio import client as k8s_client

from ravenproxy.kube.client import MethodListWatch


async def test_an_api_nobody_answers_is_a_connection_error_on_list_and_watch() -> None:
    with socket.socket() as held:  # bound, not listening: connections are refused
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        config = k8s_client.Configuration(host=f"http://127.0.0.1:{port}")
        async with k8s_client.ApiClient(config) as api:
            source = MethodListWatch(k8s_client.CoreV1Api(api).list_node, {}, 2.0)
            with pytest.raises(ConnectionError, match="ClientConnectorError"):
                await source.list(2.0)
            with pytest.raises(ConnectionError, match="ClientConnectorError"):
                async with source.watch("1", 10, 2.0):
                    pass
