"""The kubernetes_asyncio client factory and raw JSON calls, for the callers that still hold
that client: the controller (writer, leader election, issuer, agent Leases, model source) and
the dns command's ConfigMap feed. The agent (model source, WireGuard key publisher, --cert-dir
requester) and the server (model, certificates, agent Leases) use :mod:`.rest` instead,
which loads neither kubernetes_asyncio nor aiohttp (~48 MB of an idle process).

Responses are read raw (``_preload_content=False``): the model parsers take Kubernetes JSON, and
skipping the client's model classes keeps one code path for the YAML inventory and the API.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config

from ravenproxy.kube.rest import MERGE_PATCH, KubeError, as_object, resource_version

__all__ = [
    "MERGE_PATCH",
    "KubeError",
    "MethodListWatch",
    "new_api_client",
    "raw_call",
    "resource_version",
]


async def new_api_client(kubeconfig: Path | None) -> k8s_client.ApiClient:
    """An API client from a kubeconfig file, or from the in-cluster service account."""
    if kubeconfig is not None:
        try:
            return await k8s_config.new_client_from_config(config_file=str(kubeconfig))
        except (OSError, k8s_config.ConfigException) as exc:
            raise KubeError(0, f"{kubeconfig}: cannot load kubeconfig: {exc}") from None
    cfg = k8s_client.Configuration()
    try:
        k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    except k8s_config.ConfigException as exc:
        raise KubeError(0, f"not in a cluster and no --kubeconfig given: {exc}") from None
    return k8s_client.ApiClient(cfg)


async def raw_call(
    fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any
) -> tuple[int, dict[str, Any]]:
    """One API call through a kubernetes_asyncio method, answered as (status, JSON object).

    Errors are not raised: the caller decides what each status means (a 409 on create, a 404 on
    delete). A body that is not a JSON object (204, an empty answer) reads as ``{}``.
    """
    resp: aiohttp.ClientResponse = await fn(*args, **kwargs, _preload_content=False)
    try:
        body = as_object(await resp.read()) if resp.status != 204 else {}
    finally:
        resp.release()
    return resp.status, body


class _Answer:
    """An aiohttp response as a :class:`ravenproxy.kube.reflector.Answer`."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status

    async def json(self) -> dict[str, Any]:
        return as_object(await self._resp.read())

    async def lines(self) -> AsyncIterator[bytes]:
        async for line in self._resp.content:
            if line.strip():
                yield line


@contextlib.contextmanager
def _connection_errors() -> Iterator[None]:
    """aiohttp's errors as ``ConnectionError``, as the REST client raises them."""
    try:
        yield
    except aiohttp.ClientError as exc:
        raise ConnectionError(f"{type(exc).__name__}: {exc}") from exc


class MethodListWatch:
    """A kubernetes_asyncio list method (with its arguments) as a reflector's list and watch;
    aiohttp's errors come out as ``ConnectionError``, as the REST client's do."""

    def __init__(
        self,
        fn: Callable[..., Awaitable[Any]],
        kwargs: Mapping[str, Any],
        connect_timeout: float = 10.0,
    ) -> None:
        self._fn = fn
        self._kwargs = dict(kwargs)
        self._connect_timeout = connect_timeout

    async def list(self, timeout: float) -> tuple[int, dict[str, Any]]:
        with _connection_errors():
            return await raw_call(
                self._fn, **self._kwargs, _request_timeout=(self._connect_timeout, timeout)
            )

    @contextlib.asynccontextmanager
    async def watch(
        self, resource_version: str, timeout_seconds: int, read_timeout: float
    ) -> AsyncIterator[_Answer]:
        with _connection_errors():
            resp: aiohttp.ClientResponse = await self._fn(
                **self._kwargs,
                watch=True,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout_seconds,
                # sock_read: a watch with nothing to say for this long is a dead connection.
                _request_timeout=(self._connect_timeout, read_timeout),
                _preload_content=False,
            )
        try:
            with _connection_errors():
                yield _Answer(resp)
        finally:
            resp.release()
