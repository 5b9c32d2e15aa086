"""A fresh key and CSR made in a short-lived child process (``python -m ravenproxy.pki.csr``),
so that ``cryptography`` never becomes resident in a long-running agent or server.

Importing it and making the first key costs ~12 MB of RSS that a process keeps for good
(modules are never unloaded): with it in-process, every ``--cert-dir`` agent would be back at
its old size after its first rotation (issue 15). The child costs ~0.2 s of CPU per request,
one request a day at the default lifetime. The key reaches the parent through a pipe, never a
file; the parent writes it (0600) once the certificate for it has been issued and checked.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from typing import NamedTuple

from ravenproxy.errors import PKIError
from ravenproxy.log import kv

log = logging.getLogger(__name__)

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
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-P",  # the working directory is not on the child's path: see _child_env
            "-m",
            "ravenproxy.pki.csr",
            node,
            *sans,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=_child_env(),
        )
    except OSError as exc:
        raise PKIError(f"cannot start the key generator: {exc.strerror or exc}") from None
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        raise PKIError(f"key generator: no answer within {timeout:g}s") from None
    finally:
        if proc.returncode is None:  # cancelled or timed out: the child goes too
            proc.kill()
            await proc.wait()
    status = proc.returncode
    if status != 0:
        raise PKIError(_failure(status if status is not None else -1, err.decode(errors="replace")))
    at = out.find(_CSR_BEGIN)
    if at <= 0 or b"PRIVATE KEY-----" not in out[:at]:
        raise PKIError("key generator: answer is not a key and a CSR")
    return Request(out[:at], out[at:])


def _failure(status: int, stderr: str) -> str:
    """One line: the child's own message for what it refuses (a bad node name or SAN, exit
    status 2); for a crash, the exit status and the exception — the traceback's last line (the
    whole of it is logged at debug level)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if status == 2 and lines:
        return lines[-1]
    if len(lines) > 1:
        log.debug("key generator crashed", extra=kv(status=status, stderr=stderr))
    detail = f": {lines[-1]}" if lines else ""
    return f"key generator failed (exit status {status}){detail}"


def _child_env() -> dict[str, str]:
    """The child's environment: ours, with this ``ravenproxy``'s directory first on its path.
    ``python -m`` would put the working directory first: whatever ``cryptography`` or
    ``ravenproxy`` lay there would make the key (or another version of ours would run)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, path] if path else [root])}
