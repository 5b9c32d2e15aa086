"""The socket's part of the TLS transport's close (:mod:`.tls_socket`): our ``close_notify``
and FIN, then what the peer still sends read and dropped until its FIN. The transport decides
when (everything queued written first, within its timeout) and what readiness each step waits
for; these say how a step went."""

from __future__ import annotations

import enum
import socket
import ssl

_DROP = bytearray(16 * 1024)  # where the bytes read after our close_notify go (a record's worth)


class Shutdown(enum.Enum):
    """How :func:`shut_down` went."""

    SENT = "sent"
    """The ``close_notify`` (unless the session ended in error) and the FIN are sent."""
    WANT_WRITE = "want-write"
    """The ``close_notify`` waits for write readiness: call again then."""
    FAILED = "failed"
    """The socket cannot be shut down cleanly: close it."""


def shut_down(sock: ssl.SSLSocket, ragged: bool) -> Shutdown:
    """Send our ``close_notify``, then a FIN. ``ragged``: the peer's FIN came without its
    ``close_notify``; OpenSSL's session ended in error and sends nothing more: only the FIN."""
    try:
        if ragged:
            raise ssl.SSLWantReadError
        sock.unwrap()
    except ssl.SSLWantWriteError:
        return Shutdown.WANT_WRITE
    except ssl.SSLWantReadError:
        pass  # sent; OpenSSL would wait for the peer's close_notify here: we do not
    except ssl.SSLError as exc:
        # unwrap() is SSL_shutdown twice: the first sends our close_notify, the second reads
        # for the peer's. Finding the peer's data instead (it is still sending) is this error,
        # ours sent: as above. Closing now instead would close a socket with unread input,
        # whose RST drops what we wrote before the close and the peer has not yet read.
        if getattr(exc, "reason", None) != "APPLICATION_DATA_AFTER_CLOSE_NOTIFY":
            return Shutdown.FAILED
    except (OSError, ValueError):
        return Shutdown.FAILED
    try:
        socket.socket.shutdown(sock, socket.SHUT_WR)
    except OSError:
        return Shutdown.FAILED
    return Shutdown.SENT


def drained_to_fin(sock: ssl.SSLSocket) -> bool:
    """Read and drop what arrived after our ``close_notify`` (the socket, not TLS: OpenSSL's
    session is over). True once the peer's FIN (or an error) ends the connection."""
    try:
        n = socket.socket.recv_into(sock, _DROP)
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True
    return not n
