"""The issuing CA, kept in the Secret ``kube-system/ravenproxy-ca``, and the CA bundle every
requester trusts, the ConfigMap ``kube-system/ravenproxy-ca-bundle`` (key ``ca.crt``).

The leader reads the Secret when it starts leading; absent, it generates a CA
(:func:`~ravenproxy.pki.authority.generate_ca`) and creates it — if another replica was faster
(409), it reads theirs. It then makes sure the bundle holds this CA's certificate, rewriting it
only when it does not: during a CA rotation an operator may put several CA certificates in the
bundle, and the controller only ever adds its own, never removes another.

The pure parts (:func:`ca_from_secret`, :func:`secret_for`, :func:`bundle_with`) are beside the
two thin appliers (:func:`ensure_ca`, :func:`ensure_bundle`).
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Mapping
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ravenproxy.controller.writer import KubeWriter
from ravenproxy.errors import PKIError
from ravenproxy.kube.labels import LABEL_MANAGED_BY, MANAGED_BY
from ravenproxy.log import kv
from ravenproxy.pki.authority import generate_ca
from ravenproxy.pki.issuance import CA_BUNDLE, CA_BUNDLE_KEY, CA_NAMESPACE, CA_SECRET
from ravenproxy.pki.pemfiles import cert_pem, key_pem, parse_certs_pem, parse_key_pem

log = logging.getLogger(__name__)

CA = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]
WHERE = f"Secret {CA_NAMESPACE}/{CA_SECRET}"


def _field(data: Mapping[str, Any], key: str) -> bytes:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise PKIError(f"{WHERE}: no {key}")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise PKIError(f"{WHERE}: {key} is not base64: {exc}") from exc


def ca_from_secret(secret: Mapping[str, Any]) -> CA:
    """The CA certificate and key in the Secret's ``tls.crt`` / ``tls.key``."""
    data = secret.get("data") or {}
    cert = parse_certs_pem(_field(data, "tls.crt"), f"{WHERE} tls.crt")[0]
    key = parse_key_pem(_field(data, "tls.key"), f"{WHERE} tls.key")
    ours = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    theirs = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    if ours != theirs:
        raise PKIError(f"{WHERE}: tls.key does not match tls.crt")
    return cert, key


def secret_for(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> dict[str, Any]:
    """The CA Secret (type kubernetes.io/tls) holding ``cert`` and ``key``."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {
            "name": CA_SECRET,
            "namespace": CA_NAMESPACE,
            "labels": {LABEL_MANAGED_BY: MANAGED_BY},
        },
        "data": {
            "tls.crt": base64.b64encode(cert_pem(cert)).decode(),
            "tls.key": base64.b64encode(key_pem(key)).decode(),
        },
    }


def bundle_with(current: str | None, ca_cert: x509.Certificate) -> str | None:
    """The bundle text once it holds ``ca_cert``: None when ``current`` holds it already (no
    write), else ``current``'s certificates with ours appended (unreadable text is replaced)."""
    ours = cert_pem(ca_cert).decode()
    if not current or not current.strip():
        return ours
    try:
        certs = x509.load_pem_x509_certificates(current.encode())
    except ValueError:
        return ours
    if ca_cert in certs:
        return None
    kept = "".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in certs)
    return kept + ours


async def ensure_ca(writer: KubeWriter) -> CA:
    """The CA from its Secret, created first if absent (only the leader calls this)."""
    secret = await writer.read_secret(CA_NAMESPACE, CA_SECRET)
    if secret is None:
        cert, key = generate_ca()
        if await writer.create_secret(CA_NAMESPACE, secret_for(cert, key)):
            log.info(
                "controller: CA created",
                extra=kv(secret=WHERE, serial=f"{cert.serial_number:x}"),
            )
            return cert, key
        secret = await writer.read_secret(CA_NAMESPACE, CA_SECRET)
        if secret is None:
            raise PKIError(f"{WHERE}: exists (409 on create) but cannot be read")
    cert, key = ca_from_secret(secret)
    log.info("controller: CA loaded", extra=kv(secret=WHERE, serial=f"{cert.serial_number:x}"))
    return cert, key


async def ensure_bundle(writer: KubeWriter, ca_cert: x509.Certificate) -> bool:
    """Make the bundle ConfigMap hold ``ca_cert``; True when it was written."""
    current = await writer.read_named_configmap(CA_NAMESPACE, CA_BUNDLE)
    text = ((current or {}).get("data") or {}).get(CA_BUNDLE_KEY)
    wanted = bundle_with(text if isinstance(text, str) else None, ca_cert)
    if wanted is None:
        return False
    rv = (current or {}).get("metadata", {}).get("resourceVersion") if current else None
    await writer.put_configmap_data(CA_NAMESPACE, CA_BUNDLE, {CA_BUNDLE_KEY: wanted}, rv)
    log.info("controller: CA bundle written", extra=kv(configmap=f"{CA_NAMESPACE}/{CA_BUNDLE}"))
    return True
