"""The Helm chart k8s/helm/ravenproxy, rendered by the real helm binary (`make tools`): lint, every
combination the README shows, the objects' shape, args the real CLI parser accepts, the IPsec PSK
never a constant, the values schema, and k8s/ in sync with the default render."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from cryptography.hazmat.primitives import serialization

from ravenproxy import flags
from ravenproxy.agent.settings import AgentSettings
from ravenproxy.cli import build_parser
from ravenproxy.controller.settings import DnsCommand
from ravenproxy.kube.client import new_api_client
from ravenproxy.pki.authority import generate_ca
from tests.unit.k8s import chart
from tests.unit.k8s.test_manifests import (
    assert_args_accepted,
    containers,
    env_of,
    expand,
    parser_params,
)

# The combinations the README's deploy section shows (and everything at once).
COMBOS: dict[str, tuple[str, ...]] = {
    "defaults": (),
    "l3-strongswan": ("l3.enabled=true", "l3.vpnDriver=strongswan"),
    "l3-wireguard": ("l3.enabled=true", "l3.vpnDriver=wireguard"),
    "certs-csr": ("certs.mode=csr",),
    "certs-secret": ("certs.mode=secret",),
    "dns": ("dns.enabled=true",),
    "servicemonitor": ("metrics.serviceMonitor.enabled=true",),
    "egress-uds": ("egress.enabled=true",),
    "egress-tcp": ("egress.enabled=true", "egress.mode=tcp", "egress.port=8131"),
    "all": (
        "l3.enabled=true",
        "l3.serviceCIDR=10.96.0.0/12",
        "dns.enabled=true",
        "dns.suffix=tunnel.local",
        "metrics.serviceMonitor.enabled=true",
        "certs.mode=secret",
        "agent.serverAddresses[0]=wss://proxy.example.com:10262",
        "server.sans[0]=proxy.example.com",
        "egress.enabled=true",
        "egress.udsOwner=0:0",
    ),
}
WORKLOAD_KINDS = {"Deployment", "DaemonSet"}


@cache
def render(combo: str) -> tuple[dict[str, Any], ...]:
    # libyaml's scanner (the same safe constructor): the pure-Python one took 0.6 s of the
    # suite's collection for the ten renders.
    docs = [d for d in yaml.load_all(chart.template(*COMBOS[combo]), yaml.CSafeLoader) if d]
    assert all(isinstance(d, dict) for d in docs)
    return tuple(docs)


def kinds(combo: str, kind: str) -> list[dict[str, Any]]:
    return [d for d in render(combo) if d["kind"] == kind]


def named(combo: str, kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in kinds(combo, kind) if d["metadata"]["name"] == name]
    return found


def workloads(combo: str) -> list[dict[str, Any]]:
    return [d for d in render(combo) if d["kind"] in WORKLOAD_KINDS]


def parse(container: dict[str, Any]) -> Any:
    return build_parser().parse_args([expand(a, env_of(container)) for a in container["args"]])


def the(container_name: str, doc: dict[str, Any]) -> dict[str, Any]:
    (found,) = [c for c in containers(doc) if c["name"] == container_name]
    return found


# --- the binary, lint, schema -----------------------------------------------------------------


def test_helm_is_the_real_binary() -> None:
    out = chart.run_helm("version", "--short").stdout
    assert out.startswith("v"), out


@pytest.mark.parametrize("combo", COMBOS)
def test_helm_lint(combo: str) -> None:
    sets = [x for s in COMBOS[combo] for x in ("--set", s)]
    result = chart.run_helm("lint", "--strict", str(chart.CHART), *sets, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize(
    ("expression", "field"),
    [
        ("l3.enabled=notabool", "/l3/enabled"),
        ("l3.vpnDriver=openvpn", "/l3/vpnDriver"),
        ("certs.mode=files", "/certs/mode"),
        ("controller.replicas=two", "/controller/replicas"),
        ("ports.tunnel=70000", "/ports/tunnel"),
        ("agent.serverAddresses[0]=proxy.example.com", "/agent/serverAddresses/0"),
        ("dns.enabled=yes", "/dns/enabled"),
        ("metrics.serviceMonitor.enabled=1", "/metrics/serviceMonitor/enabled"),
        ("l3.vpnDrivr=wireguard", "vpnDrivr"),
        ("egress.mode=grpc", "/egress/mode"),
        ("egress.udsMode=rw", "/egress/udsMode"),
        ("egress.udsPath=relative.sock", "/egress/udsPath"),
    ],
)
def test_the_schema_refuses_a_wrong_value_naming_the_field(expression: str, field: str) -> None:
    args = ["template", chart.RELEASE, str(chart.CHART), "--set", expression]
    result = chart.run_helm(*args, check=False)
    assert result.returncode != 0, f"helm accepted {expression}"
    assert field in result.stderr, result.stderr


def test_the_schema_types_every_value() -> None:
    """Every value in values.yaml has a type (or enum) in values.schema.json, objects refuse
    unknown keys, and the defaults validate."""
    values = yaml.safe_load((chart.CHART / "values.yaml").read_text())
    schema = json.loads((chart.CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator(schema).validate(values)

    def walk(value: Any, node: dict[str, Any], path: str) -> None:
        assert "type" in node or "enum" in node, f"{path} has no type in the schema"
        if isinstance(value, dict) and "properties" in node:
            assert node.get("additionalProperties") is False, f"{path} allows unknown keys"
            for key, sub in value.items():
                assert key in node["properties"], f"{path}.{key} is not in the schema"
                walk(sub, node["properties"][key], f"{path}.{key}")

    walk(values, schema, "values")


def test_notes_say_what_to_do_next() -> None:
    out = chart.run_helm(
        "install", "ravenproxy", str(chart.CHART), "--dry-run=client", "--set", "l3.enabled=true"
    ).stdout
    notes = out[out.index("NOTES:") :]
    assert "docs/apiserver.md" in notes
    assert "ravenproxy-ipsec-psk" in notes
    assert "kubectl get csr" in notes


# --- every combination --------------------------------------------------------------------------


def every_workload() -> list[Any]:
    return [
        pytest.param(*p.values, id=f"{combo}-{p.id}", marks=p.marks)
        for combo in COMBOS
        for p in parser_params(workloads(combo))
    ]


@pytest.mark.parametrize("doc", every_workload())
def test_every_container_arg_is_accepted_by_the_real_parser(doc: dict[str, Any]) -> None:
    assert_args_accepted(doc)


@pytest.mark.parametrize("combo", COMBOS)
def test_objects_are_namespaced_labelled_and_selected(combo: str) -> None:
    accounts = {a["metadata"]["name"] for a in kinds(combo, "ServiceAccount")}
    for doc in render(combo):
        assert doc.get("apiVersion") and doc["metadata"].get("name"), doc
        if doc["kind"] not in ("CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"):
            if not doc["kind"].startswith("ValidatingAdmissionPolicy"):
                assert doc["metadata"].get("namespace") in ("kube-system", "default"), doc
    for doc in workloads(combo):
        labels = doc["spec"]["template"]["metadata"]["labels"]
        assert doc["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert doc["spec"]["template"]["spec"]["serviceAccountName"] in accounts
        for container in containers(doc):
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert set(sc["capabilities"].get("add", [])) <= {"NET_ADMIN", "NET_RAW"}
            mounts = {m["name"] for m in container.get("volumeMounts", [])}
            assert mounts <= {v["name"] for v in doc["spec"]["template"]["spec"].get("volumes", [])}
    # Every Service selects pods of some workload, on ports they declare.
    for service in kinds(combo, "Service"):
        selector = service["spec"]["selector"]
        (pod,) = [
            w["spec"]["template"]
            for w in workloads(combo)
            if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        declared = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= declared


# --- controller -----------------------------------------------------------------------------


def test_controller_two_replicas_probes_metrics_and_a_disruption_budget() -> None:
    doc = named("defaults", "Deployment", "ravenproxy-controller")
    assert doc["spec"]["replicas"] == 2
    container = the("controller", doc)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 10266, "health": 10275}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert "--metrics-addr=0.0.0.0:10266" in container["args"]
    assert "--health-addr=0.0.0.0:10275" in container["args"]
    (pdb,) = kinds("defaults", "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"] == doc["spec"]["selector"]


def test_service_monitor_scrapes_the_controllers_metrics_port() -> None:
    assert not kinds("defaults", "ServiceMonitor")
    (monitor,) = kinds("servicemonitor", "ServiceMonitor")
    service = named("servicemonitor", "Service", "ravenproxy-controller-metrics")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"


# --- server and agent ---------------------------------------------------------------------------


def test_agent_discovers_servers_by_default_or_dials_the_list() -> None:
    agent = parse(the("agent", named("defaults", "DaemonSet", "ravenproxy-agent")))
    assert agent.discover_servers and not agent.server_addr
    agent = parse(the("agent", named("all", "DaemonSet", "ravenproxy-agent")))
    assert not agent.discover_servers
    assert agent.server_addr == ["wss://proxy.example.com:10262"]


@pytest.mark.parametrize("combo", ["defaults", "certs-secret"])
def test_agent_settings_validate(combo: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    args = parse(the("agent", named(combo, "DaemonSet", "ravenproxy-agent")))
    if combo == "certs-secret":
        assert args.cert_file == "/etc/ravenproxy/certs/edge-1.crt"
        return  # the files do not exist here; the parser accepted them
    settings = AgentSettings.from_mapping(flags.gather(args, AgentSettings))
    assert settings.discover_servers and settings.cert_dir


def test_certs_secret_mode_mounts_the_secrets_read_only() -> None:
    for name, secret in (
        ("ravenproxy-server", "ravenproxy-server-certs"),
        ("ravenproxy-agent", "ravenproxy-agent-certs"),
    ):
        doc = named("certs-secret", "DaemonSet", name)
        (container,) = containers(doc)
        args = parse(container)
        assert args.cert_dir is None and args.ca_file == "/etc/ravenproxy/certs/ca.crt"
        (mount,) = container["volumeMounts"]
        assert mount["readOnly"] is True and mount["mountPath"] == "/etc/ravenproxy/certs"
        (volume,) = doc["spec"]["template"]["spec"]["volumes"]
        assert volume["secret"]["secretName"] == secret
    # No CSR permissions in Secret mode.
    names = {r["metadata"]["name"] for r in kinds("certs-secret", "ClusterRole")}
    assert "ravenproxy-certificate-requester" not in names


# --- egress -------------------------------------------------------------------------------------


def server_and_agent(combo: str) -> tuple[dict[str, Any], Any, Any]:
    doc = named(combo, "DaemonSet", "ravenproxy-server")
    server = parse(the("server", doc))
    agent = parse(the("agent", named(combo, "DaemonSet", "ravenproxy-agent")))
    return doc, server, agent


def test_egress_is_off_by_default() -> None:
    doc, server, agent = server_and_agent("defaults")
    assert (server.egress_uds, server.egress_addr) == (None, None)
    assert not server.allow_pods and not agent.allow_pods  # unset: the settings' default, off
    assert "egress" not in {v["name"] for v in doc["spec"]["template"]["spec"]["volumes"]}


def test_egress_uds_puts_the_socket_on_a_host_path_and_lets_agents_dial_pods() -> None:
    doc, server, agent = server_and_agent("egress-uds")
    path = "/etc/kubernetes/konnectivity-server/konnectivity-server.socket"
    assert (server.egress_uds, server.egress_uds_mode) == (path, "0600")
    assert server.egress_uds_owner is None
    assert server.egress_addr is None and server.allow_pods and agent.allow_pods
    (volume,) = [v for v in doc["spec"]["template"]["spec"]["volumes"] if v["name"] == "egress"]
    assert volume["hostPath"] == {
        "path": "/etc/kubernetes/konnectivity-server",
        "type": "DirectoryOrCreate",
    }
    (mount,) = [m for m in the("server", doc)["volumeMounts"] if m["name"] == "egress"]
    assert mount == {"name": "egress", "mountPath": "/etc/kubernetes/konnectivity-server"}
    _, server, _ = server_and_agent("all")
    assert server.egress_uds_owner == "0:0"


def test_egress_tcp_listens_with_the_client_ca_from_its_secret() -> None:
    doc, server, agent = server_and_agent("egress-tcp")
    assert server.egress_uds is None and server.allow_pods and agent.allow_pods
    assert server.egress_addr == ":8131"
    assert server.egress_client_ca_file == "/etc/ravenproxy/egress-client-ca/ca.crt"
    container = the("server", doc)
    assert {"name": "egress", "containerPort": 8131, "protocol": "TCP"} in container["ports"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "egress"]
    assert mount["mountPath"] == "/etc/ravenproxy/egress-client-ca" and mount["readOnly"]
    (volume,) = [v for v in doc["spec"]["template"]["spec"]["volumes"] if v["name"] == "egress"]
    assert volume["secret"]["secretName"] == "ravenproxy-egress-client-ca"


def test_server_runs_on_cloud_gateway_nodes_only() -> None:
    doc = named("defaults", "DaemonSet", "ravenproxy-server")
    terms = doc["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    (term,) = terms
    assert {"key": "raven.openyurt.io/gateway", "operator": "Exists"} in term["matchExpressions"]
    assert {
        "key": "openyurt.io/is-edge-worker",
        "operator": "NotIn",
        "values": ["true"],
    } in term["matchExpressions"]


# --- L3 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", ["strongswan", "wireguard"])
def test_l3_daemonset_on_gateway_nodes_host_network_two_capabilities(driver: str) -> None:
    combo = f"l3-{driver}"
    doc = named(combo, "DaemonSet", "ravenproxy-l3")
    pod = doc["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [{"key": "raven.openyurt.io/gateway", "operator": "Exists"}]
    for container in pod["containers"]:
        caps = container["securityContext"]["capabilities"]
        assert sorted(caps["add"]) == ["NET_ADMIN", "NET_RAW"]
        assert caps["drop"] == ["ALL"]
        assert "privileged" not in container["securityContext"]
    args = parse(the("l3", doc))
    assert args.command == "agent" and args.l3 and args.vpn_driver == driver
    # The gateway nodes' agent is this one: the edge agent DaemonSet stays off them.
    agent = named(combo, "DaemonSet", "ravenproxy-agent")["spec"]["template"]["spec"]
    (term,) = agent["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [
        {"key": "raven.openyurt.io/gateway", "operator": "DoesNotExist"}
    ]
    default_agent = named("defaults", "DaemonSet", "ravenproxy-agent")["spec"]["template"]["spec"]
    assert "affinity" not in default_agent
    assert not [d for d in workloads("defaults") if d["metadata"]["name"] == "ravenproxy-l3"]


def mount_path(container: dict[str, Any], volume: str) -> str:
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume]
    return str(mount["mountPath"])


def test_strongswan_charon_sidecar_shares_the_vici_socket_and_the_psk_is_mounted() -> None:
    doc = named("l3-strongswan", "DaemonSet", "ravenproxy-l3")
    pod = doc["spec"]["template"]["spec"]
    l3, charon = the("l3", doc), the("charon", doc)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["vici"] == {"name": "vici", "emptyDir": {}}
    args = parse(l3)
    socket_dir = mount_path(l3, "vici")
    assert mount_path(charon, "vici") == socket_dir
    assert args.vici_socket.rsplit("/", 1)[0] == socket_dir
    # charon serves VICI on that same socket (its strongswan.d snippet).
    conf = named("l3-strongswan", "ConfigMap", "ravenproxy-charon")["data"]["ravenproxy.conf"]
    assert f"socket = unix://{args.vici_socket}" in conf
    assert mount_path(charon, "charon-conf").startswith("/etc/strongswan.d/")
    # The PSK file is the Secret's "psk" key.
    assert args.psk_file == mount_path(l3, "psk") + "/psk"
    assert volumes["psk"]["secret"]["secretName"] == "ravenproxy-ipsec-psk"
    assert named("l3-strongswan", "Secret", "ravenproxy-ipsec-psk")["data"]["psk"]


# Runs in fresh net, mount and pid namespaces (the pid namespace ends every process in it when the
# script exits): a private /run with the emptyDir's directory, charon with the pod's capability
# set and the chart's strongswan.d snippet, then a VICI client with the l3 container's
# capabilities on the socket the driver is given.
CHARON_POD = """
set -e
mount -t tmpfs tmpfs /run
mkdir -p {socket_dir}
ip link set lo up
STRONGSWAN_CONF={conf} {charon_caps} {charon} > {out}/charon.out 2>&1 &
for i in $(seq 100); do [ -S {socket} ] && break; sleep 0.1; done
{l3_caps} {python} -c '{client}' {socket}
ss -Hlun
"""
VICI_CLIENT = (
    "import socket, sys, vici; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
    'print("daemon", vici.Session(s).version()["daemon"].decode())'
)


def setpriv(container: dict[str, Any]) -> str:
    """The container's capability set as setpriv arguments (uid 0, as the pod runs)."""
    caps = container["securityContext"]["capabilities"]
    assert caps["drop"] == ["ALL"]
    keep = ",".join(f"+{c.lower()}" for c in caps.get("add", []))
    return f"setpriv --bounding-set=-all,{keep} --inh-caps=-all"


