"""An HTTP-level Kubernetes API emulator (no kube-apiserver is packaged for the test bed) that the
real ``kubernetes_asyncio`` client talks to. It speaks what our code relies on:

- list: ``{"kind": "<Kind>List", "metadata": {"resourceVersion"}, "items"}``, with
  ``labelSelector`` (equality terms) and ``fieldSelector=metadata.name=X``;
- watch (``watch=true&resourceVersion=N&timeoutSeconds=T``): JSON lines of
  ``{"type": ADDED|MODIFIED|DELETED, "object"}`` for every change after N, then live ones until T
  seconds pass; a version older than the compaction point gets an ``ERROR`` event with a 410
  ``Expired`` Status (what kube-apiserver does) or, with ``gone_as_http``, an HTTP 410;
- get / create (409 AlreadyExists; ``metadata.generateName``) / replace and JSON merge patch
  (409 Conflict on a stale ``metadata.resourceVersion``) / delete, 404 NotFound as a Status; the
  ``status`` subresource; ClusterIP and nodePort allocation for Services;
- authentication: ``Authorization: Bearer <token>`` is the user registered in ``users`` (an
  unknown token gets 401), no token is ``system:anonymous``. Nothing is authorized: RBAC is
  checked statically against k8s/rbac.yaml by tests/unit/k8s;
- ``certificatesigningrequests`` (certificates.k8s.io/v1) with kube-apiserver's rules: the
  requester's identity is written into the spec on create (never taken from the body), the
  request must be a PEM CSR, ``expirationSeconds`` at least 600; the ``approval`` subresource
  changes only the Approved/Denied conditions, the ``status`` subresource only the certificate
  (once, and only when approved) and other conditions; an update of the object itself keeps
  spec and status as they were (only metadata changes).

One global resourceVersion counter (as etcd's revision). Every request is logged with its
User-Agent and user so tests can tell replicas and callers apart.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import copy
import datetime as dt
import itertools
import json
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from cryptography import x509

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
    user: str = ""


@dataclass(frozen=True)
class UserInfo:
    """Who a bearer token is, as kube-apiserver's authenticators fill it."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, Sequence[str]] = field(default_factory=dict)


ANONYMOUS = UserInfo("system:anonymous", groups=("system:unauthenticated",))

# What kube-apiserver's service-account authenticator puts into a bound token's extra.
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
NODE_UID_EXTRA = "authentication.kubernetes.io/node-uid"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"

CSR_USAGES = frozenset(
    {
        "signing",
        "digital signature",
        "content commitment",
        "key encipherment",
        "key agreement",
        "data encipherment",
        "cert sign",
        "crl sign",
        "encipher only",
        "decipher only",
        "any",
        "server auth",
        "client auth",
        "code signing",
        "email protection",
        "s/mime",
        "ipsec end system",
        "ipsec tunnel",
        "ipsec user",
        "timestamping",
        "ocsp signing",
        "microsoft sgc",
        "netscape sgc",
    }
)
CSR_APPROVAL = ("Approved", "Denied")
CSR_MIN_EXPIRATION = 600


