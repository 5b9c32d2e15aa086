"""The requester's pure side: the CSR it sends (pki.csr), when it rotates and what it accepts
back (pki.issued, with ssl alone)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from ravenproxy.errors import PKIError
from ravenproxy.pki import csrprocess
from ravenproxy.pki.authority import generate_ca, issue_client_cert
from ravenproxy.pki.csr import build_csr, new_key, new_request
from ravenproxy.pki.issuance import USAGES, Role
from ravenproxy.pki.issued import check_issued, missing_sans, rotation_deadline, trust_problem
from ravenproxy.pki.pemfiles import cert_pem, key_pem
from tests.csrsign import sign_csr

CA = generate_ca()


def test_agent_csr_is_cn_node_only_with_no_san_signed_by_the_key() -> None:
    key = new_key()
    csr = x509.load_pem_x509_csr(build_csr(key, "edge-1"))
    assert csr.is_signature_valid
    assert csr.subject == x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edge-1")])
    assert not csr.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    assert csr.public_key().public_numbers() == key.public_key().public_numbers()  # type: ignore[union-attr]
    with pytest.raises(x509.ExtensionNotFound):
        csr.extensions.get_extension_for_class(x509.SubjectAlternativeName)


def test_server_csr_carries_names_and_ips_once_each() -> None:
    csr = x509.load_pem_x509_csr(
        build_csr(new_key(), "cloud-1", ["cloud-1", "10.0.0.1", "Svc.Example", "cloud-1"])
    )
    san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["cloud-1", "svc.example"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.1")]


def test_bad_node_name_or_san_is_refused() -> None:
    with pytest.raises(PKIError, match="node name"):
        build_csr(new_key(), "Edge_1")
    with pytest.raises(PKIError, match="SAN"):
        build_csr(new_key(), "cloud-1", ["not a name"])
    with pytest.raises(PKIError, match="sequence"):
        build_csr(new_key(), "cloud-1", "cloud-1")


def test_usages_per_role() -> None:
    assert USAGES["agent"] == ("digital signature", "client auth")
    assert USAGES["server"] == ("digital signature", "server auth")


def test_rotation_deadline_is_70_to_90_percent_of_the_lifetime() -> None:
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    end = start + dt.timedelta(seconds=1000)
    assert rotation_deadline(start, end, lambda: 0.0) == start + dt.timedelta(seconds=700)
    assert rotation_deadline(start, end, lambda: 0.5) == start + dt.timedelta(seconds=800)
    almost = rotation_deadline(start, end, lambda: 0.999999)
    assert start + dt.timedelta(seconds=899) < almost < start + dt.timedelta(seconds=900)
    for _ in range(200):  # the real random source stays inside the bounds
        at = rotation_deadline(start, end)
        assert start + dt.timedelta(seconds=700) <= at < start + dt.timedelta(seconds=900)


def test_issued_certificate_for_our_key_and_node_is_accepted() -> None:
    key = new_key()
    pem = sign_csr(*CA, build_csr(key, "edge-1"), "agent")
    (cert,) = check_issued(pem, key_pem(key), "edge-1", "agent")
    assert cert.subject == "CN=edge-1" and cert.common_names == ("edge-1",)
    server_key = new_key()
    pem = sign_csr(*CA, build_csr(server_key, "cloud-1", ["10.0.0.1"]), "server")
    check_issued(pem, key_pem(server_key), "cloud-1", "server")


def test_certificate_for_another_key_is_refused() -> None:
    key = new_key()
    other = new_key().public_key()
    pem = sign_csr(*CA, build_csr(key, "edge-1"), "agent", public_key=other)
    with pytest.raises(PKIError, match="another key"):
        check_issued(pem, key_pem(key), "edge-1", "agent")


def test_certificate_for_another_node_or_role_is_refused() -> None:
    key = new_key()
    pem = sign_csr(*CA, build_csr(key, "edge-2"), "agent")
    with pytest.raises(PKIError, match="is not CN=edge-1"):
        check_issued(pem, key_pem(key), "edge-1", "agent")
    server_pem = sign_csr(*CA, build_csr(key, "edge-1"), "server")
    with pytest.raises(PKIError, match="clientAuth"):
        check_issued(server_pem, key_pem(key), "edge-1", "agent")
    agent_pem = sign_csr(*CA, build_csr(key, "edge-1"), "agent")
    with pytest.raises(PKIError, match="serverAuth"):
        check_issued(agent_pem, key_pem(key), "edge-1", "server")


@pytest.mark.parametrize("role", ["agent", "server"])
def test_trust_problem_is_what_a_peer_trusting_the_bundle_would_refuse(role: Role) -> None:
    """A certificate from a CA in the bundle is trusted (alone or among others); one from a CA
    the bundle no longer holds, or one expired, is not, and the reason is OpenSSL's."""
    key = new_key()
    sans = ["10.0.0.1"] if role == "server" else []
    pem = sign_csr(*CA, build_csr(key, "cloud-1" if role == "server" else "edge-1", sans), role)
    other_ca, _ = generate_ca("next-ca")
    assert trust_problem(pem, key_pem(key), cert_pem(CA[0]), role) == ""
    both = cert_pem(other_ca) + cert_pem(CA[0])
    assert trust_problem(pem, key_pem(key), both, role) == ""
    problem = trust_problem(pem, key_pem(key), cert_pem(other_ca), role)
    assert "unable to get local issuer certificate" in problem
    expired = sign_csr(
        *CA,
        build_csr(key, "edge-1"),
        "agent",
        dt.timedelta(minutes=1),
        backdate=dt.timedelta(minutes=2),
    )
    assert "expired" in trust_problem(expired, key_pem(key), cert_pem(CA[0]), "agent")
    assert "not usable" in trust_problem(pem, key_pem(key), b"garbage", role)


