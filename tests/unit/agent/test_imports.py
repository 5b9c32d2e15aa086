"""An agent imports only what its flags need (issue 15: an idle agent light enough for an edge
box). A real ``ravenproxy agent`` CLI run in a child process: once its dial loop has run (its
server is away: the first "cannot reach the server" line), it writes the modules it has loaded
and stops itself with SIGTERM. Module names are asserted, not RSS (that is benchmarks/idle_cost.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from pathlib import Path

import pytest

from ravenproxy.pki import init_pki
from ravenproxy.pki.authority import generate_ca
from tests.helpers import free_port, spawn_python, stop
from tests.integration.cluster import Cluster
from tests.integration.kube.apiserver import APIServer
from tests.integration.kube.test_cert_requester import Signer, publish_bundle, running

# The optional capabilities, each loaded in one place when its flag asks for it.
HEAVY = {
    "kubernetes_asyncio": "kubernetes_asyncio (the controller's client: --kube-model and "
    "--cert-dir read, watch and write with ravenproxy.kube.rest, on asyncio streams and httptools)",
    "urllib3": "the Kubernetes client's dependency",
    "aiohttp": "the metrics/health HTTP server (--metrics-addr, --health-addr)",
    "ravenproxy.metrics_http": "the metrics/health HTTP server",
    "pyroute2": "netlink (--l3)",
    "ravenproxy.l3.driver": "the L3 drivers (--l3)",
    "ravenproxy.kube.client": "the Kubernetes plumbing",
    "ravenproxy.controller.issuer": "the controller's CSR issuer",
    "ravenproxy.server.app": "the server",
    "cryptography": "x509 parsing (the agent reads and checks its certificates with ssl: "
    "ravenproxy.pki.x509info; issuing, CSRs and certs commands keep cryptography)",
    "ravenproxy.pki.authority": "the CA (issuing)",
    "ravenproxy.pki.csr": "keys and CSRs (--cert-dir: only when a certificate is requested; "
    "the one held is checked with ssl, ravenproxy.pki.issued)",
    "yaml": "PyYAML (--config, a YAML kubeconfig; API objects are JSON; an --inventory's YAML "
    "is read in a child, ravenproxy.model.inventory.aload_inventory)",
    "ravenproxy.model.safeyaml": "the inventory's YAML loader (in the child)",
    "pickle": "pickle.py (the inventory's documents come back from the child through _pickle)",
    "prometheus_client": "the metrics themselves (--metrics-addr: nothing else reads them; "
    "without it ravenproxy.metrics.AgentMetrics keeps none)",
    "websockets.asyncio.client": "websockets' asyncio client (the agent dials with "
    "ravenproxy.transport.ws_client.connect, on websockets' sans-I/O client protocol)",
    "websockets.asyncio": "websockets' asyncio connection (the agent's tunnel connection is "
    "ravenproxy.transport.ws_client's own, on websockets' sans-I/O client protocol)",
    "uuid": "websockets.protocol's connection id (the agent's client protocol is made without "
    "it: ravenproxy.transport.ws_client.client_protocol)",
    "platform": "uuid's",
    "inspect": "asyncio's and uvloop's few reads of it (stand-ins: ravenproxy.agent.deferred), "
    "and dataclasses' generated docstring for a class without one (give the agent's dataclasses "
    "a docstring)",
    "ast": "inspect's",
    "dis": "inspect's",
    "websockets.asyncio.server": "websockets' server side (the tunnel listener's connection "
    "class lives with the listener, ravenproxy.transport.ws_server)",
    "ravenproxy.transport.ws_server": "the tunnel listener",
    "urllib.request": "proxy detection (websockets.asyncio.client) and prometheus_client's "
    "exposition: with http.client and email's parser, ~2 MB of an idle agent",
    "http.server": "prometheus_client's exposition",
    "ravenproxy.server.settings": "the server's settings (the CLI builds the parser of the "
    "command it runs only)",
    "ravenproxy.controller.settings": "the controller's and dns's settings",
    "ravenproxy.pki.command": "the certs command",
    "argparse": "the CLI's parser, for help and errors only: an agent's plain command line is read "
    "without it (ravenproxy.flags.plain_values)",
    "gettext": "argparse's",
    "ravenproxy.cli_parser": "the CLI's parser",
    "ravenproxy.lab": "the lab command",
    # Deferred (ravenproxy.agent.deferred): imported by libraries, never used by an agent.
    "importlib.metadata": "websockets.version's (a development checkout of websockets only), "
    "with email.message, zipfile, csv, importlib.resources",
    "zipfile": "importlib.metadata's",
    "email.utils": "websockets.server's Date header (the server side)",
    "email.charset": "email.utils'",
    "calendar": "email.utils' and time.strptime's",
    "_strptime": "time.strptime (ssl.cert_time_to_seconds): the agent reads its certificate's "
    "validity with ravenproxy.pki.x509info",
    "stringprep": "the idna codec's, for non-ASCII host names only",
    "bz2": "shutil's archive formats",
    "lzma": "shutil's archive formats",
    "difflib": "a misspelt field's suggestion (ravenproxy.model.parse), on that error only",
    "tempfile": "a client certificate in a kubeconfig, or no memfd (ravenproxy.pki.x509info)",
    # Deferred by the entry point, before the CLI's imports bring them.
    "asyncio.sslproto": "asyncio's TLS over memory BIOs (the agent runs uvloop's, and its tunnel "
    "TLS on the socket)",
    "textwrap": "argparse's help and traceback's exception notes (imported by logging)",
    "tokenize": "linecache's reading of source files for tracebacks (imported by logging)",
    "queue": "concurrent.futures.thread's (uvloop imports it): a default executor's",
    # Deferred before the CLI's imports (ravenproxy.agent.deferred), with stand-ins for the names
    # uvloop and asyncio read at their import.
    "traceback": "asyncio's and uvloop's debug-mode source tracebacks, an exception logged",
    "linecache": "traceback's",
    "subprocess": "the stdlib's children (uvloop starts the agent's: ravenproxy.children)",
    "locale": "subprocess's text mode",
    "selectors": "asyncio's own event loop and socket.sendfile (the agent runs uvloop)",
    "asyncio.trsock": "asyncio's own event loop's sockets",
    "asyncio.staggered": "asyncio's own event loop's Happy Eyeballs",
    "copy": "dataclasses' asdict and astuple",
    "shutil": "argparse's help width (the CLI's formatter finds it without shutil)",
}

# Runs the real entry point (its preparation first, before the probe's own imports: logging
# brings textwrap and tokenize); the dump happens from a log handler, on the process's own
# event: ``-c PROBE OUT LOGGER MESSAGE COMMAND [ARGS]`` writes the modules loaded into OUT when
# LOGGER logs MESSAGE, then stops the process with SIGTERM.
PROBE = """
import sys
import ravenproxy.__main__ as entry

