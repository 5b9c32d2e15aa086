"""Process lifecycle shared by every long-running command: the event loop, the signals that end
it, the descriptor limit, and the one rule for errors of parts started together.

A command starts its parts (listeners, watchers, loops) in one ``asyncio.TaskGroup``: when one
part fails, at start or later, the group cancels the others and waits for them, so a partial
start leaves nothing behind. :func:`parts` is that group with our errors kept whole: a part
failing with one of our typed errors (say ``--metrics-addr: cannot listen ...``) surfaces as that
error, which the CLI prints on one line, instead of an ``ExceptionGroup`` traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import socket
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from ravenproxy.config import Address
from ravenproxy.errors import ConfigError, RavenProxyError
from ravenproxy.transport import listener


def raise_fd_limit() -> None:
    """A proxy holds two sockets per stream: lift the soft descriptor limit to the hard one."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):  # pragma: no cover - best effort
        pass


def settled() -> None:
    """Start-up is over: what it made (imported modules, their functions and classes, the
    settings) lives as long as the process. Collected once, then left out of the cyclic
    collector's full collections (:func:`gc.freeze`): a full collection walks every tracked
    object, and a server's imports alone were ~80 000 of them with kubernetes_asyncio's models:
    40-230 ms on the 2-core test bed, a stall of every connection the process serves.
    Objects made later are collected as before; only cyclic garbage among the frozen ones is
    never freed.
    """
    gc.collect()
    gc.freeze()


def run_async(main: Coroutine[Any, Any, int], *, fast_loop: bool = True) -> int:
    """Run under uvloop when it is installed (it roughly doubles relay throughput).

    ``fast_loop=False`` keeps asyncio's own loop: uvloop cannot open netlink sockets, which
    pyroute2 needs for the L3 driver.
    """
    raise_fd_limit()
    if not fast_loop:
        return asyncio.run(main)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        result: int = runner.run(main)
        return result


async def until_signalled() -> None:
    """Wait for SIGINT or SIGTERM."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def serve_until_signalled(job: Coroutine[Any, Any, None]) -> int:
    """Run a serve-until-cancelled coroutine until SIGINT/SIGTERM (then cancel it and wait for
    it); its errors propagate, a group of our own errors as its first one (:func:`typed_error`).
    """
    async with parts() as tg:
        task = tg.create_task(job, name="main")
        stop = tg.create_task(until_signalled(), name="signals")
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        task.cancel()
        stop.cancel()
    return 0


def typed_error(exc: BaseException) -> RavenProxyError | None:
    """The error to report for ``exc``: itself when it is ours; for a group (nested or not)
    whose every failure is ours or a cancellation, the first of ours; else None (a bug, whose
    traceback is wanted)."""
    if isinstance(exc, RavenProxyError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        found: RavenProxyError | None = None
        for inner in exc.exceptions:
            if isinstance(inner, asyncio.CancelledError):
                continue
            typed = typed_error(inner)
            if typed is None:
                return None
            found = found or typed
        return found
    return None


@contextlib.asynccontextmanager
async def parts() -> AsyncIterator[asyncio.TaskGroup]:
    """An ``asyncio.TaskGroup`` for the parts of a component; when they fail only with our
    typed errors, the first one is raised alone (the CLI prints it on one line)."""
    try:
        async with asyncio.TaskGroup() as tg:
            yield tg
    except BaseExceptionGroup as group:
        typed = typed_error(group)
        if typed is None:
            raise
        raise typed from None


@contextlib.asynccontextmanager
async def listening(flag: str, where: object) -> AsyncIterator[None]:
    """Around the bind of the listener configured by ``flag``: an address that cannot be bound
    (taken, not local, no permission) is a :class:`ConfigError` naming the flag."""
    try:
        yield
    except OSError as exc:
        raise ConfigError(flag, f"cannot listen on {where}: {os_reason(exc)}") from None


def os_reason(exc: OSError) -> str:
    """The OS's words for ``exc`` (uvloop leaves ``strerror`` empty but sets ``errno``, which
    for a name that does not resolve is a negative ``EAI_*`` code, not an errno)."""
    if exc.strerror:
        return exc.strerror
    if isinstance(exc, socket.gaierror) or (exc.errno is not None and exc.errno < 0):
        return _RESOLVER.get(exc.errno or 0, f"cannot resolve the host ({exc})")
    return os.strerror(exc.errno) if exc.errno else str(exc)


_RESOLVER = {
    socket.EAI_NONAME: "Name or service not known",
    socket.EAI_AGAIN: "Temporary failure in name resolution",
    socket.EAI_FAIL: "Non-recoverable failure in name resolution",
    getattr(socket, "EAI_NODATA", -5): "No address associated with hostname",
}


def check_listen(flag: str, addr: Address, *, udp: bool = False) -> None:
    """Before anything starts, the address of ``flag`` resolves and can be bound (each address
    it resolves to, as the listeners bind them: :func:`~ravenproxy.transport.listener.bind_each`);
    else a :class:`ConfigError` naming the flag. The real bind still names the flag when another
    program takes the port in between."""
    kind = socket.SOCK_DGRAM if udp else socket.SOCK_STREAM
    what = f"cannot bind UDP {addr}" if udp else f"cannot listen on {addr}"
    try:
        infos = socket.getaddrinfo(addr.bind_host, addr.port, type=kind, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise ConfigError(flag, f"{what}: {os_reason(exc)}") from None
    if addr.port == 0:
        return
    try:
        sockets = listener.bind_each(infos)
    except OSError as exc:
        raise ConfigError(flag, f"{what}: {os_reason(exc)}") from None
    for sock in sockets:
        sock.close()
