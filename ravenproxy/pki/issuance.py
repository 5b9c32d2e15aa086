"""Names shared by both ends of Kubernetes certificate issuance: the requesters (agent and
server with ``--cert-dir``) and the controller that approves and signs.

Requesters create ``certificates.k8s.io/v1`` CertificateSigningRequests with one of our two
signer names; the controller signs them with the CA kept in the Secret ``CA_SECRET`` and
publishes the CA certificate(s) every requester trusts in the ConfigMap ``CA_BUNDLE``. In a
``--cert-dir`` the requester keeps ``CERT_DIR_CA``, ``CERT_DIR_CERT`` and ``CERT_DIR_KEY``.
"""

from __future__ import annotations

from typing import Any, Final, Literal

SIGNER_AGENT: Final = "raven.openyurt.io/tunnel-agent"
SIGNER_SERVER: Final = "raven.openyurt.io/tunnel-server"
SIGNERS: Final = (SIGNER_AGENT, SIGNER_SERVER)

Role = Literal["agent", "server"]
SIGNER_OF_ROLE: Final[dict[str, str]] = {"agent": SIGNER_AGENT, "server": SIGNER_SERVER}
# certificates.k8s.io/v1 key usages a requester asks for, per role. ECDSA keys only sign (ECDHE
# key exchange), so no "key encipherment" (the kubelet asks for it only with RSA keys).
USAGES: Final[dict[str, tuple[str, ...]]] = {
    "agent": ("digital signature", "client auth"),
    "server": ("digital signature", "server auth"),
}

CA_NAMESPACE: Final = "kube-system"
CA_SECRET: Final = "ravenproxy-ca"  # type kubernetes.io/tls: tls.crt, tls.key (the CA's key)
CA_BUNDLE: Final = "ravenproxy-ca-bundle"  # ConfigMap, key CA_BUNDLE_KEY: PEM CA certificate(s)
CA_BUNDLE_KEY: Final = "ca.crt"

CERT_LIFETIME: Final = 86400.0
"""The ``expirationSeconds`` a ``--cert-dir`` requester asks for (``--cert-lifetime``)."""
CERT_LIFETIME_OPTION: Final[dict[str, Any]] = {
    "flag": "--cert-lifetime",
    "metavar": "S",
    "help": "with --cert-dir: the lifetime asked for (expirationSeconds, at least 600; the "
    "signer may cap it); rotation starts at 70-90 % of it",
}
"""The flag (:mod:`ravenproxy.flags` metadata) of the agent's and the server's ``cert_lifetime``:
declared here once for both."""

CERT_DIR_CA: Final = "ca.crt"
CERT_DIR_CERT: Final = "tls.crt"
CERT_DIR_KEY: Final = "tls.key"

# The extra a bound service-account token carries for the node its pod runs on.
NODE_NAME_EXTRA: Final = "authentication.kubernetes.io/node-name"
NODE_USER_PREFIX: Final = "system:node:"