out, logger, message, argv = *sys.argv[1:4], sys.argv[4:]
entry.prepare(argv)

import logging, os, signal
from ravenproxy import cli

class Dump(logging.Handler):
    done = False

    def emit(self, record):
        if not self.done and record.getMessage() == message:
            self.done = True
            # A deferred module (ravenproxy.lazymodule) whose code never ran is not loaded.
            loaded = [n for n, m in sys.modules.items() if type(m).__name__ != "LazyModule"]
            # And the sizes of frame_batch's tables, as words beside the names.
            batch = sys.modules.get("ravenproxy.transport.frame_batch")
            if batch is not None:
                loaded += [f"{t}:{len(getattr(batch, t))}" for t in ("_HEADS", "_frame_keys")]
            with open(out, "w") as f:
                f.write("\\n".join(sorted(loaded)))
            os.kill(os.getpid(), signal.SIGTERM)

logging.getLogger(logger).addHandler(Dump())
sys.exit(cli.main(argv))
"""


def loaded_modules(
    tmp_path: Path,
    *extra: str,
    cert_dir: Path | None = None,
    filled: bool = True,
    server: str | None = None,
) -> set[str]:
    """The modules of an agent run with ``extra`` flags; its certificate files, or ``cert_dir``
    (--cert-dir, holding a usable set: the agent starts with it, as after a restart; empty
    unless ``filled``: the agent requests one first). Without ``server`` (a --server-addr)
    nothing listens where it dials: the modules once its first dial failed; with it, once its
    tunnel is up."""
    certs = tmp_path / "certs"
    if not certs.exists():
        init_pki(certs, ("localhost",), ("edge-1",))
    files = [
        "--ca-file", str(certs / "ca.crt"),
        "--cert-file", str(certs / "edge-1.crt"),
        "--key-file", str(certs / "edge-1.key"),
    ]  # fmt: skip
    if cert_dir is not None:
        cert_dir.mkdir()
        pairs = (("ca.crt", "ca.crt"), ("edge-1.crt", "tls.crt"), ("edge-1.key", "tls.key"))
        for src, dst in pairs if filled else ():
            (cert_dir / dst).write_bytes((certs / src).read_bytes())
        files = ["--cert-dir", str(cert_dir)]
    out = tmp_path / f"modules{len(extra)}.txt"
    log = tmp_path / f"agent{len(extra)}.log"
    message = "tunnel up" if server else "cannot reach the server, retrying"
    args = [
        "-c", PROBE, str(out), "ravenproxy.agent", message,
        "agent",
        "--node-name", "edge-1",
        "--server-addr", server or f"wss://127.0.0.1:{free_port()}",
        *files,
        "--allow", "127.0.0.1:1",
        *extra,
    ]  # fmt: skip
    proc = spawn_python(args, log)
    try:
        code = proc.wait(60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the agent did not stop: {log.read_text()[-2000:]}")
    finally:
        stop(proc)
    assert out.exists(), f"exit {code}, no dump: {log.read_text()[-2000:]}"
    return set(out.read_text().split())


def present(modules: set[str], name: str) -> bool:
    return any(m == name or m.startswith(name + ".") for m in modules)


def test_default_flags_load_no_optional_capability(tmp_path: Path) -> None:
    modules = loaded_modules(tmp_path)
    assert "ravenproxy.agent.app" in modules and "websockets" in modules
    loaded = {name: why for name, why in HEAVY.items() if present(modules, name)}
    assert not loaded, f"an agent with default flags loaded {loaded}"


def test_agent_with_its_tunnel_up_loads_no_optional_capability(tmp_path: Path) -> None:
    """Connected to a real server (TLS, the opening handshake, the session's SETTINGS): the
    tunnel's connection is ravenproxy.transport.ws_client's own, so neither websockets' asyncio
    modules nor uuid (websockets.protocol's connection id) and platform are loaded."""
    cluster = Cluster(tmp_path)  # its PKI is the one loaded_modules uses (tmp_path / "certs")
    try:
        server = cluster.start_server()
        modules = loaded_modules(tmp_path, server=f"wss://127.0.0.1:{server.ports['tunnel']}")
    finally:
        cluster.stop_all()
    assert "ravenproxy.transport.ws_client" in modules and "ravenproxy.transport.session" in modules
    loaded = {name: why for name, why in HEAVY.items() if present(modules, name)}
    assert not loaded, f"an agent with its tunnel up loaded {loaded}"
    # Its frames are masked: the unmasked headers' table (~45 KB) is never made; single frames'
    # keys are drawn 256 at a time, not 1 024 (~45 KB of 4-byte objects).
    assert "_HEADS:0" in modules
    (keys,) = [int(m.split(":")[1]) for m in modules if m.startswith("_frame_keys:")]
    assert keys < 256


def test_metrics_flag_loads_the_http_server(tmp_path: Path) -> None:
    # The same probe sees a capability its flag asks for: the names above are the real ones.
    modules = loaded_modules(tmp_path, "--metrics-addr", f"127.0.0.1:{free_port()}")
    assert present(modules, "aiohttp.web")
    assert "ravenproxy.metrics_http" in modules
    assert present(modules, "prometheus_client")
    assert not present(modules, "kubernetes_asyncio")


def test_inventory_flag_loads_no_yaml_and_nothing_else_heavy(tmp_path: Path) -> None:
    """The inventory is loaded (the agent dials once its model is in), its YAML read in a
    child: PyYAML (~0.8 MB of an idle agent) is not imported here."""
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "apiVersion: v1\nkind: Node\nmetadata: {name: edge-1, labels: "
        "{raven.openyurt.io/gateway: gw-edge}}\n"
        "status:\n  addresses: [{type: InternalIP, address: 127.0.0.1}]\n"
    )
    modules = loaded_modules(tmp_path, "--inventory", str(inventory))
    assert "ravenproxy.model.inventory" in modules
    # The model is built in the default executor: its thread pool takes queue.
    loaded = {name for name in HEAVY if name != "queue" and present(modules, name)}
    assert not loaded, f"an agent with --inventory loaded {loaded}"


@pytest.mark.parametrize(
    "cert_dir", [None, "filled", "empty"], ids=["files", "cert-dir", "cert-dir-requested"]
)
async def test_kube_model_loads_no_kubernetes_asyncio_aiohttp_cryptography_or_yaml(
    tmp_path: Path, cert_dir: str | None
) -> None:
    """--kube-model against the API emulator (the shipped DaemonSet's flags): the model is
    listed and watched (the agent dials only once its first model is in), and with --cert-dir
    holding a valid certificate the CA bundle ConfigMap is watched, on ravenproxy.kube.rest, not
    kubernetes_asyncio and aiohttp, and neither cryptography nor PyYAML is loaded. With an empty
    --cert-dir the agent requests a certificate first (signed as the controller would): its key
    and CSR are made in a child process, so cryptography is not loaded then either."""
    api = APIServer()
    await api.start()
    try:
        await api.put("nodes", {"metadata": {"name": "edge-1"}})
        # A kubeconfig is YAML or JSON: JSON keeps PyYAML out too.
        if cert_dir == "empty":
            ca = generate_ca("test-cluster-ca")
            await publish_bundle(api, ca[0])
            token = api.add_service_account("ravenproxy-agent", "edge-1")
        else:
            token = api.add_node_user("edge-1")
        config = tmp_path / "kubeconfig"
        config.write_text(
            json.dumps(
                {
                    "clusters": [{"name": "emu", "cluster": {"server": api.url}}],
                    "users": [{"name": "emu", "user": {"token": token}}],
                    "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "emu"}}],
                    "current-context": "emu",
                }
            )
        )
        # The child is waited for in a thread: the emulator serves it from this event loop.
        async with contextlib.AsyncExitStack() as stack:
            if cert_dir == "empty":
                signer = await stack.enter_async_context(running(Signer(api, ca)))
            modules = await asyncio.to_thread(
                loaded_modules,
                tmp_path,
                "--kube-model",
                "--kubeconfig",
                str(config),
                cert_dir=tmp_path / "cert-dir" if cert_dir else None,
                filled=cert_dir == "filled",
            )
        if cert_dir == "empty":
            assert len(signer.seen) == 1, "no certificate was requested"
        paths = {r.path for r in api.requests}
        assert "/api/v1/nodes" in paths, "the model was not listed"
        if cert_dir:
            assert "/api/v1/namespaces/kube-system/configmaps" in paths, paths
    finally:
        await api.close()
    assert "ravenproxy.kube.rest" in modules and "httptools" in modules
    # Neither PyYAML (API objects are JSON, the kubeconfig is JSON here) nor, with a valid
    # certificate in --cert-dir, cryptography: the certificate held is checked with ssl.
    loaded = {n: why for n, why in HEAVY.items() if present(modules, n)}
    assert not loaded, f"an agent with --kube-model loaded {loaded}"
    if cert_dir:
        assert "ravenproxy.pki.issued" in modules, "the certificate was not checked"
