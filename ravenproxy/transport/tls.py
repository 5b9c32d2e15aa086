"""TLS contexts for every boundary, and the agent identity taken from a verified peer certificate.

- agent ⇄ server tunnel: mutual TLS 1.3 against the embedded CA (:func:`server_context`,
  :func:`client_context`); the agent's node name comes from its certificate
  (:func:`peer_node_name`).
- the HTTPS front that terminates kube-apiserver's TLS (:func:`https_server_context`) and the
  re-originated connection to a kubelet (:func:`origin_client_context`): TLS 1.2 and up, because
  those peers are not ours to upgrade.

Files are read and parsed before they reach :mod:`ssl`, whose errors (``[SSL] PEM lib``) do not
say which file is wrong; every error here names the flag and the file instead.

The ``*_for`` builders take an already checked :class:`~ravenproxy.pki.credentials.Credentials`
(the reload watcher's): the context gets exactly the bytes that were checked, never a file that
may have been replaced since (see :func:`_load_chain_bytes`).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from pathlib import Path

from ravenproxy.errors import PKIError
from ravenproxy.pki.credentials import Credentials
from ravenproxy.pki.identity import node_of
from ravenproxy.pki.x509info import (
    KeyPairError,
    load_certs,
    load_pair,
    peer_cert,
    private_file,
    read_file,
)

log = logging.getLogger(__name__)

PathLike = str | Path


HandshakeObserver = Callable[[ssl.SSLError], None]


def server_context(
    ca_file: PathLike,
    cert_file: PathLike,
    key_file: PathLike,
    *,
    on_handshake_error: HandshakeObserver | None = None,
) -> ssl.SSLContext:
    """The tunnel server's side: TLS 1.3 only, a client certificate from our CA required.

    ``on_handshake_error`` is called with the error of every refused handshake (no
    certificate, unknown CA, expired...): asyncio itself reports those only in debug mode, so
    without it a refused agent would leave no trace on the server.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    _load_chain(ctx, cert_file, key_file)
    _load_ca(ctx, ca_file)
    ctx.verify_mode = ssl.CERT_REQUIRED
    # Our own CA issues well-formed certificates; refusing malformed ones costs nothing.
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    if on_handshake_error is not None:
        ctx.sslobject_class = _observed_sslobject(on_handshake_error)
    return ctx


def _observed_sslobject(observer: HandshakeObserver) -> type[ssl.SSLObject]:
    """An SSLObject class whose failed handshakes are reported to ``observer``. Event loops
    (asyncio's and uvloop's) wrap connections with ``context.wrap_bio``, which builds this."""

    class ObservedSSLObject(ssl.SSLObject):
        def do_handshake(self) -> None:
            try:
                super().do_handshake()
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                raise  # not a failure: the handshake needs more bytes
            except ssl.SSLError as exc:
                try:
                    observer(exc)
                except Exception:  # an observer must never change the handshake's outcome
                    log.exception("TLS handshake observer failed")
                raise

    return ObservedSSLObject


def client_context(
    ca_file: PathLike,
    cert_file: PathLike,
    key_file: PathLike,
    *,
    server_hostname_check: bool = True,
) -> ssl.SSLContext:
    """The agent's side: TLS 1.3 only, the server verified against our CA, our cert presented.

    ``server_hostname_check=False`` still verifies the chain; it only skips matching the
    server's SANs against the dialled name (for a server reached through an address its
    certificate does not list, e.g. a NAT'd public IP).
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    _load_ca(ctx, ca_file)
    _load_chain(ctx, cert_file, key_file)
    ctx.check_hostname = server_hostname_check
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    return ctx


def https_server_context(
    cert_file: PathLike, key_file: PathLike, client_ca_file: PathLike | None = None
) -> ssl.SSLContext:
    """The terminating HTTPS front: TLS ≥ 1.2. With ``client_ca_file`` a client certificate is
    asked for and, when one is presented, verified against it (a bad one fails the handshake;
    none at all is an anonymous client); without, none is asked for."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(ctx, cert_file, key_file)
    if client_ca_file is not None:
        _load_ca(ctx, client_ca_file, "front-client-ca-file")
        ctx.verify_mode = ssl.CERT_OPTIONAL
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def origin_client_context(
    ca_file: PathLike | None,
    cert_file: PathLike | None,
    key_file: PathLike | None,
    verify: bool = True,
) -> ssl.SSLContext:
    """Re-originated TLS to a kubelet: TLS ≥ 1.2, optional client cert.

    ``ca_file=None`` with ``verify=True`` trusts the system store. ``verify=False`` turns off
    both hostname and chain checks — kubelets commonly serve self-signed certificates, and
    kube-apiserver itself talks to them that way unless told otherwise.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if verify:
        if ca_file is not None:
            _load_ca(ctx, ca_file)
        else:
            ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    else:
        # Order matters: ssl refuses CERT_NONE while check_hostname is still on.
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert_file is not None:
        _load_chain(ctx, cert_file, key_file)
    elif key_file is not None:
        raise PKIError(f"key-file {key_file}: given without a cert-file")
    return ctx


def server_context_for(
    creds: Credentials, *, on_handshake_error: HandshakeObserver | None = None
) -> ssl.SSLContext:
    """:func:`server_context` from a checked credential set."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    _load_chain_bytes(ctx, creds)
    _load_ca_bytes(ctx, creds)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    if on_handshake_error is not None:
        ctx.sslobject_class = _observed_sslobject(on_handshake_error)
    return ctx


