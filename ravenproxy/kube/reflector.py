"""A local cache of one Kubernetes resource, kept by list-then-watch.

Each resource is kept by a :class:`Reflector` (kopf's and client-go's pattern): list, remember
the list's resourceVersion, watch from it, apply ADDED/MODIFIED/DELETED to a local cache; a watch
that ends normally is resumed from the last resourceVersion seen (bookmarks included); "410 Gone"
(the version was compacted away) means relist; every ``resync`` seconds a relist runs anyway as a
level-triggered safety net. Other failures retry with capped exponential backoff.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ravenproxy.kube.rest import KubeError, RestClient, resource_version, status_message
from ravenproxy.log import kv

log = logging.getLogger(__name__)

ListFn = Callable[..., Awaitable[Any]]
"""A kubernetes_asyncio list method (``CoreV1Api.list_node``...), for the callers that still
hold that client (the controller's issuer and agent Leases, the dns command's feed)."""


class Gone(Exception):
    """The watched resourceVersion is no longer available: relist."""


class Absent(Exception):
    """An optional resource type does not exist in this cluster (its CRD is not installed)."""


class Answer(Protocol):
    """What a watch request answered: a status, then its error body or its event lines."""

    status: int

    async def json(self) -> dict[str, Any]: ...

    def lines(self) -> AsyncIterator[bytes]: ...


@runtime_checkable
class ListWatch(Protocol):
    """How a :class:`Reflector` lists and watches its resource."""

    async def list(self, timeout: float) -> tuple[int, dict[str, Any]]: ...

    def watch(
        self, resource_version: str, timeout_seconds: int, read_timeout: float
    ) -> AbstractAsyncContextManager[Answer]: ...


class Resource:
    """One collection on a :class:`RestClient`: ``path`` (``/api/v1/nodes``,
    ``/apis/GROUP/VERSION/PLURAL``) with a fixed ``query`` (a label or field selector)."""

    def __init__(self, client: RestClient, path: str, **query: Any) -> None:
        self.client = client
        self.path = path
        self.query = query

    async def list(self, timeout: float) -> tuple[int, dict[str, Any]]:
        return await self.client.request("GET", self.path, query=self.query, timeout=timeout)

    @asynccontextmanager
    async def watch(
        self, resource_version: str, timeout_seconds: int, read_timeout: float
    ) -> AsyncIterator[Answer]:
        query = {
            **self.query,
            "watch": True,
            "resourceVersion": resource_version,
            "allowWatchBookmarks": True,
            "timeoutSeconds": timeout_seconds,
        }
        async with self.client.open(
            "GET", self.path, query=query, read_timeout=read_timeout
        ) as resp:
            yield resp


@dataclass(frozen=True)
class WatchSettings:
    """How a reflector lists and watches: timeouts, resync period, backoff."""

    # Server-side timeoutSeconds of one watch request; the watch is then resumed, which also
    # catches half-open connections that would otherwise hang forever.
    watch_timeout: int = 290
    # Full relist period even when watches work: level-triggered reconciliation.
    resync: float = 600.0
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    connect_timeout: float = 10.0


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    name = str(meta.get("name", ""))
    return f"{ns}/{name}" if ns else name


class Reflector:
    """A local cache of one resource kept by list-then-watch.

    ``source`` is a :class:`ListWatch` (a :class:`Resource` on the REST client), or a
    kubernetes_asyncio list method with its ``list_kwargs``. ``on_change`` is called
    (synchronously) after every list and every applied event; it only marks work, the consumer
    reads :attr:`objects` when it runs.
    """

    def __init__(
        self,
        what: str,
        source: ListWatch | ListFn,
        on_change: Callable[[], None],
        settings: WatchSettings | None = None,
        optional: bool = False,
        **list_kwargs: Any,
    ) -> None:
        self.what = what
        # optional: a 404 on the first list means "not installed here" (e.g. Calico's CRDs on
        # a Flannel cluster): the reflector reports synced-and-absent and stops.
        self.optional = optional
        self.absent = False
        self.settings = settings or WatchSettings()
        if not isinstance(source, ListWatch):
            # The kubernetes_asyncio adapter lives with that client: only its users load it.
            from ravenproxy.kube.client import MethodListWatch

            source = MethodListWatch(source, list_kwargs, self.settings.connect_timeout)
        self._source: ListWatch = source
        self._on_change = on_change
        self.objects: dict[str, dict[str, Any]] = {}
        self.resource_version = ""
        self.synced = asyncio.Event()
        self.lists = 0

    def _check(self, status: int, body: Mapping[str, Any]) -> None:
        if status < 300:
            return
        message = status_message(body, status)
        if status == 410:
            raise Gone(message)
        if status == 404 and self.optional and not self.lists:
            raise Absent(message)
        raise KubeError(status, f"{self.what}: {message}")

    async def list(self) -> None:
        s = self.settings
        status, data = await self._source.list(s.watch_timeout)
        self._check(status, data)
        items = data.get("items") or []
        self.objects = {_key(o): o for o in items if isinstance(o, dict)}
        self.resource_version = resource_version(data)
        self.lists += 1
        log.debug(
            "kube: listed",
            extra=kv(what=self.what, objects=len(self.objects), rv=self.resource_version),
        )
        self.synced.set()
        self._on_change()

    async def watch(self, timeout: int) -> None:
        """One watch request from :attr:`resource_version`, until the server ends it."""
        # The read timeout: a watch with nothing to say for this long is a dead connection.
        async with self._source.watch(self.resource_version, timeout, timeout + 30) as answer:
            if answer.status >= 300:
                self._check(answer.status, await answer.json())
            async for line in answer.lines():
                self._apply(json.loads(line))

    def _apply(self, event: Any) -> None:
        obj = event.get("object", None) if isinstance(event, dict) else []
        if obj is None:
            obj = {}
        if not isinstance(obj, dict):
            # JSON, but not a watch event (a proxy answering with something else): as a line
            # that is not JSON, back off and resume, never let the reflector's task die.
            raise KubeError(0, f"{self.what}: a watch line that is not an event object")
        kind = event.get("type")
        if kind == "ERROR":
            code = int(obj.get("code") or 0)
            if code == 410:
                raise Gone(str(obj.get("message", "")))
            raise KubeError(code, f"{self.what}: {obj.get('message', '')}")
        rv = resource_version(obj)
        if kind in ("ADDED", "MODIFIED"):
            self.objects[_key(obj)] = dict(obj)
        elif kind == "DELETED":
            self.objects.pop(_key(obj), None)
        elif kind != "BOOKMARK":
            # Not a watch event at all (a proxy answering with something else): back off
            # rather than spin on a stream that will never carry events.
            raise KubeError(0, f"{self.what}: unexpected watch event type {kind!r}")
        if rv:
            self.resource_version = rv
        if kind != "BOOKMARK":
            self._on_change()

    async def run(self) -> None:
        """List, then watch forever (until cancelled)."""
        s = self.settings
        delay = s.backoff_initial
        need_list = True
        listed_at = 0.0
        while True:
            try:
                if need_list or time.monotonic() - listed_at >= s.resync:
                    try:
                        await self.list()
                    except Absent:
                        log.info("kube: resource not installed", extra=kv(what=self.what))
                        self.absent = True
                        self.synced.set()
                        self._on_change()
                        return
                    need_list = False
                    listed_at = time.monotonic()
                remaining = s.resync - (time.monotonic() - listed_at)
                await self.watch(max(1, min(s.watch_timeout, int(remaining))))
                delay = s.backoff_initial
            except Gone as exc:
                log.info("kube: watch expired, relisting", extra=kv(what=self.what, reason=exc))
                need_list = True
            except (OSError, KubeError, ValueError) as exc:
                # OSError: the connection (timeouts included); ValueError: a line that is not
                # JSON. Resume from the last good version; if that is gone too, the next
                # attempt gets 410 and relists.
                log.warning(
                    "kube: watch failed, retrying",
                    extra=kv(what=self.what, error=exc, retry_in=round(delay, 2)),
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, s.backoff_max)
