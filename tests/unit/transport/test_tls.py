"""The TLS contexts, exercised with real handshakes on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import re
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from ravenproxy.errors import PKIError
from ravenproxy.pki import (
    init_pki,
    issue_client_cert,
    load_cert,
    load_key,
    write_pem_cert,
    write_pem_key,
)
from ravenproxy.transport.tls import (
    client_context,
    https_server_context,
    origin_client_context,
    peer_node_name,
    server_context,
)

HOST = "127.0.0.1"
TIMEOUT = 10.0


@dataclass(frozen=True)
class Pki:
    dir: Path
    other: Path  # a second, unrelated CA with its own server and edge-1 certificates

    def f(self, name: str) -> str:
        return str(self.dir / name)

    def o(self, name: str) -> str:
        return str(self.other / name)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    main = tmp_path_factory.mktemp("pki")
    init_pki(main, agents=["edge-1"])
    other = tmp_path_factory.mktemp("other")
    init_pki(other, agents=["edge-1"])

    ca_cert, ca_key = load_cert(main / "ca.crt"), load_key(main / "ca.key")
    past = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    cert, key = issue_client_cert(
        ca_cert, ca_key, "edge-old", not_before=past - dt.timedelta(days=30), not_after=past
    )
    write_pem_cert(main / "edge-old.crt", cert)
    write_pem_key(main / "edge-old.key", key)
    return Pki(main, other)


@dataclass
class Server:
    port: int
    identities: list[str] = field(default_factory=list)
    handler_errors: list[PKIError] = field(default_factory=list)
    handshake_errors: list[OSError] = field(default_factory=list)


@contextlib.asynccontextmanager
async def tls_server(ctx: ssl.SSLContext, mode: str = "listen") -> AsyncIterator[Server]:
    """A loopback server that names its peer (or records why it could not), then says hello.

    ``listen`` hands the context to ``start_server`` as a server would; ``starttls`` runs the
    handshake inside the handler, because only there does the server's own reason for refusing
    a client surface (asyncio otherwise drops failed handshakes silently).
    """
    state = Server(port=0)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if mode == "starttls":
                try:
                    await writer.start_tls(ctx)
                except (ssl.SSLError, OSError) as exc:
                    state.handshake_errors.append(exc)
                    return
            try:
                name = peer_node_name(writer.get_extra_info("ssl_object"))
            except PKIError as exc:
                state.handler_errors.append(exc)
                name = "-"
            else:
                state.identities.append(name)
            writer.write(f"hello {name}\n".encode())
            await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(ssl.SSLError, OSError):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, HOST, 0, ssl=ctx if mode == "listen" else None)
    try:
        state.port = server.sockets[0].getsockname()[1]
        yield state
    finally:
        server.close()
        await server.wait_closed()


async def talk(
    port: int, ctx: ssl.SSLContext, server_hostname: str = "localhost"
) -> bytes | BaseException:
    """The server's greeting, or the exception the handshake or first read ended in."""
    try:
        async with asyncio.timeout(TIMEOUT):
            reader, writer = await asyncio.open_connection(
                HOST, port, ssl=ctx, server_hostname=server_hostname
            )
    except (ssl.SSLError, OSError) as exc:
        return exc
    try:
        async with asyncio.timeout(TIMEOUT):
            return await reader.readline()
    except (ssl.SSLError, OSError) as exc:
        return exc
    finally:
        writer.close()
        with contextlib.suppress(ssl.SSLError, OSError):
            await writer.wait_closed()


async def assert_refused(
    srv: ssl.SSLContext, cli: ssl.SSLContext, mode: str, server_reason: str
) -> None:
    """The client gets no greeting, the server names nobody, and (starttls) says why."""
    async with tls_server(srv, mode) as server:
        result = await talk(server.port, cli)
    # TLS 1.3: the client's handshake completes before the server has judged the client
    # certificate, so the refusal shows on the first read: an alert, a reset or plain EOF.
    assert result == b"" or isinstance(result, ssl.SSLError | ConnectionError), result
    assert server.identities == []
    assert server.handler_errors == []
    if mode == "starttls":
        assert len(server.handshake_errors) == 1
        assert server_reason in str(server.handshake_errors[0]), server.handshake_errors


MODES = pytest.mark.parametrize("mode", ["listen", "starttls"])


# --- mutual TLS: the tunnel ------------------------------------------------------------------


def _srv(pki: Pki) -> ssl.SSLContext:
    return server_context(pki.f("ca.crt"), pki.f("server.crt"), pki.f("server.key"))


