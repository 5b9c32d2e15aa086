"""Short-lived children of ours (``python -m ravenproxy...``), so that a library used for a
moment never becomes resident in a long-running process (issue 15: modules are never unloaded,
and the memory of their import stays with the process): the key and CSR
(``cryptography``, :mod:`ravenproxy.pki.csrprocess`) and an inventory's YAML (PyYAML,
:mod:`ravenproxy.model.inventory`).

A child is owned by the coroutine that runs it: it is killed and reaped when its time is up or
when that coroutine is cancelled (a shutdown). It also ends with its parent (Linux's
``PR_SET_PDEATHSIG``): a parent killed before it could cancel anything (a SIGTERM before its
handlers are installed, a SIGKILL, the OOM killer) does not leave it running. It is started as
``python -P -m ravenproxy.children PARENT_PID MODULE ARGS`` (:func:`main`), which asks for that
signal and then runs ``MODULE`` as ``python -m`` would.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

from ravenproxy.errors import ChildError
from ravenproxy.log import kv

log = logging.getLogger(__name__)


async def run_module(
    what: str, module: str, args: Sequence[str], timeout: float, stdin: bytes | None = None
) -> tuple[int, bytes, bytes]:
    """Exit status, stdout and stderr of ``python -P -m MODULE ARGS`` (given ``stdin``, else
    none), ending with us (:func:`main`). :class:`ChildError` naming it ``what`` when it cannot
    start or has not ended within ``timeout`` seconds."""
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-P",  # the working directory is not on the child's path: see _child_env
            "-m",
            __name__,
            str(os.getpid()),
            module,
            *args,
            stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=_child_env(),
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
        finally:
            if proc.returncode is None:  # cancelled or timed out: the child goes too
                proc.kill()
                await proc.wait()
    except TimeoutError:  # an OSError too: first
        raise ChildError(f"{what}: no answer within {timeout:g}s") from None
    except OSError as exc:
        raise ChildError(f"cannot start the {what}: {exc.strerror or exc}") from None
    status = proc.returncode
    return (status if status is not None else -1), out, err


def failure(what: str, status: int, stderr: bytes) -> str:
    """One line for a child that failed: ``WHAT failed (exit status N): LAST LINE``, the last
    line of its stderr being the exception of a crash (the whole of it is logged at debug
    level), never the traceback."""
    text = stderr.decode(errors="replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > 1:
        log.debug(f"{what} crashed", extra=kv(status=status, stderr=text))
    detail = f": {lines[-1]}" if lines else ""
    return f"{what} failed (exit status {status}){detail}"


def _child_env() -> dict[str, str]:
    """The child's environment: ours, with this ``ravenproxy``'s directory first on its path.
    ``python -m`` would put the working directory first: whatever ``cryptography``, ``yaml`` or
    ``ravenproxy`` lay there would run (or another version of ours)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, path] if path else [root])}


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def main(argv: Sequence[str]) -> None:
    """The child's side of :func:`run_module`: ``PARENT_PID MODULE ARGS``. Asks to be killed
    when the parent ends, checks that the parent is still ``PARENT_PID`` (it may have died
    before the request: then no signal would come), and runs ``MODULE`` as ``python -m``."""
    parent, module, *args = argv
    if sys.platform.startswith("linux"):
        import ctypes  # here, in the child only

        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != int(parent):
        sys.exit(f"{module}: the parent process {parent} has ended")
    import runpy  # the child's alone (a parent imports this module for run_module)

    sys.argv[1:] = args
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
