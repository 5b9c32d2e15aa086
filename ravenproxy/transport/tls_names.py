"""What a TLS transport tells of its connection (``get_extra_info``): the peer's certificate,
the cipher, the addresses, read from the socket once, while it answers (a closed socket answers
none of them, nor an SSLSocket the TLS ones once its ``close_notify`` is sent)."""

from __future__ import annotations

import ssl
from typing import Any


def tls_names(sock: ssl.SSLSocket) -> dict[str, Any]:
    """``get_extra_info``'s answers for a handshaken ``sock``, by name (an address the socket
    cannot tell is None)."""
    names: dict[str, Any] = {
        "peercert": sock.getpeercert(),
        "cipher": sock.cipher(),
        "compression": sock.compression(),
    }
    for name, get in (("sockname", sock.getsockname), ("peername", sock.getpeername)):
        try:
            names[name] = get()
        except OSError:
            names[name] = None
    return names
