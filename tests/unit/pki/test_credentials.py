"""The credentials core on bytes: a consistent set, and every way a set is refused (and named)."""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID

from ravenproxy.pki.authority import generate_ca, issue_client_cert, issue_server_cert
from ravenproxy.pki.credentials import (
    CredentialsError,
    PemSource,
    ReloadTracker,
    Verdict,
    content_digest,
    load_credentials,
    parse_credentials,
)
from ravenproxy.pki.pemfiles import cert_pem, key_pem


def now() -> dt.datetime:
    """The time of the check, taken when the test runs: a module-level constant taken at
    collection was minutes stale by the time a long suite reached these tests, older than the
    certificates they issue."""
    return dt.datetime.now(dt.UTC)


Issued = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]


def der(cert: x509.Certificate) -> bytes:
    """The credentials hold what ssl reads of a certificate; compared by DER."""
    return cert.public_bytes(Encoding.DER)


@pytest.fixture(scope="module")
def ca() -> Issued:
    return generate_ca("ca-one")


@pytest.fixture(scope="module")
def other_ca() -> Issued:
    return generate_ca("ca-two")


def sources(
    cas: list[x509.Certificate], cert: bytes, key: bytes
) -> tuple[PemSource, PemSource, PemSource]:
    return (
        PemSource("ca-file", "/c/ca.crt", b"".join(cert_pem(c) for c in cas)),
        PemSource("cert-file", "/c/tls.crt", cert),
        PemSource("key-file", "/c/tls.key", key),
    )


def test_a_consistent_set_says_what_it_holds(ca: Issued) -> None:
    cert, key = issue_client_cert(*ca, "edge-1")
    creds = load_credentials(*sources([ca[0]], cert_pem(cert), key_pem(key)), now=now())
    assert creds.leaf.der == der(cert)
    assert creds.serial == format(cert.serial_number, "x")
    assert creds.not_after == cert.not_valid_after_utc
    assert creds.leaf.not_before == cert.not_valid_before_utc
    assert creds.subject == "CN=edge-1"
    assert [c.der for c in creds.ca_certs] == [der(ca[0])]
    assert creds.issuer_ca is not None and creds.issuer_ca.der == der(ca[0])
    assert creds.ca_not_after == ca[0].not_valid_after_utc
    # The same set re-encoded (a trailing newline) has the same fingerprint; another cert not.
    again = load_credentials(*sources([ca[0]], cert_pem(cert) + b"\n", key_pem(key)), now=now())
    assert again.fingerprint == creds.fingerprint
    cert2, key2 = issue_client_cert(*ca, "edge-1")
    other = load_credentials(*sources([ca[0]], cert_pem(cert2), key_pem(key2)), now=now())
    assert other.fingerprint != creds.fingerprint
    assert other.leaf_fingerprint != creds.leaf_fingerprint


def test_a_key_that_does_not_match_the_certificate_is_refused(ca: Issued) -> None:
    cert, _ = issue_client_cert(*ca, "edge-1")
    _, other_key = issue_client_cert(*ca, "edge-1")
    with pytest.raises(CredentialsError) as err:
        parse_credentials(*sources([ca[0]], cert_pem(cert), key_pem(other_key)))
    assert err.value.field == "key-file"
    assert err.value.path == "/c/tls.key"
    assert "does not match the certificate in cert-file /c/tls.crt" in str(err.value)


def test_a_certificate_from_another_ca_is_refused_on_reload_only(
    ca: Issued, other_ca: Issued
) -> None:
    cert, key = issue_client_cert(*other_ca, "edge-1")
    srcs = sources([ca[0]], cert_pem(cert), key_pem(key))
    creds = parse_credentials(*srcs)  # usable (a start-up warns and goes on)
    problem = creds.trust_problem(now())
    assert problem is not None and problem.field == "cert-file"
    assert "does not verify against the CA bundle (CN=ca-one)" in problem.reason
    with pytest.raises(CredentialsError, match="does not verify against the CA bundle"):
        load_credentials(*srcs, now=now())


def test_a_bundle_with_two_cas_trusts_a_certificate_of_either(ca: Issued, other_ca: Issued) -> None:
    bundle = [ca[0], other_ca[0]]
    for issuer in (ca, other_ca):
        cert, key = issue_server_cert(*issuer, ["localhost"])
        creds = load_credentials(*sources(bundle, cert_pem(cert), key_pem(key)), now=now())
        assert creds.issuer_ca is not None and creds.issuer_ca.der == der(issuer[0])
        assert creds.ca_not_after == issuer[0].not_valid_after_utc
        assert len(creds.ca_certs) == 2


