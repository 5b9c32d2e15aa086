"""The server presents its kubelet client certificate only for a client that authenticated to
it (issue 8, item 3: no confused deputy).

The shared L7 server runs with ``--kubelet-cert-file`` and ``--front-client-ca-file`` (the fake
cluster CA that also signed the kubelet-client certificate). The fake kubelet's ``/whoami``
answers the CN of the client certificate it was shown, or ``anonymous``.
"""

from __future__ import annotations

import pytest

from tests.helpers import raw_exchange, run
from tests.integration.l7.env import EDGE_IP, KUBELET_CLIENT_CN, L7, curl

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


async def test_plain_http_request_for_https_gets_no_client_certificate(l7: L7) -> None:
    # A forward-proxy request for an https:// URI on the plain HTTP front: TLS is re-originated
    # to the kubelet, but nobody authenticated, so no client certificate reaches it.
    port = l7.kubelet.tls_port
    for authority in (f"edge-1:{port}", f"{EDGE_IP}:{port}"):
        answer = await raw_exchange(
            l7.http,
            f"GET https://{authority}/whoami HTTP/1.1\r\nHost: {authority}\r\n"
            "Connection: close\r\n\r\n".encode(),
        )
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), answer
        assert body == b"anonymous", answer


async def test_terminated_https_without_a_client_certificate_is_anonymous(l7: L7) -> None:
    status, body = await curl(
        "--cacert", str(l7.ca), "-H", "Host: edge-1", f"https://127.0.0.1:{l7.https}/whoami"
    )  # fmt: skip
    assert (status, body) == (200, "anonymous")
    # With the cluster's client certificate, the server speaks for it.
    status, body = await curl(
        "--cacert", str(l7.ca), *l7.client_cert, "-H", "Host: edge-1",
        f"https://127.0.0.1:{l7.https}/whoami",
    )  # fmt: skip
    assert (status, body) == (200, KUBELET_CLIENT_CN)
    m = await l7.cluster.metrics()
    assert m['ravenproxy_server_kubelet_tls_total{client_cert="withheld"}'] >= 1
    assert m['ravenproxy_server_kubelet_tls_total{client_cert="presented"}'] >= 1


async def test_a_client_certificate_from_another_ca_is_refused(l7: L7) -> None:
    # A certificate the front cannot verify fails the handshake (as nginx's optional_verify
    # does): it is not silently treated as anonymous.
    crt, key = l7.cluster.other_ca_cert("mallory")
    code, _, err = await run(
        "curl", "-sS", "--cacert", str(l7.ca), "--cert", str(crt), "--key", str(key),
        "-H", "Host: edge-1", f"https://127.0.0.1:{l7.https}/whoami",
    )  # fmt: skip
    assert code != 0, err
