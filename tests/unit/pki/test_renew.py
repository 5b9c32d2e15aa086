from __future__ import annotations

import datetime as dt
import re
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ravenproxy.errors import PKIError
from ravenproxy.pki import (
    generate_ca,
    init_pki,
    load_cert,
    load_certs,
    load_key,
    write_pem_key,
)
from ravenproxy.pki.authority import extend_ca
from ravenproxy.pki.pemfiles import write_pem_certs
from ravenproxy.pki.renew import plan_renewal, renew
from ravenproxy.pki.status import sans_of, status
from tests.unit.pki.pkidir import days, reissue, serial, short_ca, snapshot

SPKI = Encoding.PEM, PublicFormat.SubjectPublicKeyInfo


def _eku(cert: x509.Certificate) -> list[x509.ObjectIdentifier]:
    return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def test_only_due_leaves_are_renewed_with_new_keys_and_the_same_names(tmp_path: Path) -> None:
    init_pki(tmp_path, ["proxy.example", "10.0.0.5", "::1"], ["edge-1", "edge-2"])
    reissue(tmp_path, "server", not_after=days(20))
    reissue(tmp_path, "edge-1", not_before=days(-10), not_after=days(-2))  # expired
    before = snapshot(tmp_path)
    old = {n: load_cert(tmp_path / f"{n}.crt") for n in ("server", "edge-1")}
    old_keys = {n: load_key(tmp_path / f"{n}.key") for n in ("server", "edge-1")}

    report = renew(tmp_path, within_days=30, days=90)

    assert sorted(r.cert_path.name for r in report.renewed) == ["edge-1.crt", "server.crt"]
    assert [k.path.name for k in report.kept] == ["edge-2.crt"]
    assert report.ca_extended is None and report.warnings == ()
    after = snapshot(tmp_path)
    for unchanged in ("ca.crt", "ca.key", "edge-2.crt", "edge-2.key"):
        assert after[unchanged] == before[unchanged], unchanged
    ca = load_cert(tmp_path / "ca.crt")
    for name in ("server", "edge-1"):
        new = load_cert(tmp_path / f"{name}.crt")
        key = load_key(tmp_path / f"{name}.key")
        assert new.serial_number != old[name].serial_number
        assert new.subject == old[name].subject
        assert sans_of(new) == sans_of(old[name])
        assert _eku(new) == _eku(old[name])
        new.verify_directly_issued_by(ca)
        assert key.public_key().public_bytes(*SPKI) == new.public_key().public_bytes(*SPKI)
        assert key.public_key().public_bytes(*SPKI) != (
            old_keys[name].public_key().public_bytes(*SPKI)
        )
        assert stat.S_IMODE((tmp_path / f"{name}.key").stat().st_mode) == 0o600
        lifetime = new.not_valid_after_utc - dt.datetime.now(dt.UTC)
        assert dt.timedelta(days=89) < lifetime <= dt.timedelta(days=90)
    assert sans_of(load_cert(tmp_path / "server.crt")) == ("proxy.example", "10.0.0.5", "::1")
    # No temp file is left behind, and a second run has nothing to do.
    assert sorted(after) == sorted(before)
    again = renew(tmp_path, within_days=30, days=90)
    assert again.renewed == () and len(again.kept) == 3
    assert snapshot(tmp_path) == after
    assert status(tmp_path).exit_code == 0


def test_force_renews_every_leaf_but_keeps_a_ca_that_is_not_due(tmp_path: Path) -> None:
    init_pki(tmp_path, agents=["edge-1"])
    ca_before = (tmp_path / "ca.crt").read_bytes()
    serials = {n: serial(tmp_path / f"{n}.crt") for n in ("server", "edge-1")}
    report = renew(tmp_path, force=True)
    assert len(report.renewed) == 2 and report.kept == ()
    assert report.ca_extended is None
    assert (tmp_path / "ca.crt").read_bytes() == ca_before
    for n, s in serials.items():
        assert serial(tmp_path / f"{n}.crt") != s
    # A large window renews all as well.
    assert len(renew(tmp_path, within_days=10_000).renewed) == 2


def test_a_due_ca_is_extended_with_its_own_key_and_old_leaves_still_verify(
    tmp_path: Path,
) -> None:
    old_ca, ca_key = short_ca(tmp_path, days(20))
    old_server = load_cert(tmp_path / "server.crt")

    report = renew(tmp_path, within_days=30)

    assert report.ca_extended is not None
    was, now_ends = report.ca_extended
    assert was == old_ca.not_valid_after_utc
    new_ca = load_cert(tmp_path / "ca.crt")
    assert now_ends == new_ca.not_valid_after_utc > days(3600)
    assert new_ca.subject == old_ca.subject
    assert new_ca.serial_number != old_ca.serial_number
    assert new_ca.public_key().public_bytes(*SPKI) == old_ca.public_key().public_bytes(*SPKI)
    ski = x509.SubjectKeyIdentifier
    assert (
        new_ca.extensions.get_extension_for_class(ski).value
        == old_ca.extensions.get_extension_for_class(ski).value
    )
    assert new_ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert load_key(tmp_path / "ca.key").private_numbers() == ca_key.private_numbers()
    # Both leaves were due with their CA; the new ones verify against the old CA and the new,
    # and an old leaf verifies against the new CA.
    assert len(report.renewed) == 2
    new_server = load_cert(tmp_path / "server.crt")
    new_server.verify_directly_issued_by(new_ca)
    new_server.verify_directly_issued_by(old_ca)
    old_server.verify_directly_issued_by(new_ca)
    assert new_server.not_valid_after_utc > days(364)
    assert not any(r.capped for r in report.renewed)


