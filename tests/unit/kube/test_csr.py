"""What a CSR's status says to the requester (kube/csr.py ``outcome``)."""

from __future__ import annotations

import base64

from ravenproxy.kube.csr import outcome


def test_pending_until_a_certificate_or_a_final_condition() -> None:
    assert outcome({}) is None
    assert outcome({"status": {}}) is None
    approved = {"type": "Approved", "status": "True", "reason": "AutoApproved"}
    assert outcome({"status": {"conditions": [approved]}}) is None


def test_certificate_is_decoded() -> None:
    pem = b"-----BEGIN CERTIFICATE-----\n"
    status = {"certificate": base64.b64encode(pem).decode()}
    assert outcome({"status": status}) == pem


def test_denied_and_failed_carry_the_message_else_the_reason() -> None:
    denied = {"type": "Denied", "status": "True", "reason": "NodeMismatch", "message": "bound to x"}
    assert outcome({"status": {"conditions": [denied]}}) == ("denied", "bound to x")
    failed = {"type": "Failed", "status": "True", "reason": "SignerError"}
    assert outcome({"status": {"conditions": [failed]}}) == ("failed", "SignerError")


def test_a_denial_wins_over_a_certificate() -> None:
    denied = {"type": "Denied", "status": "True", "reason": "No"}
    status = {"conditions": [denied], "certificate": base64.b64encode(b"x").decode()}
    assert outcome({"status": status}) == ("denied", "No")


def test_certificate_that_is_not_base64_is_a_failure() -> None:
    assert outcome({"status": {"certificate": "%%%"}}) == (
        "failed",
        "status.certificate is not base64",
    )