@MODES
async def test_agent_with_good_cert_is_identified_by_node_name(pki: Pki, mode: str) -> None:
    cli = client_context(pki.f("ca.crt"), pki.f("edge-1.crt"), pki.f("edge-1.key"))
    async with tls_server(_srv(pki), mode) as server:
        assert await talk(server.port, cli) == b"hello edge-1\n"
        assert await talk(server.port, cli, server_hostname="127.0.0.1") == b"hello edge-1\n"
    assert server.identities == ["edge-1", "edge-1"]
    assert server.handler_errors == [] and server.handshake_errors == []


@MODES
async def test_client_without_certificate_is_refused(pki: Pki, mode: str) -> None:
    bare = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    bare.load_verify_locations(pki.f("ca.crt"))
    await assert_refused(_srv(pki), bare, mode, "PEER_DID_NOT_RETURN_A_CERTIFICATE")


@MODES
async def test_client_cert_from_another_ca_is_refused(pki: Pki, mode: str) -> None:
    # Trusts our server, but presents an edge-1 certificate signed by the other CA.
    cli = client_context(pki.f("ca.crt"), pki.o("edge-1.crt"), pki.o("edge-1.key"))
    await assert_refused(_srv(pki), cli, mode, "unable to get local issuer certificate")


@MODES
async def test_expired_client_cert_is_refused(pki: Pki, mode: str) -> None:
    cli = client_context(pki.f("ca.crt"), pki.f("edge-old.crt"), pki.f("edge-old.key"))
    await assert_refused(_srv(pki), cli, mode, "certificate has expired")


@MODES
async def test_server_cert_cannot_pass_as_an_agent(pki: Pki, mode: str) -> None:
    cli = client_context(pki.f("ca.crt"), pki.f("server.crt"), pki.f("server.key"))
    await assert_refused(_srv(pki), cli, mode, "unsuitable certificate purpose")


@MODES
async def test_tunnel_refuses_tls_1_2(pki: Pki, mode: str) -> None:
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    old.load_verify_locations(pki.f("ca.crt"))
    old.load_cert_chain(pki.f("edge-1.crt"), pki.f("edge-1.key"))
    await assert_refused(_srv(pki), old, mode, "UNSUPPORTED_PROTOCOL")


async def test_server_cert_from_another_ca_is_refused_by_the_agent(pki: Pki) -> None:
    # The impostor would accept our agent; the agent must still refuse it.
    srv = server_context(pki.f("ca.crt"), pki.o("server.crt"), pki.o("server.key"))
    cli = client_context(pki.f("ca.crt"), pki.f("edge-1.crt"), pki.f("edge-1.key"))
    async with tls_server(srv) as server:
        result = await talk(server.port, cli)
    assert isinstance(result, ssl.SSLCertVerificationError), result
    assert "unable to get local issuer certificate" in str(result)
    assert server.identities == []


async def test_server_hostname_is_checked_unless_disabled(pki: Pki) -> None:
    srv = server_context(pki.f("ca.crt"), pki.f("server.crt"), pki.f("server.key"))
    files = pki.f("ca.crt"), pki.f("edge-1.crt"), pki.f("edge-1.key")
    strict = client_context(*files)
    lax = client_context(*files, server_hostname_check=False)
    async with tls_server(srv) as server:
        result = await talk(server.port, strict, server_hostname="proxy.elsewhere")
        assert isinstance(result, ssl.SSLCertVerificationError), result
        assert "Hostname mismatch" in str(result)
        assert await talk(server.port, lax, server_hostname="proxy.elsewhere") == b"hello edge-1\n"
    assert server.identities == ["edge-1"]


def test_contexts_are_tls13_with_client_certs_required(pki: Pki) -> None:
    srv = server_context(pki.f("ca.crt"), pki.f("server.crt"), pki.f("server.key"))
    cli = client_context(pki.f("ca.crt"), pki.f("edge-1.crt"), pki.f("edge-1.key"))
    assert srv.minimum_version == cli.minimum_version == ssl.TLSVersion.TLSv1_3
    assert srv.verify_mode == cli.verify_mode == ssl.CERT_REQUIRED
    assert cli.check_hostname


# --- the HTTPS front and the kubelet side ------------------------------------------------------


async def test_https_front_needs_no_client_cert_and_peer_node_name_refuses(pki: Pki) -> None:
    srv = https_server_context(pki.f("server.crt"), pki.f("server.key"))
    assert srv.minimum_version == ssl.TLSVersion.TLSv1_2
    cli = origin_client_context(pki.f("ca.crt"), None, None)
    async with tls_server(srv) as server:
        assert await talk(server.port, cli) == b"hello -\n"
    assert server.identities == []
    assert len(server.handler_errors) == 1
    assert "no certificate" in str(server.handler_errors[0])


