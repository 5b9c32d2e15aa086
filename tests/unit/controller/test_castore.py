"""The CA Secret and the CA bundle (controller/castore.py): what is read, what is written."""

from __future__ import annotations

import pytest
from cryptography import x509

from ravenproxy.controller.castore import bundle_with, ca_from_secret, secret_for
from ravenproxy.errors import PKIError
from ravenproxy.pki import authority, pemfiles

CA = authority.generate_ca()
OTHER = authority.generate_ca("next-ca")


def pem(cert: x509.Certificate) -> str:
    return pemfiles.cert_pem(cert).decode()


def test_the_secret_round_trips() -> None:
    secret = secret_for(*CA)
    assert secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"]["name"] == "ravenproxy-ca"
    cert, key = ca_from_secret(secret)
    assert cert == CA[0]
    assert key.private_numbers() == CA[1].private_numbers()


def test_a_secret_whose_key_is_not_the_certificates_is_refused() -> None:
    secret = secret_for(CA[0], OTHER[1])
    with pytest.raises(PKIError, match=r"tls\.key does not match tls\.crt"):
        ca_from_secret(secret)
    with pytest.raises(PKIError, match=r"no tls\.key"):
        ca_from_secret({"data": {"tls.crt": secret["data"]["tls.crt"]}})


def test_the_bundle_is_written_only_when_it_lacks_our_ca() -> None:
    assert bundle_with(None, CA[0]) == pem(CA[0])
    assert bundle_with("", CA[0]) == pem(CA[0])
    assert bundle_with(pem(CA[0]), CA[0]) is None
    # During a rotation an operator keeps several CAs in it: ours is there, nothing to do.
    assert bundle_with(pem(OTHER[0]) + pem(CA[0]), CA[0]) is None


def test_other_cas_in_the_bundle_are_kept() -> None:
    assert bundle_with(pem(OTHER[0]), CA[0]) == pem(OTHER[0]) + pem(CA[0])
    assert bundle_with("not a certificate", CA[0]) == pem(CA[0])
