"""Run a system tool (iptables-restore, ipset, ip xfrm) once, optionally inside a netns.

The one place the route driver starts processes: a non-zero exit becomes an
:class:`~ravenproxy.l3.errors.ApplyError` carrying the command and what it printed.
"""

from __future__ import annotations

import asyncio
import logging
import shlex

from ravenproxy.l3.errors import ApplyError
from ravenproxy.log import kv

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 20.0


def in_netns(argv: list[str], netns: str | None) -> list[str]:
    return ["ip", "netns", "exec", netns, *argv] if netns else argv


async def run(
    argv: list[str],
    *,
    stdin: str | None = None,
    netns: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> str:
    """Run ``argv`` and return its stdout; raise ``ApplyError`` on failure or timeout."""
    full = in_netns(argv, netns)
    cmd = shlex.join(full)
    try:
        proc = await asyncio.create_subprocess_exec(
            *full,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        raise ApplyError(cmd, f"cannot start: {exc}") from None
    try:
        out, err = await asyncio.wait_for(
            proc.communicate(stdin.encode() if stdin is not None else None), timeout
        )
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise ApplyError(cmd, f"no answer within {timeout:g}s") from None
    if proc.returncode != 0:
        detail = err.decode(errors="replace").strip() or f"exit status {proc.returncode}"
        # The input is what failed to apply; keep it with the error for the log, not the user.
        log.debug("command failed", extra=kv(cmd=cmd, stdin=stdin or ""))
        raise ApplyError(cmd, detail)
    return out.decode(errors="replace")