def test_not_a_certificate_is_refused() -> None:
    with pytest.raises(PKIError, match=r"not PEM|no certificate"):
        check_issued(b"garbage", key_pem(new_key()), "edge-1", "agent")
    # The embedded PKI's certificate for the node, but its own key: not ours.
    cert, _ = issue_client_cert(*CA, "edge-1")
    with pytest.raises(PKIError, match="another key"):
        check_issued(cert_pem(cert), key_pem(new_key()), "edge-1", "agent")


def test_new_request_is_a_key_and_its_csr() -> None:
    request = new_request("cloud-1", ["10.0.0.1"])
    csr = x509.load_pem_x509_csr(request.csr_pem)
    assert csr.subject.rfc4514_string() == "CN=cloud-1"
    pem = sign_csr(*CA, request.csr_pem, "server")
    (cert,) = check_issued(pem, request.key_pem, "cloud-1", "server")
    assert cert.ip_addresses == (ipaddress.ip_address("10.0.0.1"),)
    assert b"PRIVATE KEY" in request.key_pem


def test_missing_sans_compares_names_caselessly_and_addresses_by_value() -> None:
    key = new_key()
    sans = ["cloud-1", "Svc.Example", "10.0.0.1", "2001:db8::1"]
    pem = sign_csr(*CA, build_csr(key, "cloud-1", sans), "server")
    (cert,) = check_issued(pem, key_pem(key), "cloud-1", "server")
    assert missing_sans(cert, ["SVC.example", "10.0.0.1", "2001:DB8:0::1", "cloud-1"]) == []
    wanted = ["cloud-1", "new.example", "10.0.0.2", "2001:db8::2"]
    assert missing_sans(cert, wanted) == ["new.example", "10.0.0.2", "2001:db8::2"]
    with pytest.raises(PKIError, match="SAN"):
        missing_sans(cert, ["not a name"])


async def test_new_request_in_a_child_process_is_a_key_and_its_csr() -> None:
    """The agent's and server's requester makes its key and CSR in a child (cryptography never
    resident in them): what comes back is a key and the CSR for it, issued and accepted."""
    request = await csrprocess.new_request("cloud-1", ["10.0.0.1", "cloud-1.example"])
    csr = x509.load_pem_x509_csr(request.csr_pem)
    assert csr.subject.rfc4514_string() == "CN=cloud-1" and csr.is_signature_valid
    pem = sign_csr(*CA, request.csr_pem, "server")
    (cert,) = check_issued(pem, request.key_pem, "cloud-1", "server")
    assert missing_sans(cert, ["10.0.0.1", "cloud-1.example"]) == []


async def test_child_process_refuses_a_bad_san_naming_it() -> None:
    with pytest.raises(PKIError, match="invalid server SAN 'not a name'"):
        await csrprocess.new_request("cloud-1", ["not a name"])
    with pytest.raises(PKIError, match="node name"):
        await csrprocess.new_request("Edge_1")


async def test_child_process_ignores_modules_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m`` puts the working directory first on the path: a ``cryptography`` (or
    another ``ravenproxy``) lying there must not be what makes the key."""
    for name in ("cryptography", "ravenproxy"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(
            f"import sys\nsys.exit('{name} imported from the working directory')\n"
        )
    monkeypatch.chdir(tmp_path)
    request = await csrprocess.new_request("cloud-1")
    assert x509.load_pem_x509_csr(request.csr_pem).subject.rfc4514_string() == "CN=cloud-1"


async def test_a_crashing_child_is_one_line_naming_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child crashes (here: a broken ``cryptography`` on its path): the error is one line
    with the exit status and the exception, not the child's traceback."""
    broken = tmp_path / "site" / "cryptography"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('cryptography is broken here')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    with pytest.raises(PKIError) as caught:
        await csrprocess.new_request("cloud-1")
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message, message
    assert message == (
        "key generator failed (exit status 1): ImportError: cryptography is broken here"
    ), message
