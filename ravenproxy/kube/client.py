"""The API client factory and raw JSON calls, shared by every component that talks to the API.

Responses are read raw (``_preload_content=False``): the model parsers take Kubernetes JSON, and
skipping the client's model classes keeps one code path for the YAML inventory and the API.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config

from ravenproxy.errors import RavenProxyError

MERGE_PATCH = "application/merge-patch+json"


class KubeError(RavenProxyError):
    """The Kubernetes API answered with an error we cannot recover from by relisting."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


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
        body = await resp.json(content_type=None) if resp.status != 204 else {}
    except ValueError:
        body = {}
    finally:
        resp.release()
    return resp.status, body if isinstance(body, dict) else {}


def resource_version(obj: Any) -> str:
    """``metadata.resourceVersion`` of an API object ("" when it has none)."""
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))
