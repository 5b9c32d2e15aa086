"""A CA's answer to a certificate signing request, for tests of the requester.

The controller's signer (issue 11 item 4) is what signs in a cluster; the requester's tests
stand in for it with this: a leaf for the CSR's public key and subject, signed by a CA from
:func:`ravenproxy.pki.authority.generate_ca`, with the usages of the signer's role and the
validity the test chooses (60 s for a rotation test).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from ravenproxy.pki.pemfiles import cert_pem


def sign_csr(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    csr_pem: bytes,
    role: str,
    lifetime: dt.timedelta = dt.timedelta(hours=1),
    *,
    public_key: ec.EllipticCurvePublicKey | None = None,
    backdate: dt.timedelta = dt.timedelta(0),
    drop: Collection[str] = (),
) -> bytes:
    """PEM leaf for ``csr_pem``, valid for ``lifetime`` from ``backdate`` ago (a certificate
    part of whose life has passed); ``public_key`` overrides the CSR's (a certificate for
    another key). Agent certificates carry the CN as their only DNS SAN, as the embedded PKI's
    do. A server certificate leaves out the SANs in ``drop`` (a signer that would not
    vouch for them)."""
    csr = x509.load_pem_x509_csr(csr_pem)
    cn = csr.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)[0].value
    assert isinstance(cn, str)
    if role == "agent":
        sans: list[x509.GeneralName] = [x509.DNSName(cn)]
        usage = ExtendedKeyUsageOID.CLIENT_AUTH
    else:
        try:
            ext = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName)
            sans = [n for n in ext.value if str(n.value) not in drop]
        except x509.ExtensionNotFound:
            sans = [x509.DNSName(cn)]
        usage = ExtendedKeyUsageOID.SERVER_AUTH
    key = public_key or csr.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey)
    start = dt.datetime.now(dt.UTC) - backdate - dt.timedelta(seconds=1)
    cert = (
        x509.CertificateBuilder()
        .subject_name(csr.subject)
        .issuer_name(ca_cert.subject)
        .public_key(key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + lifetime)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key), critical=False)
        # OpenSSL's strict verification (our TLS contexts use it) refuses a leaf without one.
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert_pem(cert)
