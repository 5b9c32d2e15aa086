"""An HTTP-level Kubernetes API emulator (no kube-apiserver is packaged for the test bed) that the
real ``kubernetes_asyncio`` client talks to. It speaks what our code relies on:

- list: ``{"kind": "<Kind>List", "metadata": {"resourceVersion"}, "items"}``, with
  ``labelSelector`` (equality terms) and ``fieldSelector=metadata.name=X``;
- watch (``watch=true&resourceVersion=N&timeoutSeconds=T``): JSON lines of
  ``{"type": ADDED|MODIFIED|DELETED, "object"}`` for every change after N, then live ones until T
  seconds pass; a version older than the compaction point gets an ``ERROR`` event with a 410
  ``Expired`` Status (what kube-apiserver does) or, with ``gone_as_http``, an HTTP 410;
- get / create (409 AlreadyExists) / replace and JSON merge patch (409 Conflict on a stale
  ``metadata.resourceVersion``) / delete, 404 NotFound as a Status; the ``status`` subresource;
  ClusterIP and nodePort allocation for Services.

One global resourceVersion counter (as etcd's revision). Every request is logged with its
User-Agent so tests can tell replicas apart.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

Obj = dict[str, Any]


@dataclass
class Collection:
    kind: str
    api_version: str
    namespaced: bool
    objects: dict[tuple[str, str], Obj] = field(default_factory=dict)
    # (resourceVersion, type, object) for every change, oldest first.
    history: list[tuple[int, str, Obj]] = field(default_factory=list)


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    user_agent: str


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.json_response(body, status=code)


class APIServer:
    def __init__(self) -> None:
        self.rv = 100
        self.compacted = 0
        self.gone_as_http = False
        self.requests: list[Request] = []
        self.collections = {
            "nodes": Collection("Node", "v1", False),
            "pods": Collection("Pod", "v1", True),
            "services": Collection("Service", "v1", True),
            "endpoints": Collection("Endpoints", "v1", True),
            "configmaps": Collection("ConfigMap", "v1", True),
            "events": Collection("Event", "v1", True),
            "gateways": Collection("Gateway", "raven.openyurt.io/v1beta1", False),
            "leases": Collection("Lease", "coordination.k8s.io/v1", True),
        }
        self._ips = itertools.count(10)
        self._node_ports = itertools.count(30000)
        self._changed = asyncio.Condition()
        self._closing = False
        # Cutting watches: open streams end (as when an apiserver restarts) and new watch
        # requests wait at the gate, so a test can change and compact history in between.
        self._epoch = 0
        self._gate = asyncio.Event()
        self._gate.set()
        self._runner: web.AppRunner | None = None
        self.port = 0
        app = web.Application()
        coll = self._collection_handler
        item = self._item_handler
        for prefix in ("/api/{version}", "/apis/{group}/{version}"):
            app.router.add_route("*", prefix + "/{res}", coll)
            app.router.add_route("*", prefix + "/namespaces/{ns}/{res}", coll)
            app.router.add_route("*", prefix + "/{res}/{name}", item)
            app.router.add_route("*", prefix + "/{res}/{name}/{sub}", item)
            app.router.add_route("*", prefix + "/namespaces/{ns}/{res}/{name}", item)
            app.router.add_route("*", prefix + "/namespaces/{ns}/{res}/{name}/{sub}", item)
        self._app = app

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._runner = web.AppRunner(self._app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.base_events.Server)
        self.port = server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        self._closing = True
        self._gate.set()
        await self._notify()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # --- changing the world directly (as another client would) -----------------------------

    def get(self, resource: str, name: str, namespace: str = "") -> Obj | None:
        return self.collections[resource].objects.get((namespace, name))

    def items(self, resource: str) -> list[Obj]:
        return [o for _k, o in sorted(self.collections[resource].objects.items())]

    async def put(self, resource: str, obj: Mapping[str, Any]) -> Obj:
        col = self.collections[resource]
        stored = copy.deepcopy(dict(obj))
        meta = stored.setdefault("metadata", {})
        key = (meta.get("namespace", "") if col.namespaced else "", meta["name"])
        return await self._store(col, key, stored)

    async def delete(self, resource: str, name: str, namespace: str = "") -> None:
        col = self.collections[resource]
        stored = copy.deepcopy(col.objects.pop((namespace, name)))
        self.rv += 1
        stored["metadata"]["resourceVersion"] = str(self.rv)
        col.history.append((self.rv, "DELETED", stored))
        await self._notify()

    async def _store(self, col: Collection, key: tuple[str, str], stored: Obj) -> Obj:
        self.rv += 1
        meta = stored.setdefault("metadata", {})
        meta["resourceVersion"] = str(self.rv)
        meta.setdefault("uid", f"uid-{self.rv}")
        if col.namespaced:
            meta["namespace"] = key[0]
        stored["apiVersion"] = col.api_version
        stored["kind"] = col.kind
        event = "MODIFIED" if key in col.objects else "ADDED"
        col.objects[key] = stored
        col.history.append((self.rv, event, copy.deepcopy(stored)))
        await self._notify()
        return copy.deepcopy(stored)

    def compact(self) -> None:
        """Forget all history up to now: any watch from an older version gets 410."""
        self.compacted = self.rv
        for col in self.collections.values():
            col.history.clear()

    async def cut_watches(self) -> None:
        self._gate.clear()
        self._epoch += 1
        await self._notify()

    def release_watches(self) -> None:
        self._gate.set()

    # --- what clients did -----------------------------------------------------------------

    def watches(self, resource: str) -> list[dict[str, str]]:
        return [r.query for r in self._gets(resource) if _is_watch(r.query)]

    def lists(self, resource: str) -> list[dict[str, str]]:
        return [r.query for r in self._gets(resource) if not _is_watch(r.query)]

    def _gets(self, resource: str) -> list[Request]:
        return [r for r in self.requests if r.method == "GET" and r.path.endswith("/" + resource)]

    def writes(self, resource: str | None = None) -> list[Request]:
        return [
            r
            for r in self.requests
            if r.method in ("POST", "PUT", "PATCH", "DELETE")
            and (resource is None or f"/{resource}" in r.path)
        ]

    # --- serving --------------------------------------------------------------------------

    def _log(self, request: web.Request) -> None:
        self.requests.append(
            Request(
                request.method,
                request.path,
                dict(request.query),
                request.headers.get("User-Agent", ""),
            )
        )

    def _col(self, request: web.Request) -> Collection:
        res = request.match_info["res"]
        if res not in self.collections:
            raise web.HTTPNotFound(text=f"no resource {res}")
        return self.collections[res]

    async def _collection_handler(self, request: web.Request) -> web.StreamResponse:
        self._log(request)
        col = self._col(request)
        ns = request.match_info.get("ns", "")
        if request.method == "POST":
            return await self._create(request, col, ns)
        if request.method != "GET":
            return status(405, "MethodNotAllowed", request.method)
        wanted = _selector(request.query, ns)
        if _is_watch(request.query):
            return await self._watch(request, col, wanted)
        items = [o for _k, o in sorted(col.objects.items()) if wanted(o)]
        return web.json_response(
            {
                "kind": f"{col.kind}List",
                "apiVersion": col.api_version,
                "metadata": {"resourceVersion": str(self.rv)},
                "items": items,
            }
        )

    async def _create(self, request: web.Request, col: Collection, ns: str) -> web.Response:
        body = await request.json()
        name = (body.get("metadata") or {}).get("name")
        if not name:
            return status(422, "Invalid", "metadata.name: Required value")
        key = (ns, name)
        if key in col.objects:
            return status(409, "AlreadyExists", f'{col.kind} "{name}" already exists')
        body["metadata"].pop("resourceVersion", None)
        if col.kind == "Service":
            self._allocate(body, None)
        return web.json_response(await self._store(col, key, body), status=201)

    def _allocate(self, svc: Obj, old: Obj | None) -> None:
        spec = svc.setdefault("spec", {})
        old_spec = (old or {}).get("spec") or {}
        spec.setdefault("type", "ClusterIP")
        spec["clusterIP"] = old_spec.get("clusterIP") or f"10.96.0.{next(self._ips)}"
        old_ports = {p.get("port"): p for p in old_spec.get("ports") or []}
        for port in spec.get("ports") or []:
            port.setdefault("protocol", "TCP")
            if spec["type"] == "LoadBalancer":
                kept = old_ports.get(port.get("port"), {}).get("nodePort")
                port["nodePort"] = kept or next(self._node_ports)

    async def _item_handler(self, request: web.Request) -> web.StreamResponse:
        self._log(request)
        col = self._col(request)
        ns = request.match_info.get("ns", "")
        name = request.match_info["name"]
        sub = request.match_info.get("sub")
        key = (ns, name)
        cur = col.objects.get(key)
        if cur is None:
            return status(404, "NotFound", f'{col.kind.lower()}s "{name}" not found')
        if request.method == "GET":
            return web.json_response(cur)
        if request.method == "DELETE":
            await self.delete(request.match_info["res"], name, ns)
            return web.json_response(status_ok())
        body = await request.json()
        want_rv = (body.get("metadata") or {}).get("resourceVersion")
        if want_rv and want_rv != cur["metadata"]["resourceVersion"]:
            return status(
                409, "Conflict", "the object has been modified; please apply your changes"
            )
        if request.method == "PATCH":
            ctype = request.headers.get("Content-Type", "")
            if ctype != "application/merge-patch+json":
                return status(415, "UnsupportedMediaType", f"{ctype} not supported here")
            if sub == "status":
                new = dict(copy.deepcopy(cur))
                new["status"] = merge_patch(cur.get("status"), body.get("status"))
            else:
                new = merge_patch(cur, body)
                if "status" in cur:
                    new["status"] = copy.deepcopy(cur["status"])
        elif request.method == "PUT":
            new = body
            if sub == "status":
                new = dict(copy.deepcopy(cur))
                new["status"] = body.get("status")
        else:
            return status(405, "MethodNotAllowed", request.method)
        new.setdefault("metadata", {})["name"] = name
        if col.kind == "Service":
            self._allocate(new, cur)
        return web.json_response(await self._store(col, key, new))

    async def _watch(
        self, request: web.Request, col: Collection, wanted: Callable[[Obj], bool]
    ) -> web.StreamResponse:
        await self._gate.wait()
        epoch = self._epoch
        since = int(request.query.get("resourceVersion") or 0)
        timeout = float(request.query.get("timeoutSeconds") or 30)
        expired = since < self.compacted
        if expired and self.gone_as_http:
            return status(410, "Expired", f"too old resource version: {since}")
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        if expired:
            gone = {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f"too old resource version: {since} ({self.compacted})",
                "reason": "Expired",
                "code": 410,
            }
            await resp.write(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
            return resp
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        sent = since
        while not self._closing and epoch == self._epoch:
            for rv, kind, obj in list(col.history):
                if rv > sent and wanted(obj):
                    await resp.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
                sent = max(sent, rv)
            left = deadline - loop.time()
            if left <= 0:
                break
            async with self._changed:
                try:
                    await asyncio.wait_for(self._changed.wait(), left)
                except TimeoutError:
                    pass
        return resp


def status_ok() -> Obj:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}


def _is_watch(query: Mapping[str, str]) -> bool:
    return query.get("watch", "").lower() == "true"


def _selector(query: Mapping[str, str], ns: str) -> Callable[[Obj], bool]:
    field_sel = query.get("fieldSelector", "")
    name = field_sel.split("=", 1)[1] if field_sel.startswith("metadata.name=") else None
    labels = dict(
        term.split("=", 1) for term in query.get("labelSelector", "").split(",") if "=" in term
    )

    def wanted(obj: Obj) -> bool:
        meta = obj["metadata"]
        if ns and meta.get("namespace") != ns:
            return False
        if name is not None and meta["name"] != name:
            return False
        have = meta.get("labels") or {}
        return all(have.get(k) == v for k, v in labels.items())

    return wanted