def client_context_for(creds: Credentials, *, server_hostname_check: bool = True) -> ssl.SSLContext:
    """:func:`client_context` from a checked credential set."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    _load_ca_bytes(ctx, creds)
    _load_chain_bytes(ctx, creds)
    ctx.check_hostname = server_hostname_check
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    return ctx


def https_server_context_for(
    creds: Credentials, client_ca_file: PathLike | None = None
) -> ssl.SSLContext:
    """:func:`https_server_context` from a checked credential set (the front's client CA file
    is read from its path: it is not reloaded)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain_bytes(ctx, creds)
    if client_ca_file is not None:
        _load_ca(ctx, client_ca_file, "front-client-ca-file")
        ctx.verify_mode = ssl.CERT_OPTIONAL
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def egress_server_context_for(creds: Credentials, client_ca_file: PathLike) -> ssl.SSLContext:
    """The egress listener (``--egress-addr``): TLS ≥ 1.2 with the server certificate, and a
    client certificate verified against ``client_ca_file`` required (kube-apiserver's egress
    ``tlsConfig`` presents one); the CA file is read from its path, not reloaded."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain_bytes(ctx, creds)
    _load_ca(ctx, client_ca_file, "egress-client-ca-file")
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def follow_current(listening: ssl.SSLContext, current: Callable[[], ssl.SSLContext]) -> None:
    """Make every new handshake on ``listening`` use ``current()``: certificate, key and trust
    store. A listener (websockets' ``serve``, our fronts) holds one context for its lifetime;
    the server-name callback runs for every ClientHello, with or without SNI, before the
    certificate is chosen and the client's verified, and swaps the connection over to the
    context of the moment. Connections already up keep theirs. ``listening`` keeps what is
    per-listener: its handshake observer (``sslobject_class``), verify mode and flags."""

    def use_current(
        ssl_object: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _ctx: ssl.SSLContext
    ) -> None:
        ctx = current()
        if ssl_object.context is not ctx:
            ssl_object.context = ctx

    listening.sni_callback = use_current


def peer_node_name(ssl_object: ssl.SSLObject | ssl.SSLSocket) -> str:
    """The node name in the peer's verified client certificate — the agent's only identity."""
    try:
        cert = peer_cert(ssl_object)
    except ValueError as exc:  # SSLSocket before the handshake completed; undecodable
        raise PKIError(f"no peer certificate: {exc}") from exc
    if cert is None:
        raise PKIError("peer presented no certificate")
    return node_of(cert)


def peer_serial(ssl_object: ssl.SSLObject | ssl.SSLSocket) -> str:
    """The serial of the peer's certificate in hex (``-`` without one), for logs."""
    try:
        cert = peer_cert(ssl_object)
    except ValueError:
        return "-"
    return "-" if cert is None else cert.serial_hex


# --------------------------------------------------------------------------------------------


def _load_ca(ctx: ssl.SSLContext, ca_file: PathLike, field: str = "ca-file") -> None:
    load_certs(ca_file, field)
    try:
        ctx.load_verify_locations(cafile=str(ca_file))
    except (ssl.SSLError, OSError) as exc:
        raise PKIError(f"{field} {ca_file}: cannot be used as a trust anchor ({exc})") from exc


def _load_ca_bytes(ctx: ssl.SSLContext, creds: Credentials) -> None:
    ca_src = creds.sources[0]
    try:
        ctx.load_verify_locations(cadata=creds.ca_pem.decode("ascii", errors="replace"))
    except (ssl.SSLError, ValueError) as exc:
        raise PKIError(
            f"{ca_src.field} {ca_src.path}: cannot be used as a trust anchor ({exc})"
        ) from exc


def _load_chain_bytes(ctx: ssl.SSLContext, creds: Credentials) -> None:
    """Load the checked chain and key. :mod:`ssl` loads them from files only: they go through
    anonymous in-memory files (memfd), so the key never touches a disk and the context holds
    exactly the bytes that were checked."""
    _, cert_src, key_src = creds.sources
    with private_file(creds.chain_pem) as cert_path, private_file(creds.key_pem) as key_path:
        try:
            load_pair(ctx, cert_path, key_path)
        except (KeyPairError, OSError) as exc:
            raise PKIError(
                f"cert-file {cert_src.path} / key-file {key_src.path}: cannot be loaded ({exc})"
            ) from exc


def _load_chain(ctx: ssl.SSLContext, cert_file: PathLike, key_file: PathLike | None) -> None:
    load_certs(cert_file, "cert-file")
    # Without a key-file, ssl expects the key inside cert-file; errors name that file then.
    key_path = key_file if key_file is not None else cert_file
    flag = "key-file" if key_file is not None else "cert-file"
    read_file(key_path, flag)
    try:
        load_pair(ctx, str(cert_file), None if key_file is None else str(key_file))
    except KeyPairError as exc:
        if exc.mismatch:
            raise PKIError(
                f"cert-file {cert_file} / key-file {key_path}: the key does not match the "
                "certificate"
            ) from exc
        raise PKIError(f"{flag} {key_path}: {exc.reason}") from exc
    except OSError as exc:
        raise PKIError(f"{flag} {key_path}: cannot read: {exc.strerror or exc}") from exc