def test_leaves_never_outlive_the_ca(tmp_path: Path) -> None:
    ca_cert, _ = short_ca(tmp_path, days(100))
    reissue(tmp_path, "edge-1", not_after=days(5))
    report = renew(tmp_path, within_days=30, days=365)
    assert report.ca_extended is None
    (renewed,) = report.renewed
    assert renewed.cert_path.name == "edge-1.crt" and renewed.capped
    assert renewed.not_after == ca_cert.not_valid_after_utc
    assert load_cert(tmp_path / "edge-1.crt").not_valid_after_utc == ca_cert.not_valid_after_utc


def test_leaves_of_another_ca_are_left_alone_with_a_warning(tmp_path: Path) -> None:
    init_pki(tmp_path, agents=["edge-1"])
    reissue(tmp_path, "edge-1", not_after=days(2), ca=generate_ca("elsewhere"))
    before = (tmp_path / "edge-1.crt").read_bytes()
    report = renew(tmp_path, force=True)
    assert [r.cert_path.name for r in report.renewed] == ["server.crt"]
    assert report.warnings == ("edge-1.crt: not issued by a CA in ca.crt; left alone",)
    assert (tmp_path / "edge-1.crt").read_bytes() == before


def test_ca_rotation_reissues_leaves_from_the_ca_whose_key_is_in_ca_key(tmp_path: Path) -> None:
    """docs/certificates.md "Rotating the CA": ca.crt holds new + old, ca.key is the new CA's
    key; renew --force moves every leaf to the new CA, and both CAs stay in ca.crt."""
    init_pki(tmp_path, agents=["edge-1"])
    old_ca = load_cert(tmp_path / "ca.crt")
    new_dir = tmp_path / "new"
    init_pki(new_dir)
    new_ca = load_cert(new_dir / "ca.crt")
    write_pem_certs(tmp_path / "ca.crt", [new_ca, old_ca])
    (tmp_path / "ca.key").write_bytes((new_dir / "ca.key").read_bytes())

    report = renew(tmp_path, force=True)
    assert len(report.renewed) == 2 and report.ca_extended is None
    for name in ("server.crt", "edge-1.crt"):
        load_cert(tmp_path / name).verify_directly_issued_by(new_ca)
    assert [c.serial_number for c in load_certs(tmp_path / "ca.crt")] == [
        new_ca.serial_number,
        old_ca.serial_number,
    ]


def test_an_extended_ca_keeps_its_place_in_a_bundle(tmp_path: Path) -> None:
    ca_cert, _ = short_ca(tmp_path, days(10))
    other, _ = generate_ca("ravenproxy-ca-old")
    write_pem_certs(tmp_path / "ca.crt", [other, ca_cert])
    renew(tmp_path)
    bundle = load_certs(tmp_path / "ca.crt")
    assert bundle[0].serial_number == other.serial_number
    assert bundle[1].subject == ca_cert.subject
    assert bundle[1].not_valid_after_utc > days(3600)


def test_without_the_ca_key_renew_refuses(tmp_path: Path) -> None:
    init_pki(tmp_path)
    (tmp_path / "ca.key").unlink()
    with pytest.raises(PKIError, match=r"ca\.key: No such file; renew signs with the CA's key"):
        renew(tmp_path, force=True)


def test_nothing_is_written_when_a_file_cannot_be_read(tmp_path: Path) -> None:
    init_pki(tmp_path, agents=["edge-1", "edge-2"])
    reissue(tmp_path, "server", not_after=days(1))
    (tmp_path / "edge-2.crt").write_bytes(b"garbage")
    before = snapshot(tmp_path)
    with pytest.raises(PKIError, match=re.escape(str(tmp_path / "edge-2.crt"))):
        renew(tmp_path)
    assert snapshot(tmp_path) == before


def test_a_ca_key_of_another_ca_is_refused(tmp_path: Path) -> None:
    init_pki(tmp_path)
    _, other_key = generate_ca()
    write_pem_key(tmp_path / "ca.key", other_key)
    with pytest.raises(PKIError, match="does not belong to any CA certificate"):
        renew(tmp_path, force=True)


@pytest.mark.parametrize(
    ("within", "days_", "message"),
    [(-1, 365, "--within must be 0 or more"), (30, 0, "--days must be more than 0")],
)
def test_bad_numbers_are_refused_naming_the_flag(
    tmp_path: Path, within: float, days_: float, message: str
) -> None:
    init_pki(tmp_path)
    with pytest.raises(PKIError, match=message):
        plan_renewal(tmp_path, within_days=within, days=days_)


def test_extend_ca_refuses_a_key_of_another_ca() -> None:
    ca_cert, _ = generate_ca()
    _, other_key = generate_ca()
    with pytest.raises(PKIError, match="CA key does not match"):
        extend_ca(ca_cert, other_key)