@pytest.mark.parametrize("which", ["ca-file", "cert-file", "key-file"])
def test_a_half_written_file_is_refused_as_such(ca: Issued, which: str) -> None:
    cert, key = issue_client_cert(*ca, "edge-1")
    files = {"ca-file": cert_pem(ca[0]), "cert-file": cert_pem(cert), "key-file": key_pem(key)}
    files[which] = files[which][: len(files[which]) // 2]
    srcs = sources([], files["cert-file"], files["key-file"])
    srcs = (srcs[0]._replace(data=files["ca-file"]), srcs[1], srcs[2])
    with pytest.raises(CredentialsError) as err:
        parse_credentials(*srcs)
    assert err.value.field == which
    assert "incomplete PEM" in err.value.reason


def test_a_bundle_cut_inside_its_second_certificate_is_half_written(
    ca: Issued, other_ca: Issued
) -> None:
    # The first certificate alone would parse: the cut must still be seen.
    cert, key = issue_client_cert(*ca, "edge-1")
    bundle = cert_pem(ca[0]) + cert_pem(other_ca[0])[:100]
    _, cert_src, key_src = sources([], cert_pem(cert), key_pem(key))
    with pytest.raises(CredentialsError, match=r"ca-file /c/ca\.crt: incomplete PEM"):
        parse_credentials(PemSource("ca-file", "/c/ca.crt", bundle), cert_src, key_src)


@pytest.mark.parametrize(
    ("data", "reason"),
    [(b"", "empty file"), (b"\n  \n", "empty file"), (b"hello", "no PEM block")],
)
def test_empty_and_non_pem_files_are_refused(ca: Issued, data: bytes, reason: str) -> None:
    cert, _ = issue_client_cert(*ca, "edge-1")
    with pytest.raises(CredentialsError) as err:
        parse_credentials(*sources([ca[0]], cert_pem(cert), data))
    assert err.value.field == "key-file"
    assert reason in err.value.reason


def test_an_expired_certificate_is_refused_on_reload(ca: Issued) -> None:
    cert, key = issue_client_cert(
        *ca,
        "edge-1",
        not_before=now() - dt.timedelta(days=30),
        not_after=now() - dt.timedelta(days=1),
    )
    with pytest.raises(CredentialsError, match="certificate expired at"):
        load_credentials(*sources([ca[0]], cert_pem(cert), key_pem(key)), now=now())


def test_an_intermediate_in_the_certificate_file_completes_the_chain() -> None:
    # An intermediate CA, signed by the root, signs the leaf; the cert file carries both. The
    # root allows an intermediate (ours, generate_ca, does not: path length 0) and every
    # certificate carries the key identifiers a strict verifier (our TLS contexts) requires.
    root_key = ec.generate_private_key(ec.SECP256R1())
    root_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "root")])
    root = (
        x509.CertificateBuilder()
        .subject_name(root_name)
        .issuer_name(root_name)
        .public_key(root_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now() - dt.timedelta(minutes=1))
        .not_valid_after(now() + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=1), critical=True)
        .add_extension(_cert_sign, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(root_key.public_key()), False)
        .sign(root_key, hashes.SHA256())
    )
    mid_key = ec.generate_private_key(ec.SECP256R1())
    mid_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mid")])
    mid = (
        x509.CertificateBuilder()
        .subject_name(mid_name)
        .issuer_name(root.subject)
        .public_key(mid_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now() - dt.timedelta(minutes=1))
        .not_valid_after(now() + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_cert_sign, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(mid_key.public_key()), False)
        .add_extension(_aki(root_key.public_key()), critical=False)
        .sign(root_key, hashes.SHA256())
    )
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edge-1")]))
        .issuer_name(mid_name)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now() - dt.timedelta(minutes=1))
        .not_valid_after(now() + dt.timedelta(hours=1))
        .add_extension(_aki(mid_key.public_key()), critical=False)
        .sign(mid_key, hashes.SHA256())
    )
    alone = sources([root], cert_pem(leaf), key_pem(leaf_key))
    assert parse_credentials(*alone).trust_problem(now()) is not None
    chained = sources([root], cert_pem(leaf) + cert_pem(mid), key_pem(leaf_key))
    creds = load_credentials(*chained, now=now())
    assert creds.issuer_ca is not None and creds.issuer_ca.der == der(root)
    assert [c.der for c in creds.chain] == [der(leaf), der(mid)]
    assert [c.subject for c in creds.chain] == ["CN=edge-1", "CN=mid"]


_cert_sign = x509.KeyUsage(
    digital_signature=False,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)


def _aki(issuer_public: ec.EllipticCurvePublicKey) -> x509.AuthorityKeyIdentifier:
    return x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_public)


# -- the reload decision --------------------------------------------------------------------


def test_tracker_takes_a_new_consistent_set_once() -> None:
    t = ReloadTracker("a")
    assert t.observe("a", True) is Verdict.SAME
    assert t.observe("b", True) is Verdict.TAKE
    assert t.applied == "b"
    assert t.observe("b", True) is Verdict.SAME


def test_tracker_warns_once_per_inconsistent_content_after_a_second_look() -> None:
    t = ReloadTracker("a")
    assert t.observe("half", False) is Verdict.WAIT
    assert t.observe("half", False) is Verdict.WARN
    assert t.observe("half", False) is Verdict.SAME
    assert t.observe("other", False) is Verdict.WAIT
    assert t.observe("other", False) is Verdict.WARN
    assert t.observe("whole", True) is Verdict.TAKE
    # Back to a content warned about before the last take: said again (it is news again).
    assert t.observe("half", False) is Verdict.WAIT


def test_tracker_says_nothing_of_a_key_caught_before_its_certificate() -> None:
    t = ReloadTracker("old")
    assert t.observe("new-key-old-cert", False) is Verdict.WAIT
    assert t.observe("new-key-new-cert", True) is Verdict.TAKE


def test_tracker_is_silent_when_the_files_return_to_the_set_in_use() -> None:
    t = ReloadTracker("a")
    assert t.observe("half", False) is Verdict.WAIT
    assert t.observe("a", True) is Verdict.SAME
    assert t.observe("half", False) is Verdict.WAIT


def test_content_digest_tells_splits_apart() -> None:
    assert content_digest(b"ab", b"c") != content_digest(b"a", b"bc")
    assert content_digest(b"ab", b"c") == content_digest(b"ab", b"c")
