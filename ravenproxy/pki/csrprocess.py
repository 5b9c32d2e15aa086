"""A fresh key and CSR made in a short-lived child process (``python -m ravenproxy.pki.csr``),
so that ``cryptography`` never becomes resident in a long-running agent or server.

Importing it and making the first key costs ~12 MB of RSS that a process keeps for good
(modules are never unloaded): with it in-process, every ``--cert-dir`` agent would be back at
its old size after its first rotation (issue 15). The child costs ~0.2 s of CPU per request,
one request a day at the default lifetime. The key reaches the parent through a pipe, never a
file; the parent writes it (0600) once the certificate for it has been issued and checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from ravenproxy.children import failure, run_module
from ravenproxy.errors import ChildError, PKIError

TIMEOUT = 60.0
_CSR_BEGIN = b"-----BEGIN CERTIFICATE REQUEST-----"


class Request(NamedTuple):
    """A new key and the CSR for it, both PEM (what is written and what is sent)."""

    key_pem: bytes
    csr_pem: bytes


async def new_request(node: str, sans: Sequence[str] = (), timeout: float = TIMEOUT) -> Request:
    """:func:`ravenproxy.pki.csr.new_request` in a child process; PKIError for a bad node name
    or SAN (the child's message), or when the child cannot run or does not answer."""
    try:
        status, out, err = await run_module(
            "key generator", "ravenproxy.pki.csr", (node, *sans), timeout
        )
    except ChildError as exc:
        raise PKIError(str(exc)) from None
    if status != 0:
        raise PKIError(_failure(status, err))
    at = out.find(_CSR_BEGIN)
    if at <= 0 or b"PRIVATE KEY-----" not in out[:at]:
        raise PKIError("key generator: answer is not a key and a CSR")
    return Request(out[:at], out[at:])


def _failure(status: int, stderr: bytes) -> str:
    """One line: the child's own message for what it refuses (a bad node name or SAN, exit
    status 2); for a crash, the exit status and the exception (:func:`children.failure`)."""
    lines = stderr.decode(errors="replace").strip().splitlines()
    if status == 2 and lines:
        return lines[-1].strip()
    return failure("key generator", status, stderr)