class Invalid(Exception):
    """A 422 from a validation rule; the message names the field."""


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
            "secrets": Collection("Secret", "v1", True),
            "certificatesigningrequests": Collection(
                "CertificateSigningRequest", "certificates.k8s.io/v1", False
            ),
        }
        self.users: dict[str, UserInfo] = {}
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

    # --- who may call ---------------------------------------------------------------------

    def add_user(
        self,
        username: str,
        *,
        uid: str = "",
        groups: Sequence[str] = ("system:authenticated",),
        extra: Mapping[str, Sequence[str]] | None = None,
    ) -> str:
        """Register a user; returns its new bearer token."""
        token = secrets.token_urlsafe(24)
        self.users[token] = UserInfo(username, uid, tuple(groups), dict(extra or {}))
        return token

    def add_service_account(
        self, name: str, node: str, *, namespace: str = "kube-system", pod: str = ""
    ) -> str:
        """A bound token of a pod of service account ``namespace/name`` running on ``node``,
        with what kube-apiserver puts into such a token's user info; returns the token."""
        node_obj = self.get("nodes", node)
        node_uid = (node_obj or {}).get("metadata", {}).get("uid") or f"uid-node-{node}"
        pod = pod or f"{name}-{secrets.token_hex(3)}"
        extra = {
            NODE_NAME_EXTRA: [node],
            NODE_UID_EXTRA: [node_uid],
            POD_NAME_EXTRA: [pod],
            POD_UID_EXTRA: [f"uid-pod-{pod}"],
        }
        return self.add_user(
            f"system:serviceaccount:{namespace}:{name}",
            uid=f"uid-sa-{namespace}-{name}",
            groups=(
                "system:serviceaccounts",
                f"system:serviceaccounts:{namespace}",
                "system:authenticated",
            ),
            extra=extra,
        )

    def add_node_user(self, node: str) -> str:
        """A kubelet's credential for ``node`` (``system:node:<node>`` in ``system:nodes``)."""
        return self.add_user(f"system:node:{node}", groups=("system:nodes", "system:authenticated"))

    def _user(self, request: web.Request) -> UserInfo | None:
        """The caller, or None for a token nobody holds."""
        auth = request.headers.get("Authorization", "")
        if not auth:
            return ANONYMOUS
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer":
            return None
        return self.users.get(token.strip())

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

    def _log(self, request: web.Request, user: UserInfo | None) -> None:
        self.requests.append(
            Request(
                request.method,
                request.path,
                dict(request.query),
                request.headers.get("User-Agent", ""),
                user.username if user is not None else "",
            )
        )

    def _col(self, request: web.Request) -> Collection:
        res = request.match_info["res"]
        if res not in self.collections:
            # kube-apiserver's answer for a resource or group it does not serve: plain text.
            raise web.HTTPNotFound(text="404 page not found")
        return self.collections[res]

    async def _collection_handler(self, request: web.Request) -> web.StreamResponse:
        user = self._user(request)
        self._log(request, user)
        if user is None:
            return status(401, "Unauthorized", "Unauthorized")
        col = self._col(request)
        ns = request.match_info.get("ns", "")
        if request.method == "POST":
            return await self._create(request, col, ns, user)
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

    async def _create(
        self, request: web.Request, col: Collection, ns: str, user: UserInfo
    ) -> web.Response:
        body = await request.json()
        meta = body.setdefault("metadata", {})
        name = meta.get("name")
        if not name and meta.get("generateName"):
            name = meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        if not name:
            return status(422, "Invalid", "metadata.name: Required value")
        key = (ns, name)
        if key in col.objects:
            return status(409, "AlreadyExists", f'{col.kind} "{name}" already exists')
        meta.pop("resourceVersion", None)
        meta["creationTimestamp"] = _now()
        if col.kind == "Service":
            self._allocate(body, None)
        if col.kind == "CertificateSigningRequest":
            try:
                _csr_create(body, user)
            except Invalid as exc:
                return status(422, "Invalid", f'{col.kind}.certificates.k8s.io "{name}": {exc}')
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
        user = self._user(request)
        self._log(request, user)
        if user is None:
            return status(401, "Unauthorized", "Unauthorized")
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
            if sub in ("status", "approval"):
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
        if col.kind == "CertificateSigningRequest":
            try:
                new = _csr_update(cur, new, sub)
            except Invalid as exc:
                return status(422, "Invalid", f'{col.kind}.certificates.k8s.io "{name}": {exc}')
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


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- CertificateSigningRequest rules (kube-apiserver's strategy and validation) --------------


def _csr_create(body: Obj, user: UserInfo) -> None:
    """Validate a new CSR and write the requester into it, as kube-apiserver does."""
    spec = body.get("spec")
    if not isinstance(spec, dict):
        raise Invalid("spec: Required value")
    # The identity is the caller's, whatever the body claims.
    for key in ("username", "uid", "groups", "extra"):
        spec.pop(key, None)
    spec["username"] = user.username
    if user.uid:
        spec["uid"] = user.uid
    spec["groups"] = list(user.groups)
    if user.extra:
        spec["extra"] = {k: list(v) for k, v in user.extra.items()}
    body.pop("status", None)
    body["status"] = {}
    _csr_request(spec.get("request"))
    signer = spec.get("signerName")
    if not signer or not isinstance(signer, str):
        raise Invalid("spec.signerName: Required value")
    if "/" not in signer:
        raise Invalid(f'spec.signerName: Invalid value: "{signer}": must be a fully qualified name')
    usages = spec.get("usages")
    if not usages or not isinstance(usages, list):
        raise Invalid("spec.usages: Required value")
    for usage in usages:
        if usage not in CSR_USAGES:
            raise Invalid(f'spec.usages: Unsupported value: "{usage}"')
    if len(set(usages)) != len(usages):
        raise Invalid("spec.usages: Duplicate value")
    exp = spec.get("expirationSeconds")
    if exp is not None and (not isinstance(exp, int) or exp < CSR_MIN_EXPIRATION):
        raise Invalid(
            f"spec.expirationSeconds: Invalid value: {exp}: may not specify a duration less "
            f"than {CSR_MIN_EXPIRATION} seconds (10 minutes)"
        )


def _csr_request(value: Any) -> None:
    if not value or not isinstance(value, str):
        raise Invalid("spec.request: Required value")
    try:
        pem = base64.b64decode(value, validate=True)
        x509.load_pem_x509_csr(pem)
    except (binascii.Error, ValueError) as exc:
        raise Invalid(
            f"spec.request: Invalid value: []byte{{...}}: "
            f"PEM block type must be CERTIFICATE REQUEST ({exc})"
        ) from exc


def _conditions(obj: Obj) -> list[Obj]:
    return list(((obj.get("status") or {}).get("conditions")) or [])


def _has(conditions: list[Obj], kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status", "True") == "True" for c in conditions)


def _csr_update(cur: Obj, new: Obj, sub: str | None) -> Obj:
    """The stored object after an update of the CSR itself, its ``approval`` or ``status``."""
    out = copy.deepcopy(cur)
    if sub is None:
        # Metadata is the body's (labels, annotations, finalizers), identity stays.
        meta = dict(new.get("metadata") or {})
        for key in ("name", "uid", "creationTimestamp", "generateName"):
            if key in cur["metadata"]:
                meta[key] = cur["metadata"][key]
        out["metadata"] = meta
    old_status = cur.get("status") or {}
    new_status = new.get("status") or {}
    old_conditions = _conditions(cur)
    if sub is None:
        return out  # spec and status stay: only metadata changes this way
    wanted = list(new_status.get("conditions") or [])
    if sub == "approval":
        # Only Approved/Denied come from the body; any other condition stays as it was.
        conditions = [c for c in old_conditions if c.get("type") not in CSR_APPROVAL]
        conditions += [c for c in wanted if c.get("type") in CSR_APPROVAL]
        certificate = old_status.get("certificate")
    elif sub == "status":
        # Approval changes only through the approval subresource.
        conditions = [c for c in old_conditions if c.get("type") in CSR_APPROVAL]
        conditions += [c for c in wanted if c.get("type") not in CSR_APPROVAL]
        certificate = new_status.get("certificate")
    else:
        raise Invalid(f"no subresource {sub}")
    for cond in conditions:
        if not cond.get("type"):
            raise Invalid("status.conditions[].type: Required value")
        cond.setdefault("status", "True")
        if cond["type"] in (*CSR_APPROVAL, "Failed") and cond["status"] != "True":
            raise Invalid(
                f'status.conditions[].status: Unsupported value: "{cond["status"]}": '
                f'supported values: "True" for {cond["type"]}'
            )
        cond.setdefault("lastUpdateTime", _now())
        cond.setdefault("lastTransitionTime", cond["lastUpdateTime"])
    types = [c["type"] for c in conditions]
    for kind in (*CSR_APPROVAL, "Failed"):
        if types.count(kind) > 1:
            raise Invalid(f'status.conditions: Duplicate value: "{kind}"')
        if kind in {c.get("type") for c in old_conditions} and kind not in types:
            raise Invalid(
                f'status.conditions: Forbidden: updates may not remove a condition of type "{kind}"'
            )
    if "Approved" in types and "Denied" in types:
        raise Invalid(
            'status.conditions[1].type: Invalid value: "Denied": Approved and Denied conditions '
            "are mutually exclusive"
        )
    old_cert = old_status.get("certificate")
    if old_cert and certificate != old_cert:
        raise Invalid(
            "status.certificate: Forbidden: updates may not modify existing certificate content"
        )
    if certificate and not old_cert:
        if "Approved" not in types or "Denied" in types or "Failed" in types:
            raise Invalid(
                "status.certificate: Forbidden: certificate issuance requires an Approved "
                "condition and no Denied or Failed condition"
            )
        try:
            certs = x509.load_pem_x509_certificates(base64.b64decode(certificate, validate=True))
        except (binascii.Error, ValueError) as exc:
            raise Invalid(f"status.certificate: Invalid value: {exc}") from exc
        if not certs:
            raise Invalid("status.certificate: Invalid value: no certificate found")
    status_out: Obj = {}
    if conditions:
        status_out["conditions"] = conditions
    if certificate:
        status_out["certificate"] = certificate
    out["status"] = status_out
    return out


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