async def test_origin_context_speaks_tls_1_2(pki: Pki) -> None:
    srv = https_server_context(pki.f("server.crt"), pki.f("server.key"))
    srv.maximum_version = ssl.TLSVersion.TLSv1_2  # an older kubelet
    cli = origin_client_context(pki.f("ca.crt"), pki.f("edge-1.crt"), pki.f("edge-1.key"))
    async with tls_server(srv) as server:
        assert await talk(server.port, cli) == b"hello -\n"


async def test_origin_context_verifies_unless_told_not_to(pki: Pki) -> None:
    srv = https_server_context(pki.o("server.crt"), pki.o("server.key"))
    checked = origin_client_context(pki.f("ca.crt"), None, None)
    system = origin_client_context(None, None, None)
    unchecked = origin_client_context(None, None, None, verify=False)
    assert unchecked.verify_mode == ssl.CERT_NONE and not unchecked.check_hostname
    async with tls_server(srv) as server:
        assert isinstance(await talk(server.port, checked), ssl.SSLCertVerificationError)
        assert isinstance(await talk(server.port, system), ssl.SSLCertVerificationError)
        assert await talk(server.port, unchecked, server_hostname="anything") == b"hello -\n"


# --- errors name the flag and the file ---------------------------------------------------------


def test_missing_files_name_the_flag(pki: Pki, tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.pem")
    good = pki.f("ca.crt"), pki.f("server.crt"), pki.f("server.key")
    for i, flag in enumerate(("ca-file", "cert-file", "key-file")):
        args = list(good)
        args[i] = missing
        with pytest.raises(PKIError, match=rf"^{flag} {re.escape(missing)}: No such file$"):
            server_context(*args)
        with pytest.raises(PKIError, match=rf"^{flag} {re.escape(missing)}: No such file$"):
            client_context(*args)
    with pytest.raises(PKIError, match=rf"^cert-file {re.escape(missing)}"):
        https_server_context(missing, pki.f("server.key"))
    with pytest.raises(PKIError, match=rf"^ca-file {re.escape(missing)}"):
        origin_client_context(missing, None, None)


def test_garbled_files_name_the_flag(pki: Pki, tmp_path: Path) -> None:
    garbled = tmp_path / "garbled.pem"
    garbled.write_text("-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")
    g = re.escape(str(garbled))
    with pytest.raises(PKIError, match=rf"^ca-file {g}: not a PEM certificate"):
        server_context(garbled, pki.f("server.crt"), pki.f("server.key"))
    with pytest.raises(PKIError, match=rf"^cert-file {g}: not a PEM certificate"):
        client_context(pki.f("ca.crt"), garbled, pki.f("edge-1.key"))
    with pytest.raises(PKIError, match=rf"^key-file {g}: no usable PEM private key"):
        client_context(pki.f("ca.crt"), pki.f("edge-1.crt"), garbled)


def test_mismatched_key_names_both_files(pki: Pki) -> None:
    with pytest.raises(PKIError, match=r"cert-file .*edge-1\.crt / key-file .*server\.key"):
        client_context(pki.f("ca.crt"), pki.f("edge-1.crt"), pki.f("server.key"))


def test_encrypted_key_is_refused_without_prompting(pki: Pki, tmp_path: Path) -> None:
    enc = tmp_path / "enc.key"
    enc.write_bytes(
        load_key(pki.f("edge-1.key")).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    with pytest.raises(PKIError, match=rf"^key-file {re.escape(str(enc))}: key is encrypted"):
        client_context(pki.f("ca.crt"), pki.f("edge-1.crt"), enc)


def test_origin_key_without_cert_is_refused(pki: Pki) -> None:
    with pytest.raises(PKIError, match=r"key-file .* without a cert-file"):
        origin_client_context(None, None, pki.f("edge-1.key"))


def test_origin_cert_file_may_hold_the_key(pki: Pki, tmp_path: Path) -> None:
    combined = tmp_path / "both.pem"
    combined.write_bytes(
        Path(pki.f("edge-1.crt")).read_bytes() + Path(pki.f("edge-1.key")).read_bytes()
    )
    origin_client_context(pki.f("ca.crt"), combined, None)
    with pytest.raises(PKIError, match=rf"^cert-file {re.escape(pki.f('edge-1.crt'))}: no usable"):
        origin_client_context(pki.f("ca.crt"), pki.f("edge-1.crt"), None)


def test_peer_node_name_before_handshake_is_a_pki_error() -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    obj = ctx.wrap_bio(ssl.MemoryBIO(), ssl.MemoryBIO(), server_hostname="x")
    with pytest.raises(PKIError):
        peer_node_name(obj)


def test_another_ca_is_really_another(pki: Pki) -> None:
    # Guard for the refusal tests above: they mean nothing if both CAs were the same.
    assert load_cert(pki.f("ca.crt")) != load_cert(pki.o("ca.crt"))
