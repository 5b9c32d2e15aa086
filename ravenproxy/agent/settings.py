"""The agent's settings (``ravenproxy agent``), validated once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ravenproxy import config as cfg
from ravenproxy import flags
from ravenproxy.config import Address
from ravenproxy.errors import ConfigError, PKIError
from ravenproxy.flags import setting
from ravenproxy.l3.settings import L3Settings, settings_from
from ravenproxy.pki.identity import node_of, validate_node_name
from ravenproxy.pki.issuance import CERT_DIR_CA, CERT_LIFETIME, CERT_LIFETIME_OPTION
from ravenproxy.pki.x509info import load_certs
from ravenproxy.transport.session import SessionConfig


@dataclass(frozen=True)
class AgentSettings:
    """What ``ravenproxy agent`` runs with: its flags (each field's ``setting``)."""

    node_name: str = setting(
        flag="--node-name",
        metavar="NODE",
        help="this node's name (without it: NODE_NAME, else the node --cert-file names); must "
        "be the node in --cert-file, as the server knows the agent by its certificate; "
        "required with --cert-dir (the CN of the certificates requested)",
    )
    ca_file: str = setting(
        flag="--ca-file",
        metavar="F",
        help="CA that signs the server certificate (with --cert-dir: optional, wins over the "
        "CA bundle)",
        kind="file",
    )
    cert_file: str = setting(
        flag="--cert-file", metavar="F", help="this agent's client certificate", kind="file"
    )
    key_file: str = setting(flag="--key-file", metavar="F", help="this agent's key", kind="file")
    cert_dir: str | None = setting(
        None,
        "--cert-dir",
        "DIR",
        "instead of --cert-file/--key-file: request this node's certificate from Kubernetes "
        "(a CSR of signer raven.openyurt.io/tunnel-agent) and rotate it, keeping tls.key, "
        "tls.crt and ca.crt in DIR; needs --kubeconfig or the in-cluster account",
    )
    """Kept by :mod:`ravenproxy.kube.certificates`; then ``ca_file``/``cert_file``/``key_file``
    are the files in it (``ca_file``: unless ``--ca-file`` was given)."""
    cert_lifetime: float = field(default=CERT_LIFETIME, metadata=CERT_LIFETIME_OPTION)
    server_urls: tuple[str, ...] = setting(
        (),
        "--server-addr",
        "wss://H:P",
        "a server's tunnel address (repeatable: one tunnel is held to every server; a load "
        "balancer's address is dialled until --server-count distinct servers are held)",
        key="server_addr",
    )
    """The addresses given; empty with ``discover_servers``."""
    server_count: int | None = setting(
        None,
        "--server-count",
        "N",
        "hold tunnels to this many distinct servers; without it: the number of distinct "
        "--server-addr",
    )
    """``--server-count`` as given; :attr:`slots` is the number of tunnels held."""
    discover_servers: bool = setting(
        False,
        "--discover-servers",
        help="take the servers from the model instead of --server-addr: the public IP and port "
        "of every active proxy endpoint of every exposed gateway, followed as they change "
        "(needs --inventory or --kube-model)",
    )
    allow: tuple[str, ...] = setting(
        (),
        "--allow",
        "HOST:PORT",
        "a target the agent may dial (repeatable; HOST may be an IP, CIDR or name; PORT N, N-M "
        "or *). Added to the inventory-derived default.",
    )
    inventory: str | None = setting(
        None,
        "--inventory",
        "FILE",
        "derive the default allowlist: the InternalIPs of this gateway's nodes on their "
        "kubelet port",
    )
    metrics_ports: tuple[int, ...] = setting(
        (),
        "--metrics-port",
        "PORT",
        "also allow this port on the gateway's nodes",
        key="metrics_ports",  # as before: the --config key is plural
    )
    allow_pods: bool = setting(
        False,
        "--allow-pods",
        help="also allow the pod IPs of the gateway's nodes (their podCIDRs, or the Gateway "
        "status subnets: Calico blocks) on any port, for kube-apiserver's egress to pods; "
        "link-local and metadata addresses stay refused",
    )
    metrics_addr: Address | None = setting(
        None, "--metrics-addr", "H:P", "serve /metrics (and /healthz, /readyz) here"
    )
    health_addr: Address | None = setting(
        None, "--health-addr", "H:P", "serve /healthz and /readyz only here (probes)"
    )
    dial_timeout: float = setting(5.0, "--dial-timeout", "S", "timeout of the agent's dials")
    session: SessionConfig = field(
        default_factory=SessionConfig, metadata={"options": ("ping_interval", "dead_after")}
    )
    backoff_base: float = setting(
        0.5,
        "--backoff-base",
        "S",
        "first delay before dialling a server again after a failed dial; doubles with each "
        "consecutive failure (a tunnel that was up is re-dialled within 1 s, then 0.5-1.5 s "
        "apart for 10 s, before this schedule takes over)",
    )
    backoff_cap: float = setting(
        5.0,
        "--backoff-cap",
        "S",
        "longest delay before dialling a server again (bounds the return after a long outage)",
    )
    server_hostname_check: bool = setting(
        True,
        "--no-server-hostname-check",
        help="verify the server's chain but not its name (NAT'd public IP)",
        kind="switch",
    )
    kube_model: bool = setting(
        False,
        "--kube-model",
        help="read Nodes and Gateways from the Kubernetes API instead of --inventory",
    )
    """Read Nodes and Gateways from the Kubernetes API instead of an inventory."""
    kubeconfig: str | None = setting(
        None,
        "--kubeconfig",
        "F",
        "API access for --kube-model and --cert-dir (without it: the in-cluster account)",
        kind="file",
    )
    """API access for ``kube_model`` and ``cert_dir``; None: the in-cluster service account."""
    l3: L3Settings | None = field(
        default=None,
        metadata={
            "flag": "--l3",
            "kind": "switch",
            "help": "also run the L3 route driver (as `ravenproxy routes apply`, reconciled on "
            "every model change and every --reconcile-period, 60 s); needs --inventory or "
            "--kube-model, and root",
            "options": "*",
        },
    )
    """The embedded L3 route driver's settings; None: L3 off (the tunnel only)."""

    @property
    def follows_ca_bundle(self) -> bool:
        """With ``cert_dir``: ``ca.crt`` in it is written from the CA bundle ConfigMap (not
        when ``--ca-file`` names another file: that one wins)."""
        return self.cert_dir is not None and Path(self.ca_file) == Path(self.cert_dir, CERT_DIR_CA)

    @property
    def server_url(self) -> str:
        """The first ``--server-addr`` ("" with ``discover_servers``)."""
        return self.server_urls[0] if self.server_urls else ""

    @property
    def slots(self) -> int:
        """Tunnels to distinct servers held with ``--server-addr`` (one dial loop each)."""
        return self.server_count or len(self.server_urls)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> AgentSettings:
        # A flag (or config-file value) wins over NODE_NAME; neither: the certificate's node.
        flag_node = values.get("node_name")
        given_node, node_source = (
            (str(flag_node), "--node-name") if flag_node else (cfg.env_node_name(), "NODE_NAME")
        )
        if given_node:
            try:
                validate_node_name(given_node)
            except PKIError as exc:
                raise ConfigError(node_source, str(exc)) from None
        v = flags.read(cls, values)
        urls = tuple(dict.fromkeys(_server_url(u) for u in v["server_addr"]))  # distinct, kept
        count = v["server_count"]
        if v["discover_servers"]:
            if urls or count:
                flag = "--server-addr" if urls else "--server-count"
                raise ConfigError(
                    flag, "give either --server-addr (and --server-count) or --discover-servers"
                )
            if not (v["inventory"] or v["kube_model"]):
                raise ConfigError(
                    "--discover-servers",
                    "needs --inventory or --kube-model: servers come from the model's gateways",
                )
        elif not urls:
            raise ConfigError("--server-addr", "required (or --discover-servers)")

        try:
            session = SessionConfig(ping_interval=v["ping_interval"], dead_after=v["dead_after"])
        except ValueError as exc:
            raise ConfigError("tunnel settings", str(exc)) from None
        l3 = settings_from(values) if v["l3"] else None
        inventory, kube_model = v["inventory"], v["kube_model"]
        if kube_model and inventory:
            raise ConfigError("--inventory", "give either --inventory or --kube-model, not both")
        if v["allow_pods"] and not (inventory or kube_model):
            raise ConfigError(
                "--allow-pods",
                "needs --inventory or --kube-model: the pod CIDRs come from the model",
            )
        if l3 is not None and not (inventory or kube_model):
            raise ConfigError(
                "--l3", "needs --inventory or --kube-model: the route driver plans from the model"
            )
        files = cfg.cert_files(values, v["kubeconfig"])
        if files.cert_dir is not None:
            # No certificate to take the node from yet: it is the CN of what we request.
            if not given_node:
                raise ConfigError(
                    "--node-name",
                    "required with --cert-dir (or set NODE_NAME): the node "
                    "this agent requests its certificate for",
                )
            node = given_node
        else:
            node = _node_name(given_node, node_source, cert_node(files.cert_file), files.cert_file)
        return cls(
            node_name=node,
            server_urls=urls,
            server_count=count,
            discover_servers=v["discover_servers"],
            ca_file=files.ca_file,
            cert_file=files.cert_file,
            key_file=files.key_file,
            cert_dir=files.cert_dir,
            cert_lifetime=cfg.cert_lifetime(v["cert_lifetime"]),
            allow=v["allow"],
            inventory=cfg.existing_file(inventory, "--inventory") if inventory else None,
            metrics_ports=v["metrics_ports"],
            allow_pods=v["allow_pods"],
            metrics_addr=v["metrics_addr"],
            health_addr=v["health_addr"],
            dial_timeout=v["dial_timeout"],
            session=session,
            backoff_base=v["backoff_base"],
            backoff_cap=v["backoff_cap"],
            server_hostname_check=not v["no_server_hostname_check"],
            l3=l3,
            kube_model=kube_model,
            kubeconfig=v["kubeconfig"],
        )


def _server_url(url: str) -> str:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "wss" or not parts.hostname or not port:
        raise ConfigError("--server-addr", f"{url!r} must look like wss://HOST:PORT")
    return url


def cert_node(cert_file: str) -> str:
    """The node ``cert_file`` (the agent's client certificate) names: what the server will
    register this agent as (the same rule as the server's, :func:`node_of`)."""
    try:
        return node_of(load_certs(cert_file, "--cert-file")[0], f"--cert-file {cert_file}")
    except PKIError as exc:
        raise ConfigError("--cert-file", str(exc).removeprefix("--cert-file ")) from None


def _node_name(given: str | None, source: str, from_cert: str, cert_file: str) -> str:
    """This agent's node: the certificate's, which a given name (from ``source``) must equal.

    The server identifies the agent by its certificate alone, so an agent running under another
    name would serve the certificate's node with an allowlist, an L3 plan and a key publisher
    built for the other one (half its requests refused). Refused at start-up instead, naming
    both.
    """
    if given and given != from_cert:
        raise ConfigError(
            source,
            f"{given} differs from {from_cert}, the node of --cert-file {cert_file} and the "
            f"name the server registers this agent as; give the certificate of {given}, or "
            f"leave {source} unset to run as {from_cert}",
        )
    return from_cert