@pytest.mark.root
def test_charon_runs_with_the_pods_capabilities_and_serves_the_drivers_socket(
    tmp_path: Path,
) -> None:
    doc = named("l3-strongswan", "DaemonSet", "ravenproxy-l3")
    l3, charon = the("l3", doc), the("charon", doc)
    socket_path = parse(l3).vici_socket
    snippet = named("l3-strongswan", "ConfigMap", "ravenproxy-charon")["data"]["ravenproxy.conf"]
    (tmp_path / "ravenproxy.conf").write_text(snippet)
    # What Debian's /etc/strongswan.conf does, plus the snippet the pod mounts in strongswan.d.
    conf = tmp_path / "strongswan.conf"
    conf.write_text(
        "charon {\n  load_modular = yes\n  plugins {\n"
        "    include /etc/strongswan.d/charon/*.conf\n  }\n}\n"
        f"include /etc/strongswan.d/*.conf\ninclude {tmp_path}/ravenproxy.conf\n"
    )
    script = CHARON_POD.format(
        socket_dir=mount_path(l3, "vici"),
        socket=socket_path,
        conf=conf,
        charon=" ".join(charon["command"]),
        charon_caps=setpriv(charon),
        l3_caps=setpriv(l3),
        python=sys.executable,
        client=VICI_CLIENT,
        out=tmp_path,
    )
    proc = subprocess.Popen(
        ["unshare", "--net", "--mount", "--pid", "--fork", "sh", "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = (tmp_path / "charon.out").read_text() if (tmp_path / "charon.out").exists() else ""
    assert proc.returncode == 0, out + log
    assert "daemon charon" in out, out + log
    # IKE on the NAT-T port only: nothing on UDP 500 (which would need CAP_NET_BIND_SERVICE).
    local_ports = {
        line.split()[3].rsplit(":", 1)[1] for line in out.splitlines() if "UNCONN" in line
    }
    assert "4500" in local_ports and "500" not in local_ports, out


def test_wireguard_keeps_its_keys_on_the_node_and_has_no_charon() -> None:
    doc = named("l3-wireguard", "DaemonSet", "ravenproxy-l3")
    assert [c["name"] for c in containers(doc)] == ["l3"]
    l3 = the("l3", doc)
    assert parse(l3).wireguard_key_dir == mount_path(l3, "wireguard-keys")
    volumes = {v["name"]: v for v in doc["spec"]["template"]["spec"].get("volumes", [])}
    assert volumes["wireguard-keys"]["hostPath"]["type"] == "DirectoryOrCreate"
    assert volumes["tun"]["hostPath"] == {"path": "/dev/net/tun", "type": "CharDevice"}
    assert not kinds("l3-wireguard", "Secret")


def psk(rendered: str) -> bytes:
    (secret,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Secret"]
    return base64.b64decode(secret["data"]["psk"])


def test_the_psk_is_never_a_constant_and_upgrades_keep_it() -> None:
    sets = ("l3.enabled=true",)
    first, second = psk(chart.template(*sets)), psk(chart.template(*sets))
    assert first != second  # no cluster to look up: a fresh random key each render
    assert len(first) >= 32 and first.isalnum()
    # An upgrade finds the existing Secret through lookup and keeps its key.
    template = (chart.CHART / "templates" / "l3.yaml").read_text()
    assert 'lookup "v1" "Secret" "kube-system"' in template
    assert "randAlphaNum" in template
    assert "helm.sh/resource-policy: keep" in template


def test_an_existing_psk_secret_is_used_and_none_is_made() -> None:
    docs = [
        d for d in yaml.safe_load_all(chart.template("l3.enabled=true", "l3.pskSecret=my-psk")) if d
    ]
    assert not [d for d in docs if d["kind"] == "Secret"]
    (ds,) = [d for d in docs if d["metadata"]["name"] == "ravenproxy-l3"]
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes["psk"]["secret"]["secretName"] == "my-psk"


# --- dns ----------------------------------------------------------------------------------------


def test_dns_deployment_and_service(tmp_path: Path) -> None:
    assert not [d for d in workloads("defaults") if d["metadata"]["name"] == "ravenproxy-dns"]
    doc = named("dns", "Deployment", "ravenproxy-dns")
    container = the("dns", doc)
    args = parse(container)
    kubeconfig = named("dns", "ConfigMap", "ravenproxy-dns-kubeconfig")["data"]["kubeconfig"]
    assert args.kubeconfig == mount_path(container, "kubeconfig") + "/kubeconfig"
    config = yaml.safe_load(kubeconfig)
    assert config["users"][0]["user"]["tokenFile"].endswith("serviceaccount/token")
    # The settings check that the file exists: here, the ConfigMap's content where the pod
    # would find it mounted.
    (tmp_path / "kubeconfig").write_text(kubeconfig)
    args.kubeconfig = str(tmp_path / "kubeconfig")
    cmd = DnsCommand.from_mapping(flags.gather(args, DnsCommand))
    assert (cmd.listen.host, cmd.listen.port) == ("0.0.0.0", 10053)
    service = named("dns", "Service", "ravenproxy-dns")
    assert {(p["port"], p["protocol"]) for p in service["spec"]["ports"]} == {
        (53, "UDP"),
        (53, "TCP"),
    }
    # Its account may read the DNS map and nothing else.
    (role,) = [r for r in kinds("dns", "Role") if r["metadata"]["name"] == "ravenproxy-dns"]
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["edge-tunnel-nodes"],
            "verbs": ["get", "list", "watch"],
        }
    ]


async def test_the_dns_kubeconfig_loads_in_the_real_client(tmp_path: Path) -> None:
    """The pod's service account, as the kubeconfig the chart gives `ravenproxy dns`: the real
    kubernetes_asyncio loader reads the token file and the CA (paths moved under tmp_path)."""
    text = named("dns", "ConfigMap", "ravenproxy-dns-kubeconfig")["data"]["kubeconfig"]
    sa = "/var/run/secrets/kubernetes.io/serviceaccount"
    assert f"{sa}/token" in text and f"{sa}/ca.crt" in text
    (tmp_path / "token").write_text("tok-123")
    ca_cert, _key = generate_ca()
    (tmp_path / "ca.crt").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    path = tmp_path / "kubeconfig"
    path.write_text(text.replace(sa, str(tmp_path)))
    api = await new_api_client(path)
    async with api:
        assert api.configuration.host == "https://kubernetes.default.svc"
        assert api.configuration.ssl_ca_cert == str(tmp_path / "ca.crt")
        auth = api.configuration.api_key.get("BearerToken") or api.configuration.api_key.get(
            "authorization"
        )
        assert auth is not None and auth.endswith("tok-123")


# --- k8s/ is the default render ------------------------------------------------------------------


def test_k8s_is_in_sync_with_the_chart() -> None:
    wanted = chart.default_manifests()
    for name, text in wanted.items():
        path = chart.K8S / name
        assert path.is_file(), f"k8s/{name} is missing: run `make manifests`"
        assert path.read_text() == text, f"k8s/{name} differs from the chart: run `make manifests`"
    on_disk = {
        p.relative_to(chart.K8S).as_posix()
        for p in chart.K8S.rglob("*.yaml")
        if p.relative_to(chart.K8S).parts[0] != "helm"
    }
    assert on_disk == set(wanted), "k8s/ has YAML the chart does not render"
