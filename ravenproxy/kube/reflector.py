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
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from ravenproxy.kube.client import KubeError, resource_version
from ravenproxy.log import kv

log = logging.getLogger(__name__)

ListFn = Callable[..., Awaitable[Any]]


class Gone(Exception):
    """The watched resourceVersion is no longer available: relist."""


class Absent(Exception):
    """An optional resource type does not exist in this cluster (its CRD is not installed)."""


@dataclass(frozen=True)
class WatchSettings:
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


def _status_message(body: str) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return body[:200]
    if isinstance(data, dict):
        return str(data.get("message") or data.get("reason") or body[:200])
    return body[:200]


class Reflector:
    """A local cache of one resource kept by list-then-watch.

    ``on_change`` is called (synchronously) after every list and every applied event; it only
    marks work, the consumer reads :attr:`objects` when it runs.
    """

    def __init__(
        self,
        what: str,
        list_fn: ListFn,
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
        self._list_fn = list_fn
        self._list_kwargs = list_kwargs
        self._on_change = on_change
        self.settings = settings or WatchSettings()
        self.objects: dict[str, dict[str, Any]] = {}
        self.resource_version = ""
        self.synced = asyncio.Event()
        self.lists = 0

    async def _request(self, **kwargs: Any) -> aiohttp.ClientResponse:
        resp: aiohttp.ClientResponse = await self._list_fn(
            **self._list_kwargs, **kwargs, _preload_content=False
        )
        if resp.status < 300:
            return resp
        body = await resp.text()
        resp.release()
        if resp.status == 410:
            raise Gone(_status_message(body))
        if resp.status == 404 and self.optional and not self.lists:
            raise Absent(_status_message(body))
        raise KubeError(resp.status, f"{self.what}: {_status_message(body)}")

    async def list(self) -> None:
        s = self.settings
        resp = await self._request(_request_timeout=(s.connect_timeout, s.watch_timeout))
        try:
            data = await resp.json()
        finally:
            resp.release()
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
        s = self.settings
        resp = await self._request(
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout,
            # sock_read: a watch with nothing to say for this long is a dead connection.
            _request_timeout=(s.connect_timeout, timeout + 30),
        )
        try:
            async for line in resp.content:
                if line.strip():
                    self._apply(json.loads(line))
        finally:
            resp.release()

    def _apply(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
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
            except (aiohttp.ClientError, TimeoutError, KubeError, ValueError) as exc:
                # ValueError: a line that is not JSON. Resume from the last good version; if
                # that is gone too, the next attempt gets 410 and relists.
                log.warning(
                    "kube: watch failed, retrying",
                    extra=kv(what=self.what, error=exc, retry_in=round(delay, 2)),
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, s.backoff_max)
